"""The Serving engine page through AppTest: with no server it says so in one sentence and keeps
working; hosted, it offers no load at all; a saved load replays without a server; and (marked
`vllm`) a small load against the real vLLM server runs, is drawn, kept, and compared with this
app's engine."""

from __future__ import annotations

import json
import os
import socket
import time

import pytest

from engine.remote.loadfile import load_loadtest, load_to_bytes
from engine.remote.record import LoadRun
from ui.results import RemoteResults
from ui.shared import SESSIONS
from ui.state import state_of

from .test_app import fresh
from .test_charts_remote import make_run

pytestmark = pytest.mark.real_model  # the app loads the default model
PAGE = "pages/serving_engine.py"


def _titles(at) -> list[str]:
    return [json.loads(c.proto.spec)["layout"].get("title", {}).get("text", "")
            for c in at.get("plotly_chart")]


def _unused_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"  # closed again: nothing answers there


def _page(monkeypatch, hosted=False, url: str | None = None, remote: RemoteResults | None = None,
          replay: bool = False):
    at = fresh(monkeypatch, hosted=hosted).run()
    if url is not None:
        at.session_state["remote_url"] = url
    state = state_of(at.session_state)
    if remote is not None:
        state.remote = remote
    if replay:
        state.page.replays.add("load")
    at.switch_page(PAGE).run()
    assert not at.exception
    return at


def _run_button(at, label: str):
    return next(b for b in at.button if b.label == label)


def test_no_server_is_one_clear_message_and_the_page_keeps_working(monkeypatch):
    url = _unused_url()
    at = _page(monkeypatch, url=url)
    assert len(at.error) == 1  # one sentence, no traceback
    text = at.error[0].value
    assert text.startswith("No usable server: cannot reach") and "nothing answers there" in text
    assert "Start local vLLM" not in [b.label for b in at.button]  # only for the default URL
    assert any("Timing and the engine's own counters only" in i.value for i in at.info)
    assert any("No load yet" in i.value for i in at.info)
    caption = " ".join(c.value for c in at.caption)
    assert "64 requests" in caption and "256 new tokens" in caption
    _run_button(at, "Run the load").click()
    at.run()
    assert not at.exception
    assert any("No server answers at that URL" in e.value for e in at.error)
    state = state_of(at.session_state)  # nothing was sent, nothing kept
    assert state.remote.run is None and "serving_engine" not in (SESSIONS.copy(state.token) or {})


def test_at_the_default_address_it_offers_to_start_vllm_or_says_how_to_install_it(monkeypatch):
    import ui.sections.serving_engine as sections
    from engine import EngineError

    url = _unused_url()  # stands in for the default address, where nothing answers here
    monkeypatch.setattr(sections, "DEFAULT_URL", url)
    monkeypatch.setattr(sections, "LOCAL", sections.LocalServer())
    monkeypatch.setattr(sections.vllm, "is_installed", lambda: False)
    at = _page(monkeypatch, url=url)
    assert "Start local vLLM" not in [b.label for b in at.button]
    install = next(i.value for i in at.info if "vLLM is not installed" in i.value)
    assert "make vllm" in install and "scripts/vllm_start.sh" in install

    def failing_start(port, eager, timeout_s):
        assert eager  # the page starts it in eager mode: about a minute, not several
        time.sleep(1.0)
        raise EngineError("vLLM did not start: out of memory")

    monkeypatch.setattr(sections.vllm, "is_installed", lambda: True)
    monkeypatch.setattr(sections.vllm, "start_server", failing_start)
    at.run()
    _run_button(at, "Start local vLLM").click()
    at.run()
    assert not at.exception
    assert any(e.value == "The local vLLM did not start: vLLM did not start\\: out of memory"
               for e in at.error), [e.value for e in at.error]


def test_hosted_mode_sends_nothing_and_offers_only_files(monkeypatch):
    at = _page(monkeypatch, hosted=True)
    labels = [b.label for b in at.button]
    assert "Run the load" not in labels and "List models" not in labels
    assert "Stop" not in labels and not [t for t in at.text_input if t.key == "remote_url"]
    assert any("sends no requests to other servers" in i.value for i in at.info)
    assert len(at.get("file_uploader")) == 1


def test_hosted_mode_offers_the_sample_load_and_opens_it(monkeypatch):
    from engine.files import read_record
    from ui.sections.serving_engine import SAMPLE_LABEL, SAMPLE_LOAD

    at = _page(monkeypatch, hosted=True)
    assert any("No load yet" in i.value for i in at.info)
    next(b for b in at.button if b.label == "Open a sample load recorded from vLLM").click().run()
    assert not at.exception and not at.error
    shown = state_of(at.session_state).remote
    assert shown.label == SAMPLE_LABEL
    assert shown.run == read_record("load-test", SAMPLE_LOAD)  # as recorded, nothing re-run
    assert "Every request over time, as the client saw it" in _titles(at)
    assert "The server's own gauges (/metrics, about every 0.5 s)" in _titles(at)
    assert not any("No load yet" in i.value for i in at.info)


def test_a_saved_load_replays_in_the_same_views_without_a_server(monkeypatch):
    saved: LoadRun = load_loadtest(load_to_bytes(make_run()))
    at = _page(monkeypatch, hosted=True, remote=RemoteResults(saved, "file saved.json"),
               replay=True)
    assert any("**Replay** of a recorded load" in i.value for i in at.info)
    titles = _titles(at)
    assert "Every request over time, as the client saw it" in titles
    assert "Tokens per second" in titles
    assert "The server's own gauges (/metrics, about every 0.5 s)" in titles
    assert any("Showing **file saved\\.json**" in c.value for c in at.caption)
    table = next(t.value for t in at.table if "client (ms)" in t.value.columns)
    assert table["metric"].tolist()[:3] == ["TTFT mean", "TTFT p50", "TTFT p90"]
    assert table["server /metrics (ms)"].tolist()[1].startswith("–")  # empty histograms
    # the still-running request and the unsent one are kept as stopped (a replayed file is final)
    shown = state_of(at.session_state).remote.run
    assert [r.finish for r in shown.requests] == ["length", "error", "stopped", "stopped"]
    assert any("request 1: the server closed the stream" in w.value for w in at.warning)
    assert not [b for b in at.button if b.label == "Run the same load here"]  # a file: no re-run


@pytest.mark.vllm
def test_a_real_load_runs_is_kept_and_compared_with_this_apps_engine(monkeypatch):
    url = os.environ.get("INFERENCE_EXPLORER_VLLM_URL", "http://127.0.0.1:8011/v1")
    at = _page(monkeypatch, url=url)
    assert any("serves: " in s.value for s in at.success)
    at.text_area(key="remote_prompts").set_value("What is the capital of France?\nSay hi.")
    at.number_input(key="remote_count").set_value(3)
    at.number_input(key="remote_new").set_value(8)
    at.number_input(key="remote_conc").set_value(2)
    _run_button(at, "Run the load").click()
    at.run(timeout=300)
    assert not at.exception, at.exception
    run = state_of(at.session_state).remote.run
    assert isinstance(run, LoadRun) and len(run.requests) == 3 and not run.stopped
    assert all(r.finish in ("length", "stop") and 1 <= r.output_tokens <= 8 for r in run.requests)
    assert all(0 < r.ttft_ms <= r.e2e_ms for r in run.requests)
    assert len(run.samples) >= 2 and run.samples[0].t_ms == 0.0
    table = next(t.value for t in at.table if "client (ms)" in t.value.columns)
    assert table["server /metrics (ms)"][0] != "–"  # the server's TTFT histogram mean
    assert [m.label for m in at.metric][:5] == ["Throughput", "TTFT p50", "ITL p50", "TPOT p50",
                                                "Requests done"]
    _run_button(at, "Run the same load here").click()
    at.run(timeout=600)
    assert not at.exception, at.exception
    found = state_of(at.session_state).remote
    assert found.local is not None and len(found.agreement) == 3
    assert all(a.explained for a in found.agreement)  # equal, or parted at a near-tie
    side = next(t.value for t in at.table if "throughput (tokens/s)" in t.value.columns)
    assert side["engine"].tolist() == [f"server ({run.server})", "this app's engine"]
    assert any("Same prompts" in m.value and "different speed" in m.value for m in at.markdown)


def test_the_why_sentence_claims_only_what_the_numbers_back():
    from engine.remote.compare import Agreement, SideBySide
    from engine.remote.summary import ClientStats, ServerStats
    from ui.sections.serving_engine_results import why_text

    rows = [SideBySide("server (m)", 64, 40.0, 300.0, 400.0, 65.0, 140.0, 2500.0),
            SideBySide("this app's engine", 64, 10.0, 900.0, 1400.0, 100.0, 900.0, 9000.0)]
    client = ClientStats(8, 64, 40.0, {"mean": 320.0}, {"mean": 79.0}, {}, {}, 79.0)

    def server(itl_mean: float) -> ServerStats:
        return ServerStats({"mean": 270.0}, {"mean": itl_mean}, 64, 0, 10, 0, None, None, 4, 0,
                           0.02)

    agree = (Agreement(0, True, True, None, None), Agreement(1, True, False, 5, 0.01))
    text = why_text(rows, server(76.0), client, agree)
    assert "same outputs for 1 of 2 requests" in text and "the server 4.00× as fast" in text
    assert "not in HTTP" in text and "50.0 ms was outside its engine" in text
    assert "eager" not in text and "delayed" not in text
    text = why_text(rows, server(30.0), client, agree, eager=True, busy=True)
    assert "not in HTTP" not in text and "49.0 ms of every gap is spent outside it" in text
    assert "eager mode" in text and "delayed the local run" in text
    assert "server's own histogram" not in why_text(rows, None, client, agree)
