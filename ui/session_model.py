"""The model this session chose: its source and weights variant, and the shared store entry that
holds it (ui/shared.py MODELS; read through the module, so a test can swap the store)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import streamlit as st

from engine import LoadedModel
from engine.models import ModelEntry
from i18n import _
from ui import shared


@dataclass(frozen=True, slots=True)
class SessionModel:
    """The model this session chose (source and weights variant) and its shared entry."""

    source: str
    weights: str
    entry: ModelEntry

    @property
    def lm(self) -> LoadedModel:
        return self.entry.lm

    @property
    def dtype(self) -> str:
        return self.entry.lm.spec.dtype

    def reference(self) -> ModelEntry:
        """This model's float32 entry: what comparisons of kernels, dtypes and weight variants
        measure from, whichever weights this session decodes with (loaded again if it was
        evicted: call inside the model turn)."""
        return self.entry if self.weights == "fp32" else shared.MODELS.get(self.source, "fp32")

    def reference_native_decoder(self) -> Any:
        """The native decoder of the float32 weights (this session's own when it chose fp32)."""
        return self.native_decoder() if self.weights == "fp32" else self.reference().native()

    def compiled_decoder(self) -> Any:
        """The float32 model's torch.compile decoder, shared by every session of this model (the
        kernel comparison keeps the weights fixed at float32)."""
        from engine.kernels.compiled import CompiledDecoder
        return shared.MODELS.compiled((self.source, "fp32"), CompiledDecoder)

    def native_decoder(self) -> Any:
        """The native C decoder for these weights, shared by every session that chose them
        (built on first use: call it inside the model turn); raises EngineError saying why it
        cannot run."""
        return self.entry.native()

    def native_problem(self) -> str | None:
        """Why the native step cannot run these weights, without building it (the sidebar)."""
        return self.entry.native_problem()

    def run_options(self) -> dict[str, Any]:
        """What a live `Run` needs beyond the model: the shared native decoder for these weights
        (a builder, called once the run holds the model turn, with a spinner the first time),
        and the weights' name for its trace."""

        def native() -> Any:
            if "native" in self.entry.extras:
                return self.native_decoder()
            with st.spinner(_("Preparing the native decode step for the {weights} weights "
                              "(packing them; the first time on this machine also compiling the "
                              "C step: a few seconds)…").format(weights=self.weights)):
                return self.native_decoder()

        return {"native": native, "weights": self.weights}
