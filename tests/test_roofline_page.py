"""The Prefill vs decode page: the work table's phase column fits its labels, the caption says
which step time placed the points, and the dtype comparison shows a measured side-by-side."""

from __future__ import annotations

import json

import pytest

import ui.sections.timing_kernels as timing_kernels
from tests.test_app import fresh, generate
from ui.state import state_of

pytestmark = pytest.mark.real_model  # the app runs the default model


def test_phase_column_fits_and_dtypes_are_measured(monkeypatch):
    monkeypatch.setattr(timing_kernels, "DTYPE_TOKENS", 3)  # keep the test short (before the
    monkeypatch.setattr(timing_kernels, "DTYPE_PROMPT", 6)  # page draws: the button's help says it)
    at = generate(fresh(monkeypatch).run(), "Name a colour.", tokens=3)
    at.switch_page("pages/timing.py").run()
    assert not at.exception
    table = at.dataframe[0]
    columns = json.loads(table.proto.columns)
    longest = max(len(p) for p in [*table.value["phase"], "decode, eager (static cache)"])
    assert columns["phase"]["width"] >= 8 * longest  # ~8 px a character: never cut
    assert any("placed by their model forward alone" in c.value for c in at.caption)

    button = next(b for b in at.button if b.label.startswith("Compare float32, float16"))
    button.click().run()
    assert not at.exception and not at.error
    result = at.dataframe[-1].value  # no kernel comparison ran: the dtype table is last
    assert list(result["weights"]) == ["float32", "float16", "bfloat16"]
    first = result.iloc[0]
    assert first["time ÷ float32's"] == 1.0 and first["greedy tokens = float32's"] == "yes"
    assert (result["ms per token (median)"] > 0).all()
    assert any("decoded fastest" in m.value for m in at.markdown)
    kept = state_of(at.session_state).experiments.dtype_comparison  # kept: a reload and a download
    assert [r.dtype for r in kept.runs] == ["float32", "float16", "bfloat16"]  # carry it
