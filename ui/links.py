"""Share links: a URL that opens this view for someone else — the page (Streamlit's own path,
/attention), the prompt, the generation settings, the example trace and the selected layer, head
and decode step.

Not a page (app.py lists the pages). app.py calls `open_link()` right after `restore_session()`
(every run: it applies a link once, on the session's first run, before any widget exists) and
`share_view(page)` once the sidebar is drawn ("Share this view", and what an opened link did).

A link never carries `s`, the session's private token for reloads: whoever opened a link holding
it would start from the sender's session record. Opening a link only writes this session's own
state. Its parameters come from whoever wrote the URL, so each is checked (kind, range, a known
example name) and a bad one is dropped with one line saying so; a link never runs the model.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import streamlit as st

from engine import Trace
from engine.quant import VARIANT_NAMES
from engine.settings import FLOAT_WEIGHTS
from pages.present import presenting
from pages.sidebar_settings import Setting, setting_table, settings_of
from pages.state import (
    MAX_PROMPT_CHARS,
    Limits,
    config,
    current_trace,
    keep,
    loaded_model,
    plain,
    session_model,
)
from pages.traces import current_example, open_example, shipped_examples

# the widgets a link presets (session-state keys of pages/attention.py and pages/generate.py)
LAYER, HEAD, STEP = "attn_layer", "attn_head", "pick"
PROMPT = "prompt"  # the Generate page's prompt box
VIEW = {"layer": LAYER, "head": HEAD, "step": STEP}
MAX_LINK_CHARS = 8000  # a longer URL is refused by some proxies (and Tornado's 64 KB header cap)
# `dtype` names the weights a link's run used: a weights variant (fp32, q4_0, …; what the sidebar
# offers) or, in links made before variants existed, a float dtype.
DTYPES = ("float32", "float16", "bfloat16", *VARIANT_NAMES)
_OPENED, _PENDING, _SEEN, _NOTES = "_link_opened", "_link_pending_view", "_link_seen_view", "_link_notes"


@dataclass(frozen=True, slots=True)
class Link:
    """What a share link asks for, every value checked."""

    prompt: str | None = None
    example: str | None = None
    settings: dict[str, int | float | bool] = field(default_factory=dict)  # by setting name
    view: dict[str, int] = field(default_factory=dict)  # layer, head, step (checked on a trace)
    model: str | None = None
    dtype: str | None = None


def parse_link(params: Mapping[str, str], limits: Limits, example_names: tuple[str, ...]
               ) -> tuple[Link, list[str]]:
    """A link's parameters as a Link, and one line for each value it ignores. Parameters that are
    not a link's (`s`, another feature's) are left alone."""
    notes: list[str] = []

    def bad(name: str, why: str) -> None:
        shown = params[name] if len(params[name]) <= 40 else params[name][:40] + "…"
        notes.append(f"Ignored the link's {name} “{shown}”: {why}.")

    table = setting_table(limits)
    settings = {}
    for name, setting in table.items():
        if name in params:
            try:
                settings[name] = setting.parse(params[name])
            except ValueError as err:
                bad(name, str(err))
    view = {}
    for name in VIEW:
        if name in params:
            if re.fullmatch(r"\d{1,4}", params[name]):
                view[name] = int(params[name])
            else:
                bad(name, "must be a whole number from 0")
    prompt = params.get("prompt")
    if prompt is not None and (len(prompt) > MAX_PROMPT_CHARS or not prompt.strip()):
        bad("prompt", f"must be 1 to {MAX_PROMPT_CHARS:,} characters")
        prompt = None
    example = params.get("example")
    if example is not None and example not in example_names:
        bad("example", "no example of that name ships with this app")
        example = None
    model = params.get("model")
    if model is not None and len(model) > 200:
        bad("model", "a model name is at most 200 characters")
        model = None
    dtype = params.get("dtype")
    if dtype is not None and dtype not in DTYPES:
        bad("dtype", f"must be one of {', '.join(DTYPES)}")
        dtype = None
    return Link(prompt, example, settings, view, model, dtype), notes


def check_view(view: Mapping[str, int], trace: Trace) -> tuple[dict[str, int], list[str]]:
    """The layer, head and step that exist in this trace, and a line for each that does not."""
    valid = {"layer": view.get("layer") in trace.attention_layers,
             "head": 0 <= view.get("head", -1) < trace.model.heads,
             "step": 0 <= view.get("step", -1) < len(trace.steps)}
    kept = {name: value for name, value in view.items() if valid[name]}
    notes = [f"Ignored the link's {name} {value}: this trace has no {name} {value}."
             for name, value in view.items() if not valid[name]]
    return kept, notes


# --- applying a link ---

LINK_PARAMS = ("prompt", "example", *setting_table(config().limits), *VIEW, "model", "dtype")


def open_link() -> None:
    """Apply a share link on the session's first run (later reruns keep what the user changed);
    on every run, apply a link's layer/head/step once there is a trace, and note what is selected
    (a page's widgets forget their value when another page is shown)."""
    if not st.session_state.get(_OPENED):
        st.session_state[_OPENED] = True
        params = {name: st.query_params.get(name) for name in st.query_params
                  if name in LINK_PARAMS}
        if params:
            link, notes = parse_link(params, config().limits,
                                     tuple(e.name for e in shipped_examples()))
            notes += apply_link(link)
            st.session_state[_NOTES] = {"link": link, "notes": notes, "page": None}
            for name in params:  # the address bar now holds this session's own state (`s`)
                del st.query_params[name]
    apply_pending_view()
    note_view()


def apply_link(link: Link) -> list[str]:
    """Set this session's widgets and trace as the link asks; a line for what could not be."""
    table = setting_table(config().limits)
    for name, value in link.settings.items():
        st.session_state[table[name].key] = value
    if link.prompt is not None:
        keep("prompt", link.prompt)
    notes = []
    if link.example is not None:
        error = open_example(link.example)
        if error is not None:
            notes.append(f"Could not open the link's {error}.")
    if link.view:
        st.session_state[_PENDING] = dict(link.view)
    return notes


def apply_pending_view() -> None:
    """A link's layer/head/step, once a trace holds them (an example at once; a prompt after it
    is generated)."""
    view, trace = st.session_state.get(_PENDING), current_trace()
    if view is None or trace is None or trace.stop_reason == "running":
        return
    del st.session_state[_PENDING]
    kept, notes = check_view(view, trace)
    for name, value in kept.items():
        st.session_state[VIEW[name]] = value
    if notes and _NOTES in st.session_state:
        st.session_state[_NOTES]["notes"].extend(notes)


def _trace_id(trace: Trace | None) -> tuple[str, str] | None:
    return None if trace is None else (trace.created_at, trace.prompt)


def note_view() -> None:
    """Remember the layer, head and step last selected on this trace, for a link made on any page."""
    trace = current_trace()
    seen = st.session_state.get(_SEEN)
    if seen is None or seen[0] != _trace_id(trace):
        seen = (_trace_id(trace), {})
        st.session_state[_SEEN] = seen
    for name, key in VIEW.items():
        if isinstance(st.session_state.get(key), int):
            seen[1][name] = st.session_state[key]


# --- building a link ---


@dataclass(frozen=True, slots=True)
class Share:
    """A link's parameters for this session's view, and what the link reproduces."""

    params: dict[str, str]  # never `s`
    lines: list[str]  # what the link reproduces, in words


def share_params(limits: Limits) -> Share:
    """The link's parameters from this session: the example it shows — or the prompt of the run
    it shows (else the prompt box's) with every setting and the model, which a re-run needs —
    the settings changed from their defaults, and the selection."""
    trace, example = current_trace(), current_example()
    from_run = trace is not None and example is None
    params: dict[str, str] = {}
    lines: list[str] = []
    prompt = ""
    if example is not None:
        params["example"] = example.name
        lines.append(f"Opens the example “{plain(example.title)}” as recorded (no model needed).")
    else:
        prompt = trace.prompt if trace is not None else st.session_state.get(PROMPT) or ""
        if prompt.strip():
            params["prompt"] = prompt
    skipped = add_settings(params, setting_table(limits), settings_of(trace) if from_run else None)
    lm = loaded_model()
    spec = trace.model if trace is not None else lm.spec if lm is not None else None
    if "prompt" in params and spec is not None:
        params["model"], params["dtype"] = spec.name, _weights_of(trace, spec.dtype)
    if trace is not None:
        seen = st.session_state.get(_SEEN)
        view = seen[1] if seen is not None and seen[0] == _trace_id(trace) else {}
        params.update({n: str(v) for n, v in check_view(view, trace)[0].items()})
    if presenting():
        params["present"] = "1"
        lines.append("Opens in presentation mode.")
    if len(share_url("", params)) > MAX_LINK_CHARS and "prompt" in params:
        del params["prompt"]
        lines.append(f"The prompt is too long for a link ({len(prompt):,} characters): share "
                     "the trace file (Download trace) instead.")
    if "prompt" in params:
        lines.append(reproduces("the prompt and settings of the run shown" if from_run
                                else "the prompt box and the sidebar's settings", params))
    if skipped:
        lines.append(f"Left out ({', '.join(skipped)}): outside what this app's sidebar can set.")
    picked = [f"{n} {params[n]}" for n in VIEW if n in params]
    if picked:
        lines.append(f"Selected: {', '.join(picked)} (Attention's layer and head, Generate's "
                     "token).")
    lines.append("It does not carry the trace itself (Download trace does), nor your session.")
    return Share(params, lines)


def add_settings(params: dict[str, str], table: Mapping[str, Setting],
                 run: Mapping[str, int | float | bool] | None) -> list[str]:
    """Put the settings (the run's, else the sidebar's) in `params`: all of them with a prompt (a
    re-run needs them, whatever the other app's defaults), else those changed from the default.
    Returns the names of those the sidebar cannot hold (a trace file's temperature 3)."""
    skipped = []
    for name, setting in table.items():
        value = run[name] if run is not None else st.session_state.get(setting.key, setting.default)
        try:
            text = setting.text(setting.parse(setting.text(value)))
        except ValueError:
            skipped.append(name)
            continue
        if "prompt" in params or text != setting.text(setting.default):
            params[name] = text
    return skipped


def reproduces(prompt_is: str, params: Mapping[str, str]) -> str:
    """What a re-run of the link's prompt gives, in words."""
    model = plain(f"{params['model']}, {params['dtype']} weights") if "model" in params else "the same model"
    if float(params.get("temperature", "0")) == 0:
        how = "greedy decoding: Generate gives the same tokens"
    else:
        how = f"sampled with seed {params.get('seed', '0')}: the same seed gives the same tokens"
    return (f"Carries {prompt_is}; {how} on {model}. Another model (or weights dtype) loaded "
            "there may give other tokens.")


def share_url(base: str, params: Mapping[str, str]) -> str:
    if "s" in params:
        raise ValueError("a share link never carries the session token `s`")
    return f"{base}?{urlencode(params, quote_via=quote)}" if params else base


def page_base(page: Any) -> str:
    """This page's address as the browser has it (origin, any base path, the page's path);
    without a browser (tests), the page's path alone."""
    url = st.context.url
    if not url:
        return f"/{page.url_path}"
    return url if urlsplit(url).path else f"{url}/"


# --- the sidebar control and the notes of an opened link ---


def share_view(page: Any) -> None:
    """"Share this view" in the sidebar; on the page a link opened, what it did."""
    link_notes(page)
    share = share_params(config().limits)
    with st.sidebar.expander("Share this view", icon=":material/share:"):
        st.caption("Copy this link (button at its right): it opens this page as you see it.")
        link = share_url(page_base(page), share.params)
        st.code(link, language=None, wrap_lines=True, height="content" if len(link) < 300 else 200)
        for line in share.lines:
            st.caption(line)


def link_notes(page: Any) -> None:
    """What the opened link did and ignored, shown on its page until another page is opened."""
    opened = st.session_state.get(_NOTES)
    if opened is None:
        return
    if opened["page"] is None:
        opened["page"] = page.url_path
    if opened["page"] != page.url_path:
        del st.session_state[_NOTES]
        return
    link: Link = opened["link"]
    lines = model_notes(link)
    if link.example is not None and current_example() is not None:
        lines.insert(0, f"Opened the example “{plain(current_example().title)}” from a link, as "
                        "recorded.")
    if link.prompt is not None:
        later = (f"; its selection ({', '.join(f'{n} {v}' for n, v in link.view.items())}) "
                 "applies once the run is there" if link.view and current_trace() is None else "")
        lines.append("The link's prompt is in the prompt box on Generate and its settings are in "
                     f"the sidebar: press Generate to run it{later}.")
    for line in opened["notes"]:  # they quote the link's own text: shown as plain text
        st.warning(plain(line), icon=":material/link_off:")
    for line in lines:
        st.info(line, icon=":material/link:")


def _variant(name: str) -> str:
    return FLOAT_WEIGHTS.get(name, name)  # float32 → fp32: one name per choice


def _weights_of(trace: Trace | None, dtype: str) -> str:
    """The weights variant a trace was made with (older traces: its dtype's), or this session's."""
    if trace is not None:
        return trace.decoder.weights if trace.decoder is not None else dtype
    chosen = session_model()
    return chosen.weights if chosen is not None else dtype


def model_notes(link: Link) -> list[str]:
    """Whether a re-run of the link's prompt can give the same tokens here."""
    if link.prompt is None:
        return []
    lm = loaded_model()
    made = f"{link.model}, {link.dtype or 'float32'} weights" if link.model else None
    lines = []
    if made is None:
        lines.append("The link does not name its model: a re-run gives the same tokens only on "
                     "the model that made it.")
    elif lm is None:
        lines.append(f"The link was made with {plain(made)}; no model is loaded here yet.")
    elif (lm.spec.name, _variant(_weights_of(None, lm.spec.dtype))) != (
            link.model, _variant(link.dtype or lm.spec.dtype)):
        here = f"{lm.spec.name}, {_weights_of(None, lm.spec.dtype)} weights"
        lines.append(f"The link was made with {plain(made)}, but this app has {plain(here)} "
                     "loaded: the tokens may differ.")
    if lm is not None:
        from engine.runner import prepare_prompt

        chat = bool(st.session_state.get(setting_table(config().limits)["chat"].key, True))
        count, limit = len(prepare_prompt(lm.tokenizer, link.prompt, chat)), config().limits.prompt_tokens
        if count > limit:
            lines.append(f"The link's prompt is {count:,} tokens, over this app's limit of "
                         f"{limit:,}: Generate will refuse it until it is shorter.")
    return lines
