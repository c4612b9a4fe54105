"""Quantization's "This file's tensors": the tensor table of a model opened from a GGUF file.

Why on this page: the file's table (`LoadedModel.gguf_tensors`, engine/gguf/table.py) says how
each tensor is stored — which is what "What is quantized" asks of a model that arrived already
quantized, tensor by tensor (a Q4_K_M file mixes Q4_K, Q6_K, Q5_0 and Q8_0 in one layer). On the
CPU the model runs on these blocks as stored (memory-mapped); on a GPU it holds them dequantized.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from engine import LoadedModel
from engine.lens.wording import size
from engine.loader import is_mapped_model
from i18n import _
from ui.tables import show_table
from ui.text import plain


def file_tensors(lm: LoadedModel | None) -> None:
    """The section, when the loaded model came from a GGUF file (nothing otherwise)."""
    table = lm.gguf_tensors if lm is not None else None
    if table is None:
        return
    st.markdown("#### " + _("This file's tensors"))
    types = ", ".join(f"{name} ×{count}" for name, count in table.type_counts().items())
    st.markdown(_("**{file}** stores {tensors} tensors, {weights} weights in {nbytes} bytes "
                  "({size}, {bits} bits per weight): {types}.").format(
        file=plain(table.path.rsplit("/", 1)[-1]), tensors=len(table.tensors),
        weights=f"{table.n_elements:,}", nbytes=f"{table.tensor_bytes:,}",
        size=size(table.tensor_bytes), bits=f"{table.bits_per_weight:.2f}", types=types))
    rows = [{_("name"): t.name, _("GGML type"): t.ggml_type,
             _("shape (rows × cols)"): " × ".join(str(d) for d in t.shape), _("bytes"): t.nbytes,
             _("bits per weight"): t.bits_per_weight} for t in table.tensors]
    number = st.column_config.NumberColumn
    show_table(pd.DataFrame(rows), hide_index=True, width="stretch", column_config={
        _("bytes"): number(format="localized"), _("bits per weight"): number(format="%.3f")})
    if is_mapped_model(lm.model):
        st.caption(_("As the file stores them (GGUF's own table; `python -m engine gguf-info FILE` "
                     "prints it). The file is memory-mapped and every matrix stays in these "
                     "blocks: the prefill, the pages' own forwards and the native decode step all "
                     "multiply by them; only the norms (and biases) are held as float32."))
    else:
        st.caption(_("As the file stores them (GGUF's own table; `python -m engine gguf-info FILE` "
                     "prints it). On a GPU the app's model holds these tensors dequantized; the "
                     "stored blocks run on the CPU."))
