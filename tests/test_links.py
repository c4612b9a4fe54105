"""Share links (ui/links.py, ui/link_params.py): a link built from one session opens the same view in a fresh
one; bad values are ignored with one line each; a link applies once; a link never carries the
session token `s`, and opening one changes nothing of the sender's session.

AppTest runs the st.navigation entry point (app.py, where links are built and applied) on the
first run only, then the current page alone; so a sender's state is set before its first run, and
what must happen on later runs is checked with `harness`, which does what app.py does every run.
The app runs with an empty folder as its model (it fails to load at once): links never need one.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import pytest
from streamlit.testing.v1 import AppTest

from engine.files import read_trace_file
from engine.records.examples import examples
from ui.config import AppConfig
from ui.link_params import Link, check_view, parse_link, share_url
from ui.shared import SESSIONS
from ui.sidebar_settings import setting_table
from ui.state import state_of

APP = str(Path(__file__).parents[1] / "app.py")
LIMITS = AppConfig.from_env().limits
NAMES = tuple(e.name for e in examples())
QA = next(e for e in examples() if e.name == "qa")
QA_TRACE = read_trace_file(QA.path).trace


@pytest.fixture(autouse=True)
def local_mode(monkeypatch):
    monkeypatch.setenv("INFERENCE_EXPLORER_HOSTED", "0")


def fresh_app(folder: Path, params: dict[str, str] | None = None, trace=None, example=None,
              **widgets) -> AppTest:
    """The app's first run with this URL's parameters, this trace (the shipped `example`: its
    name and created_at) and these widget values."""
    at = AppTest.from_file(APP, default_timeout=120)
    at.session_state["model_source"] = str(folder)  # no model: links never need one
    at.session_state["replay_speed"] = "instant"  # an example opens without its recorded pace
    state_of(at.session_state).run.trace = trace
    state_of(at.session_state).run.example = example
    for key, value in widgets.items():
        at.session_state[key] = value
    at.query_params.update(params or {})
    return at.run()


def harness() -> None:
    """app.py's link steps on every run, with the Temperature slider and the selection shown."""
    import streamlit as st

    from ui.address import write_address
    from ui.keys import HEAD, LAYER, STEP
    from ui.links import open_link
    from ui.record import restore_session
    from ui.sidebar_settings import preset_settings

    restore_session()
    open_link()
    table = preset_settings()
    st.slider("Temperature", **table["temperature"].widget())
    st.text(repr([st.session_state.get(key) for key in (LAYER, HEAD, STEP)]))
    write_address()


def the_link(at: AppTest) -> str:
    (code,) = [c.value for c in at.sidebar.code]
    return code


def link_params(link: str) -> dict[str, str]:
    return dict(parse_qsl(urlsplit(link).query, keep_blank_values=True))


def sidebar_values(at: AppTest) -> dict[str, object]:
    widgets = [*at.sidebar.slider, *at.sidebar.number_input, *at.sidebar.toggle]
    return {w.label: w.value for w in widgets}


SENDER = {  # a session that opened the qa example, changed settings and picked layer/head/step
    "trace": QA_TRACE, "example": ("qa", QA_TRACE.created_at),
    "gen_temperature": 0.7, "gen_seed": 9, "gen_top_k": 40, "gen_kv_cache": False,
    "gen_new_tokens": 100, "attn_layer": 3, "attn_head": 2, "pick": 5}


def test_round_trip_restores_example_settings_layer_head_and_step(tmp_path):
    sender = fresh_app(tmp_path, **SENDER)
    assert not sender.exception
    link = the_link(sender)
    params = link_params(link)
    assert params["example"] == "qa" and (params["layer"], params["head"], params["step"]) == ("3", "2", "5")
    assert (params["temperature"], params["seed"], params["kv_cache"]) == ("0.7", "9", "0")
    assert "s" not in params and "s" in sender.query_params

    opened = fresh_app(tmp_path / "other", params)
    assert not opened.exception
    assert not [w.value for w in opened.warning]
    assert any("Opened the example" in i.value for i in opened.info)
    trace = state_of(opened.session_state).run.trace
    assert trace.prompt == QA.prompt and trace.output_token_ids == QA_TRACE.output_token_ids
    assert state_of(opened.session_state).run.example[0] == "qa"
    assert sidebar_values(opened) == sidebar_values(sender)
    assert sidebar_values(opened)["Temperature"] == 0.7 and sidebar_values(opened)["Seed"] == 9
    assert sidebar_values(opened)["KV cache"] is False and sidebar_values(opened)["Max new tokens"] == 100
    assert opened.select_slider(key="pick").value == 5
    # the link's own parameters leave the address: it holds this session's token and the view
    assert dict(opened.query_params) == {"s": opened.query_params["s"], "layer": "3", "head": "2",
                                         "step": "5"}
    assert opened.query_params["s"] != sender.query_params["s"]
    assert link_params(the_link(opened)) == params  # the opened view shares as the same link
    opened.switch_page("pages/attention.py").run()
    assert not opened.exception
    assert (opened.selectbox(key="attn_layer").value, opened.selectbox(key="attn_head").value) == (3, 2)


def test_a_run_of_its_own_shares_its_prompt_and_settings_not_the_sidebars(tmp_path):
    own = QA_TRACE  # as if generated in this session: no example recorded for it
    at = fresh_app(tmp_path, trace=own, gen_temperature=1.5, prompt="edited since")
    params = link_params(the_link(at))
    assert "example" not in params
    assert params["prompt"] == own.prompt and params["temperature"] == "0"
    assert params["new_tokens"] == str(own.settings.max_new_tokens)
    weights = own.decoder.weights if own.decoder is not None else own.model.dtype
    assert params["model"] == own.model.name and params["dtype"] == weights
    assert any("greedy decoding" in c.value for c in at.sidebar.caption)


def test_a_link_applies_once_and_later_changes_stay():
    at = AppTest.from_function(harness, default_timeout=60)
    at.query_params.update({"temperature": "0.5", "layer": "3"})
    at.run()
    assert at.slider[0].value == 0.5
    at.slider[0].set_value(1.2).run()
    at.run()
    assert at.slider[0].value == 1.2
    assert dict(at.query_params).keys() == {"s", "layer"}  # the selection waits for a trace


def test_bad_values_are_ignored_with_one_line_each(tmp_path):
    at = fresh_app(tmp_path, {"temperature": "9", "seed": "-1", "top_p": "0.33", "chat": "yes",
                              "example": "../../etc/passwd", "new_tokens": "100000",
                              "layer": "x", "head": "2", "top_k": "40",
                              "prompt": "a" * 20_001, "dtype": "int3"})
    assert not at.exception
    warnings = [w.value for w in at.warning]
    for name in ("temperature", "seed", "top\\_p", "chat", "example", "new\\_tokens", "layer",
                 "prompt", "dtype"):
        assert sum(f"link's {name} " in w for w in warnings) == 1, name
    assert len(warnings) == 9
    values = sidebar_values(at)
    assert values["Temperature"] == 0.0 and values["Top-p"] == 1.0 and values["Seed"] == 0
    assert values["Top-k"] == 40  # the good values still apply
    assert state_of(at.session_state).run.trace is None and at.text_area(key="prompt").value == ""


def test_a_layer_head_or_step_the_trace_lacks_is_ignored(tmp_path):
    at = fresh_app(tmp_path, {"example": "story", "layer": "3", "head": "2", "step": "999"})
    warnings = [w.value for w in at.warning]
    assert any("layer 3" in w for w in warnings) and any("step 999" in w for w in warnings)
    story = state_of(at.session_state).run.trace
    assert at.session_state["attn_head"] == 2
    assert at.session_state["attn_layer"] == story.attention_layers[0]  # the page's default
    assert at.select_slider(key="pick").value == 0


def test_a_prompt_links_selection_waits_for_its_trace(tmp_path):
    """A prompt link fills the prompt box; its layer/head/step apply once a trace exists."""
    at = fresh_app(tmp_path, {"prompt": QA.prompt, "layer": "4", "head": "1", "step": "2"})
    assert at.text_area(key="prompt").value == QA.prompt
    assert "attn_layer" not in at.session_state
    assert any("press Generate" in i.value for i in at.info)
    later = AppTest.from_function(harness, default_timeout=60)
    later.query_params.update({"prompt": QA.prompt, "layer": "4", "head": "1", "step": "2"})
    later.run()
    assert later.text[0].value == "[None, None, None]"
    state_of(later.session_state).run.trace = QA_TRACE  # the run, done
    later.run()
    assert later.text[0].value == "[4, 1, 2]"


def test_a_link_never_carries_the_session_token_and_opening_one_leaves_the_sender_alone(tmp_path):
    sender = fresh_app(tmp_path, {"s": "not-a-known-token"}, **SENDER)
    link = the_link(sender)
    next(b for b in sender.button if b.key == "example_sampled").click().run()
    token = sender.query_params["s"]
    before = SESSIONS.copy(token)
    assert before["trace"].prompt != QA.prompt
    assert "s" not in link_params(link) and token not in link
    stranger = fresh_app(tmp_path / "b", {**link_params(link), "prompt": "someone else's prompt"})
    assert state_of(stranger.session_state).run.trace.prompt == QA.prompt
    next(b for b in stranger.button if b.key == "example_story").click().run()
    after = SESSIONS.copy(token)
    assert after.keys() == before.keys() and all(after[k] is before[k] for k in before)
    sender.run()
    assert state_of(sender.session_state).run.trace is before["trace"]
    with pytest.raises(ValueError):
        share_url("/", {"example": "qa", "s": token})


def test_parse_link_checks_every_value():
    link, notes = parse_link({"example": "qa", "temperature": "0.7", "top_p": "0.9", "seed": "7",
                              "chat": "0", "layer": "12", "prompt": "hi", "model": "M",
                              "dtype": "float16", "s": "abcdefgh12", "present": "1"},
                             LIMITS, NAMES)
    assert notes == []
    assert link == Link("hi", "qa", {"temperature": 0.7, "top_p": 0.9, "seed": 7, "chat": False},
                        {"layer": 12}, "M", "float16")
    _, notes = parse_link({"temperature": "0.73", "top_k": "1e3", "seed": str(2**31),
                           "new_tokens": "0", "kv_cache": "true", "head": "-1"}, LIMITS, NAMES)
    assert len(notes) == 6
    assert any("temperature “0.73”: must be a multiple of 0.05" in note for note in notes)


def test_every_sidebar_setting_survives_its_own_text():
    for name, setting in setting_table(LIMITS).items():
        for value in (setting.default, setting.low, setting.high):
            value = setting.kind(value)
            assert setting.parse(setting.text(value)) == value, name


def test_check_view_keeps_what_the_trace_has():
    story = read_trace_file(next(e for e in examples() if e.name == "story").path).trace
    kept, notes = check_view({"layer": 15, "head": 8, "step": 199}, story)
    assert kept == {"layer": 15, "head": 8, "step": 199} and notes == []
    kept, notes = check_view({"layer": 14, "head": story.model.heads, "step": 200}, story)
    assert kept == {} and len(notes) == 3


def test_hosted_limits_bound_a_links_settings():
    hosted = AppConfig(True, replace(LIMITS, new_tokens=64), 1, 1, 1.0).limits
    link, notes = parse_link({"new_tokens": "100"}, hosted, NAMES)
    assert link.settings == {} and "from 1 to 64" in notes[0]
    assert parse_link({"new_tokens": "64"}, hosted, NAMES)[0].settings == {"new_tokens": 64}


@pytest.mark.real_model
def test_a_prompt_link_says_whether_this_model_gives_the_same_tokens(tmp_path):
    """With the default model loaded: a link naming it says nothing more; another model or dtype
    is named, with "the tokens may differ"; a prompt over the token limit is said to be."""
    at = AppTest.from_file(APP, default_timeout=180)
    at.query_params.update({"prompt": "Name three colours.", "model": "Other-7B", "dtype": "float16"})
    at.run()
    assert not at.exception
    infos = " ".join(i.value for i in at.info)
    assert "made with Other\\-7B, float16 weights" in infos and "the tokens may differ" in infos
    name = state_of(at.session_state).model.lm.spec.name
    same = AppTest.from_file(APP, default_timeout=180)
    same.query_params.update({"prompt": "Name three colours.", "model": name, "dtype": "float32"})
    same.run()
    assert "may differ" not in " ".join(i.value for i in same.info)
    assert any("greedy decoding: Generate gives the same tokens" in c.value for c in same.sidebar.caption)
    q4 = AppTest.from_file(APP, default_timeout=180)  # same model, other weights variant
    q4.query_params.update({"prompt": "Name three colours.", "model": name, "dtype": "q4_0"})
    q4.run()
    infos = " ".join(i.value for i in q4.info).replace("\\", "")
    assert "q4_0 weights" in infos and "fp32 weights loaded: the tokens may differ" in infos
    long = AppTest.from_file(APP, default_timeout=180)
    long.query_params.update({"prompt": "colour " * (LIMITS.prompt_tokens + 10)})
    long.run()
    assert any("over this app's limit" in i.value for i in long.info)


def test_a_link_made_while_presenting_opens_in_presentation_mode(tmp_path):
    presenting = fresh_app(tmp_path, {"example": "qa", "present": "1"})
    assert not presenting.exception
    assert link_params(the_link(presenting)) == {"example": "qa", "present": "1"}
    normal = fresh_app(tmp_path, {"example": "qa"})
    assert link_params(the_link(normal)) == {"example": "qa"}
