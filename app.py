"""Inference Explorer — Streamlit entry point (router and frame)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import streamlit as st  # noqa: E402

st.set_page_config(page_title="Inference Explorer", page_icon="🔎", layout="wide")
st.navigation([st.Page("pages/generate.py", title="Generate", icon="▶️", default=True)]).run()
