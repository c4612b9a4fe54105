"""Inference Explorer — the entry point: router, shared sidebar, session restore.

The configuration is ui/config.py's, the shared objects (the model turn, the model store, the
session records) ui/shared.py's, and the session's typed state (`loaded_model()`,
`session_model()`, `generation_settings()`, `current_trace()`) ui/state.py's; the sidebar here
sets the model and the settings.
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from ui.startup import progress, starting  # noqa: E402 — standard library only

if starting():  # the server has just started: no import here until its start-up work is over
    from ui.starting import starting_page  # Streamlit and the standard library only

    starting_page(starting, progress)

import streamlit as st  # noqa: E402

from engine import GenerationSettings  # noqa: E402
from engine.loader import MAX_SOURCE_CHARS, is_gguf_path  # noqa: E402
from engine.models import on_file_blocks  # noqa: E402
from engine.serving.model_runner import serving_problem  # noqa: E402
from engine.settings import FLOAT_DTYPES  # noqa: E402
from i18n import N_, _  # noqa: E402
from ui import shared  # noqa: E402
from ui.address import write_address  # noqa: E402
from ui.config import config  # noqa: E402
from ui.experiment import run_experiment  # noqa: E402
from ui.found_models import sidebar_found_models  # noqa: E402
from ui.guard import model_refusal  # noqa: E402
from ui.keys import MODEL_SOURCE, WEIGHTS  # noqa: E402
from ui.language import language_switch, start_language, write_language  # noqa: E402
from ui.links import open_link, share_view  # noqa: E402
from ui.present import (  # noqa: E402
    navigation_position,
    present_navigation,
    presenting,
    set_page_title,
    sidebar_presentation,
    start_presentation,
)
from ui.record import (  # noqa: E402
    hold_page_widgets,
    keep_model_choice,
    not_kept_notice,
    restore_session,
)
from ui.session_model import SessionModel  # noqa: E402
from ui.sidebar_settings import (  # noqa: E402
    DECODER_HELP,
    decoder_line,
    preset_settings,
    setting_table,
    weights_label,
)
from ui.state import set_generation_settings, set_session_model  # noqa: E402
from ui.text import message  # noqa: E402

LIMITS = config().limits
ASSETS = Path(__file__).parent / "assets"


def no_model() -> None:
    set_session_model(None)


@st.fragment(run_every=1.0)
def rerun_when_loaded(source: str, weights: str) -> None:
    models = shared.MODELS
    if models.peek(source, weights) is not None or models.failure(source, weights) is not None:
        st.rerun(scope="app")


def loading_in_background(source: str, weights: str) -> None:
    """Hosted mode: the first visitor's page never waits for the model; it loads in a thread and
    this session reruns once it is ready (pages that need it say so meanwhile)."""
    no_model()
    failed = shared.MODELS.failure(source, weights)
    if failed is not None:
        st.sidebar.error(message(_("Model not loaded: {reason}").format(reason=failed)))
        return
    shared.MODELS.load_in_background(source, weights)
    st.sidebar.info(_("Loading the model in the background (a few seconds); everything that "
                      "does not run it works meanwhile."), icon=":material/hourglass:")
    rerun_when_loaded(source, weights)


def sidebar_weights(gguf: bool = False) -> str:
    """The weights variant this session runs (hosted: the ones its memory cap holds together;
    a GGUF file: its own, since every other variant is a copy of float32 weights it does not
    hold — engine/models.py MAPPED_VARIANTS)."""
    choices = ("fp32",) if gguf else config().weights_choices
    if st.session_state.get(WEIGHTS) not in choices:  # a forged or stale value
        st.session_state[WEIGHTS] = choices[0]
    if gguf:
        return st.sidebar.selectbox(
            _("Weights"), choices, key=WEIGHTS, disabled=True,
            format_func=lambda name: _("the file's own, as stored"),
            help=_("A model opened from a GGUF file runs on the file's own weights, as stored; "
                   "the other weights variants are copies of the default model's float32 "
                   "weights, which a GGUF file does not hold."))
    scope = (_("Hosted demo: float32 or q4_0, each shared by every visitor who picks it; run "
               "the app locally for the others.") + " " if config().hosted else "")
    return st.sidebar.selectbox(
        _("Weights"), choices, key=WEIGHTS, format_func=weights_label,
        help=scope + _("How the weights are stored. Fewer bits = fewer bytes every decode step "
                       "reads: int8 keeps one scale per row, q4_0 / q4_1 one float16 scale (and "
                       "minimum) per 32 weights; the integer variants' matrices run in the native "
                       "C step, which reads the codes directly, and torch runs them on the "
                       "dequantized float32 values. The Quantization page measures each one's "
                       "bytes, speed and quality. Your choice loads a model of your own: other "
                       "visitors keep theirs."))


def sidebar_model() -> None:
    st.sidebar.header(_("Model"))
    source = "default"
    if not config().hosted:
        custom = st.sidebar.text_input(
            _("Hugging Face id or local folder"), key=MODEL_SOURCE,
            placeholder=_("default: SmolLM2-135M"), max_chars=MAX_SOURCE_CHARS,
            help=_("A causal LM with safetensors weights, already on this machine (offline), or "
                   "the path of a llama-family .gguf file: opened from its own tensors, decoded "
                   "by the native step on its stored blocks, its tensor table on the "
                   "Quantization page."))
        source = custom.strip() or "default"
        sidebar_found_models()  # this machine's GGUF files, its own server only
    refusal = model_refusal(source)  # a shared server: no folder outside its allowlist, and
    gguf = refusal is None and is_gguf_path(source)
    weights = sidebar_weights(gguf)
    keep_model_choice(None if config().hosted else st.session_state.get(MODEL_SOURCE, ""), weights)
    if refusal is not None:  # no word on whether it exists
        st.sidebar.error(message(refusal), icon=":material/block:")
        no_model()
        return
    models = shared.MODELS
    if config().hosted and weights == "fp32" and models.peek(source, weights) is None:
        loading_in_background(source, weights)  # the page draws now; it reruns when the model is in
        return
    loaded = models.peek(source, weights)  # held from here: an eviction cannot undo it
    copy = weights not in FLOAT_DTYPES and loaded is None
    label = (_("Building the {weights} weights: quantizing every matrix and packing the native "
               "step (a few seconds)…").format(weights=weights) if copy else
             _("Loading model… (the very first start converts the GGUF: ~30 s)"))
    with st.sidebar.status(label, expanded=copy) as status:
        # quantizing is model work: it takes the shared turn like any other; a float load does not
        entry = loaded or run_experiment(lambda job: models.get(source, weights), turn=copy)
        if entry is None:  # the reason is shown
            status.update(label=_("Model not loaded"), state="error", expanded=True)
            no_model()
            return
        lm = entry.lm
        spec = lm.spec
        status.update(label=f"{spec.name.split(' (')[0]} · {lm.device}", state="complete",
                      expanded=False)
        loaded_line = (_("{params} M parameters, {layers} layers, {heads} query / {kv_heads} KV "
                         "heads, {weights} weights: {mb} MB stored; loaded in {seconds} s from "
                         "cache") if lm.from_cache else
                       _("{params} M parameters, {layers} layers, {heads} query / {kv_heads} KV "
                         "heads, {weights} weights: {mb} MB stored; loaded in {seconds} s"))
        st.caption(loaded_line.format(
            params=f"{spec.param_count / 1e6:.0f}", layers=spec.layers, heads=spec.heads,
            kv_heads=spec.kv_heads, weights=_("the file's own") if gguf else weights_label(weights),
            mb=f"{entry.stored_bytes / 1e6:,.0f}", seconds=f"{lm.load_seconds:.1f}"))
    model = SessionModel(source, weights, entry)
    set_session_model(model)
    sidebar_decoder(model)


def sidebar_decoder(model: SessionModel) -> None:
    """Which decode step this session's runs use, and if torch, why (the KV-cache toggle below
    decides it too: its value from this session's last run)."""
    kv_cache = bool(st.session_state.get(setting_table(LIMITS)["kv_cache"].key, True))
    line = decoder_line(model.native_problem(), kv_cache, on_file_blocks(model.lm, model.weights),
                        batched=config().batching and serving_problem(model.lm) is None)
    st.sidebar.caption(_("Decoder: **{decoder}**").format(decoder=message(line)),
                       help=_(DECODER_HELP))


def sidebar_settings() -> None:
    side = st.sidebar
    side.header(_("Generation"))
    table = preset_settings()  # defaults, unless a share link set them
    new = side.slider(_("Max new tokens"), **table["new_tokens"].widget(),
                      help=_("At most {n} here.").format(n=LIMITS.new_tokens))
    temp = side.slider(_("Temperature"), **table["temperature"].widget(),
                       help=_("0 = greedy: always the most probable token. Higher values flatten "
                              "the distribution before sampling."))
    top_k = side.number_input("Top-k", **table["top_k"].widget(),
                              help=_("Sample only among the k most probable tokens; 0 = off."),
                              disabled=temp == 0)
    top_p = side.slider("Top-p", **table["top_p"].widget(),
                        help=_("Sample from the smallest set of tokens whose probabilities add "
                               "up to p; 1 = off."), disabled=temp == 0)
    seed = side.number_input(_("Seed"), **table["seed"].widget(),
                             help=_("Same seed, same sampled tokens."), disabled=temp == 0)
    chat = side.toggle(_("Chat template"), **table["chat"].widget(),
                       help=_("Wrap the prompt as a user turn in the model's chat format (adds "
                              "special tokens)."))
    kv = side.toggle(_("KV cache"), **table["kv_cache"].widget(),
                     help=_("Off: every step recomputes the whole sequence — same tokens, "
                            "slower."))
    attn = side.toggle(_("Record attention"), **table["attention"].widget(),
                       help=_("Keep every layer's attention weights for the attention pages "
                              "(costs memory on long prompts)."))
    if attn:
        side.caption(_("Recording budget: up to {mb} MB of attention a run (float16); a longer "
                       "run or a bigger model keeps fewer layers, evenly spaced.")
                     .format(mb=LIMITS.record_mb))
    set_generation_settings(GenerationSettings(
        max_new_tokens=min(int(new), LIMITS.new_tokens), temperature=float(temp), top_k=int(top_k),
        top_p=float(top_p),
        seed=int(seed), chat_template=chat, kv_cache=kv, record_attention=attn,
        max_prompt_tokens=LIMITS.prompt_tokens, attention_budget_mb=LIMITS.record_mb))


st.set_page_config(page_title="Inference Explorer", page_icon="🔎", layout="wide")
st.html(f"<style>{(ASSETS / 'style.css').read_text()}</style>")
restore_session()
hold_page_widgets()  # the Prompt box keeps its text while another page is shown
start_language()  # before any word is drawn
open_link()  # a share link's values, on the session's first run, before any widget
start_presentation()  # before the sidebar draws: presenting, the page opens without it
PAGE_LIST = [  # file, title (English: also the chart download names' page part), icon
    ("pages/generate.py", N_("Generate"), ":material/play_arrow:"),
    ("pages/story.py", N_("Step by step"), ":material/school:"),
    ("pages/tokens.py", N_("Tokens"), ":material/data_array:"),
    ("pages/embeddings.py", N_("Embeddings"), ":material/scatter_plot:"),
    ("pages/attention.py", N_("Attention"), ":material/grid_on:"),
    ("pages/timing.py", N_("Prefill vs decode"), ":material/timer:"),
    ("pages/kvcache.py", N_("KV cache"), ":material/memory:"),
    ("pages/serving.py", N_("Serving"), ":material/dns:"),
    ("pages/serving_engine.py", N_("Serving engine"), ":material/cloud:"),
    ("pages/quantization.py", N_("Quantization"), ":material/compress:"),
    ("pages/steps.py", N_("Steps"), ":material/table_rows:"),
    ("pages/compare.py", N_("Compare runs"), ":material/compare_arrows:"),
    ("pages/whatif.py", N_("What if"), ":material/call_split:"),
    ("pages/glossary.py", N_("Glossary"), ":material/menu_book:"),
]
PAGES = [st.Page(path, title=_(title), icon=icon, default=i == 0)
         for i, (path, title, icon) in enumerate(PAGE_LIST)]
ENGLISH_TITLES = {entry.url_path: title for entry, (_path, title, _icon) in zip(PAGES, PAGE_LIST)}
page = st.navigation(PAGES, position=navigation_position(), expanded=True)  # presenting: hidden
present_navigation(PAGES)  # and the pages are a row of links at the top
set_page_title(ENGLISH_TITLES[page.url_path])
if not presenting():  # presenting, the switch sits in the top row
    language_switch()
sidebar_model()
sidebar_settings()
share = share_view(page)
sidebar_presentation()
NOT_KEPT = st.empty()  # above the page: filled once the page has written this run's work
try:
    page.run()
finally:  # also after a page's st.stop(): the share panel offers this run's record, the notice
    try:  # says whether the server kept the work, and the address ends on this run's view
        share()
        if (notice := not_kept_notice()) is not None:
            NOT_KEPT.warning(notice, icon=":material/cloud_off:")
    finally:
        write_language()
        write_address()
