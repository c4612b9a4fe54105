"""Quantization's "This file's tensors": the tensor table of a model opened from a GGUF file.

Why on this page: the torch model holds float32 copies, so only the file's table
(`LoadedModel.gguf_tensors`, engine/gguf/table.py) still says how each tensor is stored — which
is what "What is quantized" asks of a model that arrived already quantized, tensor by tensor
(a Q4_K_M file mixes Q4_K, Q6_K, Q5_0 and Q8_0 in one layer).
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from engine import LoadedModel
from engine.lens.wording import size
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
    st.caption(_("As the file stores them (GGUF's own table; `python -m engine gguf-info FILE` "
                 "prints it). The app's torch model holds these tensors dequantized to float32; "
                 "with the weights as loaded, the native decode step multiplies by the file's "
                 "blocks themselves."))
