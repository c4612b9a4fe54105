"""The HTML report (charts/report.py, `python -m charts.report`): its numbers are the engine's,
it stands alone (one inlined plotly.js, no external URL), and user strings cannot break it."""

from __future__ import annotations

import base64
import json
import re
import sys
from dataclasses import replace
from html.parser import HTMLParser

import numpy as np
import plotly.io as pio
import pytest

from charts.formatting import count, duration, rate, size
from charts.report import attention_focus, main, numbers, report_html
from engine.experiments import Experiments
from engine.files import load_trace
from engine.kv.cachelab import OnOff
from engine.records.examples import EXAMPLES_DIR
from engine.records.tracefile import FORMAT_NAME, FORMAT_VERSION
from engine.timing.disturbance import assess
from engine.timing.metrics import summarize
from engine.timing.sweeps import SweepPoint

EXAMPLES = ("qa", "story")  # greedy short Q&A with every layer's attention; 200 tokens, 3 layers
MADE_AT = "2026-01-02T03:04:05+00:00"
BANNER = re.compile(r"\*\s*plotly\.js v\d")  # the header comment of each copy of the library


@pytest.fixture(scope="module", params=EXAMPLES)
def trace(request):
    return load_trace(EXAMPLES_DIR / f"{request.param}.npz")


@pytest.fixture(scope="module")
def page(trace) -> str:
    return report_html(trace, made_at=MADE_AT)


class Tags(HTMLParser):
    """Every start tag with its attributes, and the text inside each element with an id."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: dict[str, str] = {}
        self._open: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag not in ("meta", "br"):
            self._open.append(dict(attrs).get("id") or "")

    def handle_endtag(self, tag):
        if self._open:
            self._open.pop()

    def handle_data(self, data):
        for name in self._open:
            if name:
                self.text[name] = self.text.get(name, "") + data


def parse(text: str) -> Tags:
    tags = Tags()
    tags.feed(text)
    tags.close()
    return tags


def figures(text: str) -> list[list[dict]]:
    """Each figure's data (its traces), read back from its Plotly.newPlot call."""
    found = []
    for match in re.finditer(r'Plotly\.newPlot\(\s*"figure-\d+",\s*', text):
        data, _ = json.JSONDecoder().raw_decode(text, match.end())
        found.append(data)
    return found


def layouts(text: str) -> list[dict]:
    """Each figure's layout, read back from its Plotly.newPlot call (after the data)."""
    found = []
    for match in re.finditer(r'Plotly\.newPlot\(\s*"figure-\d+",\s*', text):
        decoder = json.JSONDecoder()
        _, end = decoder.raw_decode(text, match.end())
        layout, _ = decoder.raw_decode(text, re.match(r"\s*,\s*", text[end:]).end() + end)
        found.append(layout)
    return found


def array(value) -> np.ndarray:
    """A plotly JSON array: a list, or plotly's typed array {"dtype", "bdata", "shape"}."""
    if isinstance(value, dict):
        flat = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
        shape = value.get("shape")
        return flat.reshape([int(n) for n in str(shape).split(",")]) if shape else flat
    return np.array([np.nan if v is None else v for v in value], dtype=np.float64) \
        if value and not isinstance(value[0], list) else np.array(
            [[np.nan if v is None else v for v in row] for row in value], dtype=np.float64)


def kinds(text: str) -> list[str]:
    return [data[0]["type"] if data else "" for data in figures(text)]


def shown_numbers(text: str) -> dict[str, tuple[str, str]]:
    """key → (exact value, text shown) of every number cell."""
    found = {}
    for _tag, attrs in parse(text).tags:
        if "data-key" in attrs:
            found[attrs["data-key"]] = attrs["data-value"]
    shown = dict(re.findall(r'data-key="([^"]+)" data-value="[^"]*">([^<]*)</td>', text))
    return {k: (v, shown[k]) for k, v in found.items()}


def test_numbers_are_summarize_values_formatted_as_the_app_does(trace, page):
    found = shown_numbers(page)
    s = summarize(trace).to_dict()
    for key in ("ttft_ms", "itl_p50_ms", "itl_mean_ms", "itl_p90_ms", "itl_p99_ms", "tpot_ms",
                "e2e_ms"):
        assert float(found[key][0]) == s[key], key
        assert found[key][1] == duration(s[key]), key
    for key in ("decode_tokens_per_s", "prefill_tokens_per_s"):
        assert float(found[key][0]) == s[key] and found[key][1] == rate(s[key]), key
    for key in ("prompt_tokens", "output_tokens"):
        assert int(found[key][0]) == s[key] and found[key][1] == count(s[key]), key
    assert float(found["prefill_ms"][0]) == trace.steps[0].latency_ms
    assert float(found["decode_ms"][0]) == sum(trace.itl_ms)
    assert float(found["tokenize_ms"][0]) == trace.tokenize_ms
    assert int(found["kv_bytes"][0]) == trace.kv_bytes and found["kv_bytes"][1] == size(trace.kv_bytes)
    m, context = trace.model, trace.steps[-1].context_len
    assert (f"2 · {m.layers} layers · {m.kv_heads} KV heads · {m.head_dim} head_dim · "
            f"{m.dtype_bytes} B · {context} tokens = {m.kv_bytes(context):,} B") in page
    assert [n.key for n in numbers(trace)] == list(found)  # every number has its cell


def test_the_two_examples_give_their_own_numbers():
    pages = [shown_numbers(report_html(load_trace(EXAMPLES_DIR / f"{n}.npz"), made_at=MADE_AT))
             for n in EXAMPLES]
    assert pages[0]["output_tokens"] != pages[1]["output_tokens"]
    assert pages[0]["kv_bytes"] != pages[1]["kv_bytes"]
    assert pages[0]["ttft_ms"] != pages[1]["ttft_ms"]


def test_settings_model_prompt_answer_and_provenance(trace, page):
    tags = parse(page)
    assert tags.text["prompt"] == trace.prompt
    assert tags.text["answer"] == trace.output_text
    m = trace.model
    assert tags.text["model-line"].split() == (f"{m.name} · {count(m.param_count)} parameters · "
                                               f"{m.dtype} · {trace.device}").split()
    assert f"{m.param_count:,}" in page and f"{trace.settings.max_new_tokens}" in page
    assert f"{FORMAT_NAME} version {FORMAT_VERSION}</span>" in page
    assert f"by engine {trace.engine_version}" in page and MADE_AT in page
    assert trace.created_at in page


def test_one_inlined_plotly_and_no_external_resource(trace, page):
    assert len(BANNER.findall(page)) == 1
    figures = 4 if attention_focus(trace) is not None else 3
    assert page.count("Plotly.newPlot(") == figures
    scripts = [a for tag, a in parse(page).tags if tag == "script"]
    # plotly.js, its config, the print step (assets/report.js), one per figure
    assert len(scripts) == 3 + figures and not any("src" in a for a in scripts)
    for tag, attrs in parse(page).tags:
        for name in ("src", "href", "action", "data"):
            assert not re.match(r"\s*(https?:)?//", attrs.get(name) or ""), (tag, attrs)
    assert not [tag for tag, _ in parse(page).tags if tag in ("link", "iframe", "img", "object")]
    style = page[page.index("<style>"):page.index("</style>")]
    assert "url(" not in style and "@import" not in style and "http" not in style


def test_token_chips_of_the_prompt_and_the_answer(trace, page):
    chips = [a for tag, a in parse(page).tags if tag == "span" and "ie-chip" in (a.get("class") or "")]
    chips = [c for c in chips if c.get("title")]  # the legend's sample chips have no hover
    assert len(chips) == len(trace.prompt_token_ids) + len(trace.steps)
    assert sum("ie-gen" in c["class"] for c in chips) == len(trace.steps)


def test_attention_heatmap_names_its_head_and_is_left_out_without_attention(trace, page):
    layer, head, _ = attention_focus(trace)
    assert f"layer {layer}, head {head}" in page and kinds(page)[-1] == "heatmap"
    heat = figures(page)[-1][0]
    t = len(trace.prompt_token_ids)
    if t <= 96:  # not block-averaged: the recorded prefill weights of that head, masked above
        recorded = trace.steps[0].attention[trace.attention_layers.index(layer), head]
        z = array(heat["z"])
        assert np.allclose(np.tril(z), np.tril(recorded.astype(np.float32)), atol=1e-6)
        assert np.isnan(z[np.triu_indices(t, 1)]).all()
    bare = replace(trace, attention_layers=(),
                   steps=tuple(replace(s, attention=None) for s in trace.steps))
    text = report_html(bare, made_at=MADE_AT)
    assert "heatmap" not in kinds(text) and "recorded without attention" in text
    assert len(figures(text)) == 3 and len(BANNER.findall(text)) == 1


def test_figures_are_the_apps_charts_of_this_run(trace, page):
    steps, timeline, memory = figures(page)[:3]
    bars = [y for t in steps if t["type"] == "bar" for y in t["y"] if y is not None]
    assert sorted(bars) == sorted(s.latency_ms for s in trace.steps)  # one bar per step
    assert [t["name"] for t in timeline] == ["tokenize", "prefill", "decode"]
    # the KV page's chart: KiB, or MiB from 10 MiB (the 200-token story reaches it)
    unit = 2**20 if max(s.kv_bytes for s in trace.steps) >= 10 * 2**20 else 1024
    assert memory[0]["y"] == [s.kv_bytes / unit for s in trace.steps]
    assert (unit == 2**20) == ("KV cache (MiB)" in page)


def test_every_axis_grows_its_margin_whatever_the_process_template(trace, monkeypatch):
    """A report made where another plotly template is the process-wide default (the app's
    process: Streamlit's, which has no automargin) still takes plotly's white template and sets
    automargin on every axis, so no tick label is cut at a figure's edge (the browser test
    measures the boxes)."""
    monkeypatch.setattr(pio.templates, "default", "none")
    found = layouts(report_html(trace, made_at=MADE_AT))
    assert len(found) == (4 if attention_focus(trace) is not None else 3)
    for layout in found:
        axes = [v for k, v in layout.items() if re.fullmatch(r"[xy]axis\d*", k)]
        assert len(axes) >= 2 and all(axis["automargin"] is True for axis in axes)
        assert layout["template"]["layout"]["xaxis"]["automargin"] is True


HOSTILE = '</style></script><script>alert("x")</script><b onclick=alert(1)>bold</b> & "q"'


def test_user_strings_are_escaped_everywhere(trace):
    m = replace(trace.model, name='evil</title><script>alert("m")</script>')
    steps = list(trace.steps)
    steps[1] = replace(steps[1], piece="</script><img src=x onerror=alert(2)>",
                       text="</script><img src=x onerror=alert(2)>")
    hostile = replace(trace, prompt=HOSTILE, model=m, steps=tuple(steps),
                      prompt_pieces=("<script>alert(3)</script>",) + trace.prompt_pieces[1:])
    text = report_html(hostile, made_at=MADE_AT)
    tags = parse(text)
    names = [tag for tag, _ in tags.tags]
    figures = text.count("Plotly.newPlot(")
    assert names.count("script") == 3 + figures  # ours only: plotly.js, its config, the print step
    assert names.count("style") == 1 and "b" not in names and "img" not in names
    assert not any(k.startswith("on") for _, a in tags.tags for k in a)
    assert tags.text["prompt"] == HOSTILE  # shown as text, exactly
    assert "<script>alert" not in text and "alert(3)" in text  # escaped, not dropped
    assert 'evil&lt;/title&gt;' in text


def test_disturbed_run_says_so_with_the_rule(trace, page):
    assert "No step was delayed by other work" in page and 'class="warn"' not in page
    threads = max(1, min(trace.machine.threads, trace.machine.cores))
    steps = tuple(replace(s, others_share=0.9, cpu_ms=0.1 * threads * s.latency_ms)
                  if s.index in (1, 2) else s for s in trace.steps)
    disturbed = replace(trace, steps=steps)
    assert assess(disturbed).delayed_steps == (1, 2)
    text = report_html(disturbed, made_at=MADE_AT)
    assert '<div class="warn" id="disturbance">' in text and "Delayed steps: 1, 2." in text
    assert assess(disturbed).warning().replace("'", "&#x27;") in text


def test_experiment_results_saved_with_the_trace_are_shown(trace):
    found = Experiments(
        sweeps={"context": (SweepPoint(16, 30.0, 33.3, (29.0, 30.0, 31.0)),
                            SweepPoint(128, 32.0, 31.2, (31.0, 32.0, 35.0)))},
        cache_on_off=(OnOff(8, np.full(8, 30.0), np.linspace(40, 80, 8), True),))
    text = report_html(trace, found, made_at=MADE_AT)
    plain = report_html(trace, made_at=MADE_AT)
    assert text.count("Plotly.newPlot(") == plain.count("Plotly.newPlot(") + 2
    assert "Context → ITL" in text and "KV cache on vs off" in text
    assert f"{found.cache_on_off[0].speedup:.2f}× faster" in text
    assert "Experiments</h2>" not in plain


def test_cli_report_writes_the_file(tmp_path, capsys):
    out = tmp_path / "report.html"
    assert main([str(EXAMPLES_DIR / "qa.npz"), "-o", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    trace = load_trace(EXAMPLES_DIR / "qa.npz")
    assert parse(text).text["prompt"] == trace.prompt and len(BANNER.findall(text)) == 1
    assert str(out) in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["/no/such/trace.npz"], "no such file"),
    ([str(EXAMPLES_DIR / "qa.npz"), "-o", "/no/such/folder/r.html"], "no such folder"),
    ([str(EXAMPLES_DIR / "examples.json")], "not a valid trace file"),
])
def test_cli_report_user_mistakes_exit_2_with_one_line(args, message, capsys):
    with pytest.raises(SystemExit) as done:
        sys.exit(main(args))
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
