"""Share links in the session: `open_link()` applies a link's values (app.py calls it on every
run, right after `restore_session()`: a link is applied once, on the session's first run, before
any widget exists), and `share_view(page)` draws "Share this view" in the sidebar and, on the page
a link opened, what it did. What a link holds and how it is checked is ui/link_params.py's.

Opening a link only writes this session's own state.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import streamlit as st

from engine import Trace
from engine.settings import FLOAT_WEIGHTS
from ui.config import Limits, config
from ui.keys import PROMPT
from ui.link_params import (
    LINK_PARAMS,
    MAX_LINK_CHARS,
    VIEW,
    Link,
    OpenedLink,
    Share,
    add_settings,
    check_view,
    parse_link,
    reproduces,
    share_url,
)
from ui.present import presenting
from ui.record import keep_prompt
from ui.sidebar_settings import setting_table, settings_of
from ui.state import app_state, current_trace, loaded_model, session_model
from ui.text import plain
from ui.traces import current_example, open_example, shipped_examples

# --- applying a link ---


def open_link() -> None:
    """Apply a share link on the session's first run (later reruns keep what the user changed);
    on every run, apply a link's layer/head/step once there is a trace, and note what is selected
    (a page's widgets forget their value when another page is shown)."""
    links = app_state().links
    if not links.opened:
        links.opened = True
        params = {name: st.query_params.get(name) for name in st.query_params
                  if name in LINK_PARAMS}
        if params:
            link, notes = parse_link(params, config().limits,
                                     tuple(e.name for e in shipped_examples()))
            notes += apply_link(link)
            links.notes = OpenedLink(link, notes)
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
        keep_prompt(link.prompt)
    notes = []
    if link.example is not None:
        error = open_example(link.example)
        if error is not None:
            notes.append(f"Could not open the link's {error}.")
    if link.view:
        app_state().links.pending_view = dict(link.view)
    return notes


def apply_pending_view() -> None:
    """A link's layer/head/step, once a trace holds them (an example at once; a prompt after it
    is generated)."""
    links, trace = app_state().links, current_trace()
    view = links.pending_view
    if view is None or trace is None or trace.stop_reason == "running":
        return
    links.pending_view = None
    kept, notes = check_view(view, trace)
    for name, value in kept.items():
        st.session_state[VIEW[name]] = value
    if notes and links.notes is not None:
        links.notes.notes.extend(notes)


def _trace_id(trace: Trace | None) -> tuple[str, str] | None:
    return None if trace is None else (trace.created_at, trace.prompt)


def note_view() -> None:
    """Remember the layer, head and step last selected on this trace, for a link made on any page."""
    trace, links = current_trace(), app_state().links
    seen = links.seen
    if seen is None or seen[0] != _trace_id(trace):
        seen = links.seen = (_trace_id(trace), {})
    for name, key in VIEW.items():
        if isinstance(st.session_state.get(key), int):
            seen[1][name] = st.session_state[key]


# --- building a link ---


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
        seen = app_state().links.seen
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
    links = app_state().links
    opened = links.notes
    if opened is None:
        return
    if opened.page is None:
        opened.page = page.url_path
    if opened.page != page.url_path:
        links.notes = None
        return
    link = opened.link
    lines = model_notes(link)
    if link.example is not None and current_example() is not None:
        lines.insert(0, f"Opened the example “{plain(current_example().title)}” from a link, as "
                        "recorded.")
    if link.prompt is not None:
        later = (f"; its selection ({', '.join(f'{n} {v}' for n, v in link.view.items())}) "
                 "applies once the run is there" if link.view and current_trace() is None else "")
        lines.append("The link's prompt is in the prompt box on Generate and its settings are in "
                     f"the sidebar: press Generate to run it{later}.")
    for line in opened.notes:  # they quote the link's own text: shown as plain text
        st.warning(plain(line), icon=":material/link_off:")
    for line in lines:
        st.info(line, icon=":material/link:")


def _variant(name: str) -> str:
    return FLOAT_WEIGHTS.get(name, name)  # float32 → fp32: one name per choice


def _weights_of(trace: Trace | None, dtype: str) -> str:
    """The weights variant a trace was made with (a trace without a decoder record: its dtype's),
    or this session's."""
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
        from engine.forward import prepare_prompt

        chat = bool(st.session_state.get(setting_table(config().limits)["chat"].key, True))
        count, limit = len(prepare_prompt(lm.tokenizer, link.prompt, chat)), config().limits.prompt_tokens
        if count > limit:
            lines.append(f"The link's prompt is {count:,} tokens, over this app's limit of "
                         f"{limit:,}: Generate will refuse it until it is shorter.")
    return lines
