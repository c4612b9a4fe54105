"""Inference, step by step: a guided story on the session's own trace (placeholder)."""

import streamlit as st

st.title("Inference, step by step")
st.info("Coming in this change.")
