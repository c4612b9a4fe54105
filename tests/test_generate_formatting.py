"""Metric values short enough for their column (Streamlit cuts wider ones with "…"): the shared
formatter, and the Generate page's metrics through it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from charts.formatting import MAX_CHARS, batch_note, count, duration, rate, significant, size
from engine import GenerationSettings, Run
from ui.state import state_of

from .test_app import fresh

MAGNITUDES = [m * 10.0**e for e in range(-3, 13) for m in (1.0, 1.2064, 4.9996, 9.9996)]


@pytest.mark.parametrize("value, text", [
    (0.0734, "0.07 ms"), (8.523, "8.52 ms"), (85.31, "85.3 ms"), (853.2, "853 ms"),
    (999.7, "1 s"), (1206.44, "1.21 s"), (59_949, "59.9 s"), (61_000, "1.02 min"),
    (9_000_000, "2.5 h"), (None, "–")])
def test_duration(value, text):
    assert duration(value) == text


@pytest.mark.parametrize("value, text", [
    (0.734, "0.73 tok/s"), (21.26, "21.3 tok/s"), (999.6, "1k tok/s"), (1206.4, "1.21k tok/s"),
    (None, "–")])
def test_rate(value, text):
    assert rate(value) == text


@pytest.mark.parametrize("value, text", [
    (0, "0 B"), (512, "512 B"), (1023.6, "1 KiB"), (46_080, "45 KiB"), (4_147_200, "3.96 MiB"),
    (3.125 * 2**30, "3.12 GiB"), (None, "–")])
def test_size(value, text):
    assert size(value) == text


def test_count_and_significant():
    assert [count(n) for n in (948, 1206, 99_999, 123_456, 1.5e9)] == [
        "948", "1,206", "99,999", "123k", "1.5G"]
    assert [significant(x) for x in (21.26, 0.734, 1206.4, 100.0)] == ["21.3", "0.73", "1206", "100"]


def test_every_magnitude_fits():
    for x in MAGNITUDES:
        assert len(duration(x)) <= MAX_CHARS or x >= 1000 * 3_600_000, x
        assert len(size(x)) <= MAX_CHARS, x
        assert len(rate(x)) <= 6 + len(" tok/s"), x
        assert len(count(x)) <= 6, x


def test_generate_page_metrics_are_short(lm):
    """Slow steps and a 4,050 KiB cache: before, '1206 ms' and '4,050 KiB' (cut at 1440 px)."""
    trace = Run(lm, "Hi", GenerationSettings(max_new_tokens=3, chat_template=False)).run_all()
    steps = tuple(replace(s, latency_ms=1206.44, kv_bytes=4_147_200) for s in trace.steps)
    trace = replace(trace, steps=steps, tokenize_ms=0.0)
    at = fresh().run()
    state_of(at.session_state).run.trace = trace
    at.run()
    assert not at.exception
    values = {m.label: m.value for m in at.metric}
    assert values == {"TTFT": "1.21 s", "Last ITL": "1.21 s", "Mean ITL": "1.21 s",
                      "Decode rate": "0.83 tok/s", "KV cache": "3.96 MiB"}
    kv = next(m for m in at.metric if m.label == "KV cache")
    assert "4,147,200 B" in kv.help  # the exact measured bytes, in the help
    assert np.isclose(1000 / 1206.44, 0.83, atol=0.005)


def test_every_stop_reason_reads_as_words_in_each_language():
    """The trace's "eos" / "length" were shown raw on Steps, Compare runs and the handout."""
    from charts.formatting import stop_reason
    from engine.records.trace import STOP_REASONS
    from i18n import using

    for lang in ("en", "zh-Hant", "zh-Hans"):
        with using(lang):
            words = [stop_reason(r) for r in STOP_REASONS]
        assert all(w != r for w, r in zip(words, STOP_REASONS)), (lang, words)
        assert len(set(words)) == len(STOP_REASONS)
    with using("zh-Hant"):
        assert stop_reason("eos") == "模型結束了它的回答"


def test_the_batch_note_counts_the_shared_steps_and_their_sizes():
    assert batch_note([1, 1, 1]) == ""  # every step alone: nothing to say
    assert batch_note([7, 7, 1, 9]).startswith(
        "Decoded in batches of 7 to 9 runs (median 7) for 3 of its 4 decode steps:")
    assert batch_note([3, 3]).startswith("Decoded in a batch of 3 for all 2 of its decode steps:")
    # the last steps after another run ended held fewer runs: said, not hidden by the median
    assert batch_note([3] * 45 + [2, 2]).startswith(
        "Decoded in batches of 2 to 3 runs (median 3) for all 47 of its decode steps:")
    assert batch_note([1, 1], prefill=7) == (
        "Its prompt went through the model in one forward pass shared with 6 other runs (each "
        "adding its own prompt or its next token).")
    assert batch_note([3], prefill=2).startswith(
        "Its prompt went through the model in one forward pass shared with 1 other run (adding "
        "its own prompt or its next token). Decoded in a batch of 3 for all 1 of its decode "
        "steps:")
