"""Share links in the session: `open_link()` applies a link's values (app.py calls it on every
run, right after `restore_session()`: a link is applied once, on the session's first run, before
any widget exists), and `share_view(page)` shows, on the page a link opened, what it did, and
places "Share this view" (in the sidebar; presenting, on the page too), drawn after the page.
What a link holds and how it is checked is ui/link_params.py's; a published run is
ui/snapshots.py's; the selection in the address, ui/address.py's.

Opening a link only writes this session's own state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import streamlit as st

from charts.formatting import localized
from engine import Trace
from engine.settings import FLOAT_WEIGHTS
from i18n import _
from ui.address import (
    address_params,
    apply_pending_view,
    follow_history,
    history_navigation,
    keep_selection,
    note_view,
    selection,
    want_selection,
)
from ui.config import Limits, config
from ui.keys import PROMPT
from ui.language import address_language
from ui.link_params import (
    LINK_PARAMS,
    MAX_LINK_CHARS,
    SELECTION,
    Link,
    OpenedLink,
    Published,
    Share,
    add_settings,
    parse_link,
    reproduces,
    share_url,
)
from ui.present import presenting
from ui.record import keep_prompt
from ui.sidebar_settings import setting_table, settings_of
from ui.snapshots import kept_for, open_published, publish, published_run
from ui.state import app_state, current_experiments, current_trace, loaded_model, session_model
from ui.text import plain
from ui.traces import current_example, open_example, shipped_examples

# --- applying a link ---


def open_link() -> None:
    """Apply a share link (or the address's selection) on the session's first run, later reruns
    keeping what the user changed; on Back / Forward, the address's selection; on every run, a
    pending layer/head/step once there is a trace, and what is selected noted."""
    links = app_state().links
    note_view()
    if not links.opened:
        links.opened = True
        link, notes = parse_link(address_params(LINK_PARAMS), config().limits,
                                 tuple(e.name for e in shipped_examples()))
        if link.opens_something or notes:
            found = open_published(link.run) if link.run is not None else None
            notes += apply_link(link, found)
            links.notes = OpenedLink(link, notes, run_found=found)
        want_selection(link.view, link.stage, whole=False)
    elif history_navigation():
        follow_history()
    ignored = apply_pending_view()
    if ignored and links.notes is not None:
        links.notes.notes.extend(ignored)
    keep_selection()


def apply_link(link: Link, run_found: bool | None) -> list[str]:
    """Set this session's widgets and trace as the link asks (its published run already opened,
    when `run_found`); a line for what could not be."""
    table = setting_table(config().limits)
    for name, value in link.settings.items():
        st.session_state[table[name].key] = value
    if run_found:
        return []
    if link.prompt is not None:
        keep_prompt(link.prompt)
    notes = []
    if link.example is not None:
        error = open_example(link.example)
        if error is not None:
            notes.append(_("Could not open the link's {error}.").format(error=error))
    return notes


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
        lines.append(_("Opens the example “{title}” as recorded (no model needed).").format(
            title=plain(_(example.title))))
    else:
        prompt = trace.prompt if trace is not None else st.session_state.get(PROMPT) or ""
        if prompt.strip():
            params["prompt"] = prompt
    skipped = add_settings(params, setting_table(limits), settings_of(trace) if from_run else None)
    lm = loaded_model()
    spec = trace.model if trace is not None else lm.spec if lm is not None else None
    if "prompt" in params and spec is not None:
        params["model"], params["dtype"] = spec.name, _weights_of(trace, spec.dtype)
    params.update(selection())
    params.update(address_language())  # opens in the language it was sent in
    if presenting():
        params["present"] = "1"
        lines.append(_("Opens in presentation mode."))
    if len(share_url("", params)) > MAX_LINK_CHARS and "prompt" in params:
        del params["prompt"]
        lines.append(_("The prompt is too long for a link ({n} characters): share the trace file "
                       "(Download trace) instead.").format(n=localized(f"{len(prompt):,}")))
    if "prompt" in params:
        lines.append(reproduces(from_run, params))
    if skipped:
        lines.append(_("Left out ({names}): outside what this app's sidebar can set.").format(
            names=", ".join(skipped)))
    picked = [f"{n} {params[n]}" for n in SELECTION if n in params]
    if picked:
        lines.append(_("Selected: {picked} (Attention's layer and head, Generate's token, Step by "
                       "step's stage).").format(picked=", ".join(picked)))
    return Share(params, lines)


def page_base(page: Any) -> str:
    """This page's address as the browser has it (origin, any base path, the page's path);
    without a browser (tests), the page's path alone."""
    url = st.context.url
    if not url:
        return f"/{page.url_path}"
    return url if urlsplit(url).path else f"{url}/"


# --- the sidebar control and the notes of an opened link ---


def share_view(page: Any) -> Callable[[], None]:
    """On the page a link opened, what it did; and the places of "Share this view" in the sidebar
    and, presenting (the sidebar hidden), on the page. Returns what draws them, which app.py calls
    once the page has run: the panel then offers to publish the run this page run just made."""
    link_notes(page)
    # the expander and the popover themselves are drawn now, so they stay put (and open) while
    # the page runs; their containers keep the last panel on screen until it is drawn again
    side = st.sidebar.expander(_("Share this view"), icon=":material/share:",
                               key="share_view_sidebar").container()
    here = (st.popover(_("Share this view"), icon=":material/share:",
                       key="share_view_page").container() if presenting() else None)

    def draw() -> None:
        share = share_params(config().limits)
        with side:
            share_panel(page, share, "sidebar")
        if here is not None:
            with here:
                share_panel(page, share, "page")

    return draw


def share_panel(page: Any, share: Share, where: str) -> None:
    """The link to this view and what it carries; "Publish a link to this run" when there is a
    run, and once published, the link holds the run (the other parameters are its fallback)."""
    trace = current_trace()
    if trace is not None:
        st.button(_("Publish a link to this run"), key=f"publish_{where}", on_click=publish,
                  icon=":material/publish:", disabled=trace.stop_reason == "running",
                  help=_("Keeps a copy of this run (its tokens, timings and the results computed "
                         "on it) on this server for {kept}, and gives a link that opens it "
                         "exactly as it is now, with no model. Your later work does not change "
                         "it.").format(kept=kept_for()))
    if trace is not None and app_state().links.publish_refused:
        st.warning(_("Not published: this server keeps every published link for {kept}, at most "
                     "{n} of one visitor's at once, and has no room for another now. Your links "
                     "stay; share the trace file instead: Download trace on Generate.").format(
                         kept=kept_for(), n=config().client_published))
    done = published_run(trace)
    params = share.params if done is None else {"view": done.run, **share.params}
    link = share_url(page_base(page), params)
    if done is None:
        st.caption(_("Copy this link (button at its right): it opens this page as you see it."))
    else:
        st.caption(_("Copy this link (button at its right): it opens this run as recorded, on "
                     "this page as you see it."))
    st.code(link, language=None, wrap_lines=True, height="content" if len(link) < 300 else 200)
    for line in published_lines(done) if done is not None else share.lines:
        st.caption(line)
    if done is None:
        st.caption(_("It does not carry the run itself: publish it (above), or share the trace "
                     "file (Download trace on Generate). Nor does it carry your session."))


def published_lines(done: Published) -> list[str]:
    lines = [_("Published at {at}: the same tokens, timings and results for whoever opens it, no "
               "model needed; kept on this server for {kept} (less if it restarts or needs the "
               "room), then the link opens its example or prompt and settings.").format(
                   at=done.at, kept=kept_for())]
    if done.experiments is not current_experiments():
        lines.append(_("Results computed since are not in it: publish again to include them."))
    return lines


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
    for line in opened.notes:  # they quote the link's own text: shown as plain text
        st.warning(plain(line), icon=":material/link_off:")
    if opened.run_found:
        trace = current_trace()
        st.info(_("Opened the run shared with this link, as recorded ({created}, {model} on "
                  "{device}): its tokens, timings and results are the sender's own; no model ran "
                  "here.").format(created=plain(trace.created_at), model=plain(trace.model.name),
                                  device=plain(trace.device)), icon=":material/link:")
        return
    if opened.run_found is False:
        if link.example is not None:
            gone = _("This link's run is no longer on this server (a published run is kept {kept} "
                     "at most): it opens the link's example instead.")
        elif link.prompt is not None:
            gone = _("This link's run is no longer on this server (a published run is kept {kept} "
                     "at most): it opens the link's prompt and settings instead.")
        else:
            gone = _("This link's run is no longer on this server (a published run is kept {kept} "
                     "at most): it opens the link's other values instead.")
        st.warning(gone.format(kept=kept_for()), icon=":material/link_off:")
    lines = model_notes(link)
    if link.example is not None and current_example() is not None:
        lines.insert(0, _("Opened the example “{title}” from a link, as recorded.").format(
            title=plain(_(current_example().title))))
    if link.prompt is not None:
        if link.view and current_trace() is None:
            lines.append(_("The link's prompt is in the prompt box on Generate and its settings "
                           "are in the sidebar: press Generate to run it; its selection "
                           "({selection}) applies once the run is there.").format(
                               selection=", ".join(f"{n} {v}" for n, v in link.view.items())))
        else:
            lines.append(_("The link's prompt is in the prompt box on Generate and its settings "
                           "are in the sidebar: press Generate to run it."))
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
    made = (_("{model}, {dtype} weights").format(model=link.model, dtype=link.dtype or "float32")
            if link.model else None)
    lines = []
    if made is None:
        lines.append(_("The link does not name its model: a re-run gives the same tokens only on "
                       "the model that made it."))
    elif lm is None:
        lines.append(_("The link was made with {model}; no model is loaded here yet.").format(
            model=plain(made)))
    elif (lm.spec.name, _variant(_weights_of(None, lm.spec.dtype))) != (
            link.model, _variant(link.dtype or lm.spec.dtype)):
        here = _("{model}, {dtype} weights").format(model=lm.spec.name,
                                                    dtype=_weights_of(None, lm.spec.dtype))
        lines.append(_("The link was made with {model}, but this app has {here} loaded: the "
                       "tokens may differ.").format(model=plain(made), here=plain(here)))
    if lm is not None:
        from engine.forward import prepare_prompt

        chat = bool(st.session_state.get(setting_table(config().limits)["chat"].key, True))
        count, limit = len(prepare_prompt(lm.tokenizer, link.prompt, chat)), config().limits.prompt_tokens
        if count > limit:
            lines.append(_("The link's prompt is {count} tokens, over this app's limit of "
                           "{limit}: Generate will refuse it until it is shorter.").format(
                               count=localized(f"{count:,}"), limit=localized(f"{limit:,}")))
    return lines
