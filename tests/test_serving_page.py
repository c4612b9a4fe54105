"""The Serving page through AppTest on the real default model: a small stream run for real, kept,
drawn, downloadable, opened again without a model; the comparisons; the KV page's block tables."""

from __future__ import annotations

import json

import pytest

from engine.serving.metrics import peak_step
from engine.serving.record import ServingRun
from engine.serving.servingfile import load_serving, serving_to_bytes
from ui.state import state_of

from .test_app import fresh

pytestmark = pytest.mark.real_model  # the app loads the default model


def _figures(at) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def _titles(at) -> list[str]:
    return [f["layout"].get("title", {}).get("text", "") for f in _figures(at)]


def _page(monkeypatch=None, hosted=False):
    at = fresh(monkeypatch, hosted=hosted).run()
    at.switch_page("pages/serving.py").run()
    assert not at.exception
    return at


def _submit(at, prompts: str, lengths: str, count: int, **widgets):
    at.text_area(key="serving_prompts").set_value(prompts)
    at.text_area(key="serving_prefix").set_value(widgets.pop("prefix", ""))
    at.text_input(key="serving_lengths").set_value(lengths)
    at.number_input(key="serving_count").set_value(count)
    for key, value in widgets.items():
        at.session_state[key] = value
    next(b for b in at.button if b.label == "Run the stream").click()
    return at.run(timeout=600)


def test_the_form_starts_from_a_sample_and_says_its_caps(monkeypatch):
    at = _page(monkeypatch)
    assert at.selectbox(key="serving_stream").value == "Mixed output lengths"
    assert at.text_area(key="serving_prompts").value.startswith("What is the capital of France?")
    assert at.text_input(key="serving_lengths").value.startswith("8, 64")
    caption = " ".join(c.value for c in at.caption)
    assert "at most 32 requests" in caption and "8,192 token slots" in caption
    assert any("Run a stream above" in i.value for i in at.info)
    assert at.radio(key="serving_arrival").value == "all at once"
    assert at.number_input(key="serving_rate").disabled  # no rate applies to arrivals at 0 ms
    at.radio(key="serving_arrival").set_value("Poisson").run()
    assert not at.number_input(key="serving_rate").disabled
    at.selectbox(key="serving_stream").set_value("Same system prompt").run()
    assert "Riverside Public Library" in at.text_area(key="serving_prefix").value
    hosted = _page(monkeypatch, hosted=True)
    assert hosted.number_input(key="serving_count").max == 8
    assert "at most 8 requests" in " ".join(c.value for c in hosted.caption)
    # hosted, the first click's stream is the lightest sample: it finishes within the budget
    assert hosted.selectbox(key="serving_stream").value == "Short questions"
    assert hosted.text_input(key="serving_lengths").value == "16, 16, 16, 16"


def test_bad_input_is_one_sentence():
    at = _submit(_page(), "Hi", "0, 4", 2)
    assert not at.exception
    assert at.error[0].value == ("Max new tokens must be whole numbers from 1 to 256, separated "
                                 "by commas.")
    at = _submit(at, "Hi", "x", 2)
    assert "whole numbers" in at.error[0].value
    at = _submit(at, "", "4", 1)
    assert at.error[0].value == "Write at least one prompt (one per line)."
    at = _submit(at, "Hi", "4", 1, serving_pool=8000, serving_block=16)
    assert "at most 8,192 token slots" in at.error[0].value


def test_a_stream_runs_is_drawn_kept_and_its_file_round_trips():
    at = _submit(_page(), "What is the capital of Italy?\nName a yellow fruit.", "6, 3", 3,
                 serving_batch=2)
    assert not at.exception
    run = state_of(at.session_state).serving.run
    assert isinstance(run, ServingRun) and len(run.requests) == 3
    assert [len(r.token_ids) <= n for r, n in zip(run.requests, (6, 3, 6))] == [True] * 3
    assert all(r.finish in ("eos", "length") for r in run.requests)
    assert max(s.batch_size for s in run.steps) == 2  # max batch 2: the third request waited
    assert run.requests[2].queue_ms > 0
    assert any("1 request(s) waited in the queue" in c.value and "never dropped" in c.value
               for c in at.caption)
    titles = _titles(at)
    assert "Every request over time" in titles and "Tokens per second and batch size" in titles
    peak = peak_step(run)
    assert any(t.startswith(f"Block pool after step {peak} ") for t in titles)  # the busiest
    assert run.steps[peak].tables and not run.steps[-1].tables  # the last: every block free
    assert [m.label for m in at.metric] == ["Throughput", "TTFT p50", "ITL p50", "Steps",
                                            "Peak blocks"]
    table = next(d.value for d in at.dataframe if "block table (logical → physical)" in d.value.columns)
    assert table["request"].tolist() == [row.request for row in run.steps[peak].tables]
    # the step slider shows an earlier step's pool
    at.slider(key="serving_step").set_value(0).run()
    assert any(t.startswith("Block pool after step 0 ") for t in _titles(at))

    # the KV page's paged blocks are now this run's real tables
    at.switch_page("pages/kvcache.py").run()
    assert not at.exception
    text = " ".join(m.value for m in at.markdown)
    assert "**Recorded**" in text and "your stream" in text
    kv = next(f for f in _figures(at) if "recorded after step" in
              f["layout"]["xaxis"]["title"]["text"])
    first = run.steps[peak].tables[0]
    bars = next(d for d in kv["data"] if d["name"] == f"request {first.request}")
    assert list(bars["x"]) == sorted(first.blocks)

    # the download round-trips (opening it on the page is left to the browser: AppTest has no uploader)
    data = serving_to_bytes(run)
    assert load_serving(data).requests[0].token_ids == run.requests[0].token_ids


def test_the_kv_page_without_a_serving_run_says_its_picture_is_computed():
    at = fresh().run()
    at.switch_page("pages/kvcache.py").run()
    assert not at.exception
    assert any("Computed, not recorded" in i.value for i in at.info)
    assert any("not recorded" in c.value for c in at.caption)


def test_static_vs_continuous_and_prefix_sharing_are_measured_and_kept(monkeypatch):
    import ui.sections.serving as sections

    at = _submit(_page(), "Say hi.\nCount to three.\nName a colour.\nSay bye.", "2, 12, 2, 12", 4,
                 serving_batch=2)
    next(b for b in at.button if b.label == "Run this stream both ways").click()
    at.run(timeout=600)
    assert not at.exception
    static, continuous = state_of(at.session_state).serving.batching
    assert (static.config.scheduler, continuous.config.scheduler) == ("static", "continuous")
    assert [r.token_ids for r in static.requests] == [r.token_ids for r in continuous.requests]
    assert "Static vs continuous batching, same stream" in _titles(at)
    why = next(d.value for d in at.dataframe if "median step (ms)" in d.value.columns)
    assert why["batch size"].tolist()[0] >= 1

    # a shorter shared-prefix stream keeps the test quick; the page's sample is longer
    stream = dict(sections.STREAMS[sections.SHARED_STREAM])
    stream["requests"] = [{**r, "max_new_tokens": 2} for r in stream["requests"][:3]]
    monkeypatch.setitem(sections.STREAMS, sections.SHARED_STREAM, stream)
    next(b for b in at.button if b.label == "Run it with and without sharing").click()
    at.run(timeout=600)
    assert not at.exception
    off, on = state_of(at.session_state).serving.sharing
    assert not off.config.prefix_sharing and on.config.prefix_sharing
    assert sum(r.cached_tokens for r in on.requests) > 0 == sum(r.cached_tokens for r in off.requests)
    assert [r.token_ids for r in off.requests] == [r.token_ids for r in on.requests]
    peak = {name: max(s.blocks_used for s in run.steps) for name, run in (("off", off), ("on", on))}
    assert peak["on"] < peak["off"]
    assert any(f"**{peak['on']} blocks** at the peak" in m.value for m in at.markdown)


def test_speculation_highlights_the_drafted_tokens(monkeypatch):
    import ui.sections.serving as sections

    monkeypatch.setattr(sections, "SPECULATION", [{**s, "max_new_tokens": 24}
                                                  for s in sections.SPECULATION])
    at = _page()
    next(b for b in at.button if b.label == "Measure it on two samples").click()
    at.run(timeout=600)
    assert not at.exception
    found = state_of(at.session_state).serving.speculation
    assert [title for title, _, _ in found] == ["Rewrite (pays)", "Free writing (does not pay)"]
    title, pieces, cmp = found[0]
    assert cmp.equal and len(pieces) == len(cmp.result.token_ids)
    chips = next(m.value for m in at.markdown if "ie-chips" in m.value)
    assert chips.count("ie-drafted") == sum(cmp.result.drafted) > 0
    assert "Speculative decoding vs plain greedy, measured" in _titles(at)
