"""Compare two runs side by side (placeholder)."""

import streamlit as st

st.title("Compare runs")
st.info("Coming in this change.")
