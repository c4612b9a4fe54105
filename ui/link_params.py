"""Share links' parameters: what a link asks for (parsed, each value checked) and a link's
address built from a view's parameters. Pure functions of their inputs and the sidebar's widget
values; applying a link to the session and the "Share this view" control are ui/links.py's.

A link never carries `s`, the session's private token for reloads: whoever opened a link holding
it would start from the sender's session record. Its parameters come from whoever wrote the URL,
so each is checked (kind, range, a known example name) and a bad one is dropped with one line
saying so; a link never runs the model.

A link to a published run holds its id (`view`) next to the prompt-and-settings parameters, which
are the link's fallback when the run is gone from the server. The selection (`layer`, `head`,
`step`, `stage`) is also what the address bar keeps for the session's own view (ui/address.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import quote, urlencode

import streamlit as st

from charts.formatting import localized
from engine import Trace
from engine.experiments import Experiments
from engine.quant import VARIANT_NAMES
from i18n import _
from ui.config import MAX_PROMPT_CHARS, Limits, config
from ui.keys import HEAD, LAYER, STEP
from ui.sidebar_settings import Setting, setting_table
from ui.text import plain

VIEW = {"layer": LAYER, "head": HEAD, "step": STEP}  # a link's selection → the widgets it presets
SELECTION = (*VIEW, "stage")  # the selection a link and the address carry (stage: Step by step's, from 1)
MAX_STAGE = 99  # Step by step clamps a stage past its last to its last
RUN_ID = re.compile(r"[A-Za-z0-9_-]{16,64}")  # a published run's id (ui/sessions.py new_view_id)
MAX_LINK_CHARS = 8000  # a longer URL is refused by some proxies (and Tornado's 64 KB header cap)
# `dtype` names the weights a link's run used: a weights variant (fp32, q4_0, …; what the sidebar
# offers) or a float dtype's name (float32 is fp32).
DTYPES = ("float32", "float16", "bfloat16", *VARIANT_NAMES)
LINK_PARAMS = ("view", "prompt", "example", *setting_table(config().limits), *SELECTION, "model",
               "dtype")


@dataclass(frozen=True, slots=True)
class Link:
    """What a share link asks for, every value checked."""

    prompt: str | None = None
    example: str | None = None
    settings: dict[str, int | float | bool] = field(default_factory=dict)  # by setting name
    view: dict[str, int] = field(default_factory=dict)  # layer, head, step (checked on a trace)
    model: str | None = None
    dtype: str | None = None
    stage: int | None = None  # Step by step's stage, from 1
    run: str | None = None  # a published run's id

    @property
    def opens_something(self) -> bool:
        """Whether it asks for more than a selection (which a reload's address holds too)."""
        return bool(self.prompt is not None or self.example is not None or self.settings
                    or self.model is not None or self.dtype is not None or self.run is not None)


def parse_link(params: Mapping[str, str], limits: Limits, example_names: tuple[str, ...]
               ) -> tuple[Link, list[str]]:
    """A link's parameters as a Link, and one line for each value it ignores. Parameters that are
    not a link's (`s`, another feature's) are left alone."""
    notes: list[str] = []

    def bad(name: str, why: str) -> None:
        shown = params[name] if len(params[name]) <= 40 else params[name][:40] + "…"
        notes.append(_("Ignored the link's {name} “{value}”: {why}.").format(
            name=name, value=shown, why=why))

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
                bad(name, _("must be a whole number from 0"))
    stage = None
    if "stage" in params:
        if re.fullmatch(r"\d{1,2}", params["stage"]) and 1 <= int(params["stage"]) <= MAX_STAGE:
            stage = int(params["stage"])
        else:
            bad("stage", _("must be a whole number from 1 to {most}").format(most=MAX_STAGE))
    run = params.get("view")
    if run is not None and not RUN_ID.fullmatch(run):
        bad("view", _("not the id of a published run"))
        run = None
    prompt = params.get("prompt")
    if prompt is not None and (len(prompt) > MAX_PROMPT_CHARS or not prompt.strip()):
        bad("prompt", _("must be 1 to {most} characters").format(
            most=localized(f"{MAX_PROMPT_CHARS:,}")))
        prompt = None
    example = params.get("example")
    if example is not None and example not in example_names:
        bad("example", _("no example of that name ships with this app"))
        example = None
    model = params.get("model")
    if model is not None and len(model) > 200:
        bad("model", _("a model name is at most {most} characters").format(most=200))
        model = None
    dtype = params.get("dtype")
    if dtype is not None and dtype not in DTYPES:
        bad("dtype", _("must be one of {names}").format(names=", ".join(DTYPES)))
        dtype = None
    return Link(prompt, example, settings, view, model, dtype, stage, run), notes


def check_view(view: Mapping[str, int], trace: Trace) -> tuple[dict[str, int], list[str]]:
    """The layer, head and step that exist in this trace, and a line for each that does not."""
    valid = {"layer": view.get("layer") in trace.attention_layers,
             "head": 0 <= view.get("head", -1) < trace.model.heads,
             "step": 0 <= view.get("step", -1) < len(trace.steps)}
    kept = {name: value for name, value in view.items() if valid[name]}
    notes = [_("Ignored the link's {name} {value}: this trace has no {name} {value}.").format(
                 name=name, value=value)
             for name, value in view.items() if not valid[name]]
    return kept, notes


def view_defaults(trace: Trace) -> dict[str, int]:
    """The selection a page shows when nothing is chosen: the widgets' first options (a link and
    the address leave these out)."""
    first = {"head": 0, "step": 0}
    return {"layer": trace.attention_layers[0], **first} if trace.attention_layers else first


@dataclass(slots=True)
class OpenedLink:
    """The link this session opened: what it asked for, the lines saying what it ignored, and
    the page it opened on (its notes show there until another page is opened)."""

    link: Link
    notes: list[str]
    page: str | None = None
    run_found: bool | None = None  # its published run: opened, gone from the server, or none asked


@dataclass(frozen=True, slots=True)
class Published:
    """A run this session published: its id, the session's trace and results it copied (compared
    by identity: a later run or result is not in it), and when (UTC, for the share panel)."""

    run: str
    trace: Trace
    experiments: Experiments
    at: str


@dataclass(frozen=True, slots=True)
class Share:
    """A link's parameters for this session's view, and what the link reproduces."""

    params: dict[str, str]  # never `s`
    lines: list[str]  # what the link reproduces, in words


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


def reproduces(from_run: bool, params: Mapping[str, str]) -> str:
    """What a re-run of the link's prompt gives, in words: the prompt and settings of the run
    shown (`from_run`), else the prompt box's and the sidebar's; on the model it names, if any."""
    greedy = float(params.get("temperature", "0")) == 0
    said = {
        (True, True): _("Carries the prompt and settings of the run shown; greedy decoding: "
                        "Generate gives the same tokens on {model}. Another model (or weights "
                        "dtype) loaded there may give other tokens."),
        (True, False): _("Carries the prompt and settings of the run shown; sampled with seed "
                         "{seed}: the same seed gives the same tokens on {model}. Another model "
                         "(or weights dtype) loaded there may give other tokens."),
        (False, True): _("Carries the prompt box and the sidebar's settings; greedy decoding: "
                         "Generate gives the same tokens on {model}. Another model (or weights "
                         "dtype) loaded there may give other tokens."),
        (False, False): _("Carries the prompt box and the sidebar's settings; sampled with seed "
                          "{seed}: the same seed gives the same tokens on {model}. Another "
                          "model (or weights dtype) loaded there may give other tokens."),
    }[(from_run, greedy)]
    model = (plain(_("{model}, {dtype} weights").format(model=params["model"],
                                                        dtype=params["dtype"]))
             if "model" in params else _("the same model"))
    return said.format(model=model, seed=params.get("seed", "0"))


def share_url(base: str, params: Mapping[str, str]) -> str:
    if "s" in params:
        raise ValueError("a share link never carries the session token `s`")
    return f"{base}?{urlencode(params, quote_via=quote)}" if params else base
