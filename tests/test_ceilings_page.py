"""Prefill vs decode reads this machine's ceilings from its cache file: a new session measures
nothing when they are stored, and measures only on "Measure again" (or when none are stored)."""

from __future__ import annotations

import pytest

from engine.kernels import microbench
from tests.test_app import fresh, generate

pytestmark = pytest.mark.real_model  # the app runs with the default model


@pytest.fixture
def measured(tmp_path, monkeypatch):
    """A fresh cache folder, and every measurement counted (a fixed result, no 6 s wait)."""
    monkeypatch.setenv("INFERENCE_EXPLORER_CACHE", str(tmp_path / "models"))
    calls = []

    def fake_measure(device, megabytes=1024, repeats=8, spread_s=1.5):
        calls.append(("bandwidth", str(device)))
        return 20.0

    def fake_matmul(device, dtype, n=1024, repeats=5):
        calls.append(("matmul", str(dtype)))
        return 0.5

    monkeypatch.setattr(microbench, "measure_bandwidth", fake_measure)
    monkeypatch.setattr(microbench, "measure_matmul", fake_matmul)
    return calls


def timing_page(prompt: str = "Hi."):
    at = generate(fresh().run(), prompt, tokens=2)
    at.switch_page("pages/timing.py").run()
    assert not at.exception
    return at


def buttons(at) -> list[str]:
    return [b.label for b in at.button]


def test_stored_ceilings_are_read_not_measured(measured):
    microbench.ceilings("cpu", "float32")  # stored by an earlier session on this machine
    measured.clear()
    at = timing_page()
    assert measured == []  # nothing measured for this session
    assert "Measure again" in buttons(at)
    assert "Measure this machine's ceilings" not in buttons(at)
    table = at.dataframe[0].value
    assert "MBU" in table.columns and (table["MBU"] > 0).all()
    assert any("stored for this machine" in c.value for c in at.caption)
    next(b for b in at.button if b.label == "Measure again").click().run()
    assert not at.exception
    assert ("bandwidth", "cpu") in measured  # measured again when asked


def test_without_stored_ceilings_the_button_measures_and_stores_them(measured):
    at = timing_page()
    assert measured == [] and "Measure this machine's ceilings" in buttons(at)
    assert "MBU" not in at.dataframe[0].value.columns
    next(b for b in at.button if b.label == "Measure this machine's ceilings").click().run()
    assert not at.exception and len(measured) == 2
    assert microbench.cached_ceilings("cpu", "float32").bandwidth_gb_s == 20.0
    assert "MBU" in at.dataframe[0].value.columns
    assert "Measure again" in buttons(at.run()) and len(measured) == 2  # read, not measured
