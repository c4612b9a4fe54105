"""Inference, step by step: a guided story on the session's own trace.

The explainer's stages in order — text → tokens → embeddings (+RoPE) → attention → FFN and
residual → next-token distribution and sampling → prefill vs decode → the KV cache → weights in
fewer bits — one at a time: a short paragraph, one figure from this session's trace, a "what to
notice" line computed from it (engine/lens/notice.py, cost_notice.py, weights_notice.py), and a
link to the full page. ← Previous / Next → (and the keyboard: → / PageDown, ← / PageUp, what
presentation clickers send) move through it.

`page()` at the bottom reads like the page's table of contents.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import streamlit as st

from charts.attention import downsample, heatmap, sequence_labels
from charts.embeddings import rope_angle_chart
from charts.kvcache import live_memory_chart
from charts.live import step_chart
from charts.story import (
    layer_split_chart,
    next_token_chart,
    residual_norm_chart,
    weights_step_chart,
)
from charts.tokens import token_chips_html
from engine import Trace
from engine.lens import cost_notice, notice, weights_notice, wording
from engine.lens.attention_stats import full_attention
from engine.lens.rope import angles
from i18n import N_, _, language
from ui.common import require_trace, show_chart
from ui.keys import STORY_FIGURE, STORY_NEXT, STORY_PREVIOUS, STORY_STAGE
from ui.memo import memo
from ui.state import app_state
from ui.text import plain

LIMIT = 96  # heatmap cells per side before blocks are averaged (as on the Attention page)


def what_to_notice(text: str) -> None:
    st.info(_("**What to notice.** {text}").format(text=plain(text)), icon=":material/visibility:")


# Each stage: a paragraph (general, with this model's numbers), its "what to notice" line
# (engine/lens/notice.py), then its figure. The line comes before the figure so that it stays on
# screen at 1440×900 whatever the figure's height.

def tokens_intro(trace: Trace) -> str:
    return _("A model reads numbers, not letters. The tokenizer cuts the text into pieces from its "
             "vocabulary of {vocab} — byte-pair encoding (BPE): start from "
             "single bytes and keep merging the most frequent neighbouring pairs — and each piece "
             "becomes an integer id. Common words are one piece; rare words and scripts the "
             "tokenizer saw little of are cut into several.").format(
        vocab=f"{trace.model.vocab_size:,}")


def tokens_figure(trace: Trace, fact: Any) -> None:
    st.markdown(token_chips_html(trace), unsafe_allow_html=True)
    st.caption(_("Your run: prompt tokens (special tokens of the chat template in purple), then "
                 "the generated ones (orange). Hover a chip for its id."))


def embeddings_intro(trace: Trace) -> str:
    return _("Each id selects one row of the embedding table: a vector of "
             "{hidden} numbers that training placed so that tokens used alike sit "
             "close together. Attention by itself does not know which token came first, so "
             "position is added with rotary embeddings (RoPE): every pair of dimensions of a "
             "head's query and key is turned by an angle that grows with the token's position — "
             "fast for the first pairs, slowly for the last.").format(hidden=trace.model.hidden_size)


def embeddings_figure(trace: Trace, fact: Any) -> None:
    spec = trace.model
    positions = np.arange(fact.last_position + 1)
    show_chart(rope_angle_chart(angles(fact.theta, spec.head_dim, positions), positions),
               name="story-rope-angles")
    st.caption(_("The rotation angle of each of the {pairs} dimension pairs at every "
                 "position of your run (0 … {last}), modulo one turn.").format(
        pairs=spec.head_dim // 2, last=fact.last_position))


def attention_intro(trace: Trace) -> str:
    spec = trace.model
    return _("In every layer each token makes a query q, a key k and a value v. A token's query "
             "is compared with the keys of itself and every earlier token (q·kᵀ), scaled by "
             "1/√{head_dim} (√head_dim) to keep softmax stable, and softmax turns the scores "
             "into weights that add up to 1; the output is the weighted sum of the values. "
             "{heads} heads per layer do this side by side, each with its own pattern.").format(
        head_dim=spec.head_dim, heads=spec.heads)


def attention_figure(trace: Trace, fact: Any) -> None:
    if not fact.recorded:
        return  # the line above says why
    t = len(trace.prompt_token_ids)
    weights = full_attention(trace, fact.layer)[fact.head, :t, :t]  # (T, T) prefill rows
    matrix, names, block = downsample(weights, sequence_labels(trace)[:t], LIMIT)
    title = _("layer {layer}, head {head} (prefill)").format(layer=fact.layer, head=fact.head)
    show_chart(heatmap(matrix, names, title), name=f"story-attention-L{fact.layer}-H{fact.head}")
    if block > 1:
        st.caption(_("Each row is one query token's weights over the keys; grey cells are future "
                     "tokens, masked out. {t} tokens shown as {block}×{block} blocks (mean "
                     "weight).").format(t=t, block=block))
    else:
        st.caption(_("Each row is one query token's weights over the keys; grey cells are future "
                     "tokens, masked out."))


def ffn_intro(trace: Trace) -> str:
    return _("After attention, each token's vector goes through a small two-layer feed-forward "
             "network (FFN) on its own. Neither replaces the vector: each adds its output to it — "
             "the residual stream — so every layer refines what the previous ones wrote. "
             "Attention moves information between tokens; the FFN processes it.")


def ffn_figure(trace: Trace, fact: Any) -> None:
    spec = trace.model
    if fact.norms is not None:
        show_chart(residual_norm_chart(fact.norms), name="story-residual-stream")
    else:
        show_chart(layer_split_chart(fact.attention_params, fact.ffn_params), name="story-layer-split")
    st.caption(_("Attention per layer = hidden · (heads + 2 · KV heads) · head_dim + heads · "
                 "head_dim · hidden = {hidden} · ({heads} + 2 · {kv_heads}) · "
                 "{head_dim} + {heads} · {head_dim} · {hidden} = "
                 "{attention}; a layer = (parameters − embedding tables − final norm) "
                 "÷ {layers} layers = {layer}; the FFN (and norms) the rest.").format(
        hidden=spec.hidden_size, heads=spec.heads, kv_heads=spec.kv_heads, head_dim=spec.head_dim,
        attention=f"{fact.attention_params:,}", layers=spec.layers, layer=f"{fact.layer_params:,.0f}"))


def next_token_intro(trace: Trace) -> str:
    return _("After the last layer, the vector at the last position is projected onto the whole "
             "vocabulary ({vocab} scores, the logits) and softmax turns them "
             "into probabilities. Greedy decoding takes the most probable token; sampling draws "
             "one — temperature flattens or sharpens the distribution first, top-k and top-p cut "
             "its tail.").format(vocab=f"{trace.model.vocab_size:,}")


def next_token_figure(trace: Trace, fact: Any) -> None:
    step = next((s for s in trace.steps if s.index == fact.step), None)
    if step is None:
        return
    show_chart(next_token_chart(step), name=f"story-next-token-step{step.index}")
    outside = all(int(i) != step.token_id for i in step.top_ids)
    if outside:
        caption = _("Step {step}: the model's top {k} candidates (probabilities at temperature 1), "
                    "the chosen token in red — below them: sampling took one outside the top.")
    else:
        caption = _("Step {step}: the model's top {k} candidates (probabilities at temperature 1), "
                    "the chosen token in red.")
    st.caption(caption.format(step=step.index, k=len(step.top_ids)))


def phases_intro(trace: Trace) -> str:
    return _("Generation is two different jobs. Prefill runs the whole prompt through the model in "
             "one pass — many tokens per weight read, so it is limited by arithmetic; it sets the "
             "time to first token (TTFT). Decode then produces one token per step: every step "
             "reads all the weights (and the KV cache) to compute a single token, so it waits on "
             "memory; its step time is the inter-token latency (ITL).")


def phases_figure(trace: Trace, fact: Any) -> None:
    show_chart(step_chart(trace), name="story-prefill-vs-decode")


def kv_intro(trace: Trace) -> str:
    return _("A token's keys and values never change once computed, so decode keeps them: the KV "
             "cache. Each step computes q, k, v for the new token only, appends k and v to every "
             "layer's cache and attends over all of it — no recomputation, but memory that grows "
             "with every token.")


def kv_figure(trace: Trace, fact: Any) -> None:
    show_chart(live_memory_chart(trace), name="story-kv-cache")


def weights_intro(trace: Trace) -> str:
    return _("Decode is memory-bound: every decode step reads every weight once — all "
             "{params} of this model's — to compute a single token, and waits "
             "on memory far longer than on arithmetic. Store each weight in fewer bits (16 instead "
             "of 32, or 8, or 4 with a scale per small group) and each step reads fewer bytes, so "
             "decode gets faster — at some cost in quality, since the weights are rounded. The "
             "Quantization page measures both on the loaded model.").format(
        params=f"{trace.model.param_count:,}")


def weights_figure(trace: Trace, fact: Any) -> None:
    labels = [weights_notice.bits_label(trace.model, f) for f in fact.formats]
    show_chart(weights_step_chart(labels, fact.formula_bytes, fact.formats.index(fact.weights),
                                  fact.measured_bytes), name="story-weights-per-step")
    formula = plain(weights_notice.formula(trace.model))
    if trace.model.tie_word_embeddings:
        st.caption(_("Weight bytes = params × bits / 8, each format's scales included: "
                     "{formula}. Blue: this run's weights.").format(formula=formula))
    else:
        st.caption(_("Weight bytes = params × bits / 8, each format's scales included: "
                     "{formula}. An untied input embedding is only looked up, one row per token, "
                     "so its other rows are left out. Blue: this run's weights.").format(formula=formula))
    if fact.weights == weights_notice.GGUF:
        st.caption(_("GGUF: this run read the file's own blocks, as stored: {bits:.3g} bits per "
                     "weight on average (the file's tensor bytes ÷ its weights).").format(
            bits=trace.model.stored_bits))


@dataclass(frozen=True, slots=True)
class Stage:
    title: str
    intro: Callable[[Trace], str]
    notice: Callable[[Trace], Any]  # a record of engine/lens/notice.py, with .text
    figure: Callable[[Trace, Any], None]  # drawn from the trace and that record
    page: str  # the full page, for st.page_link
    link: str


STAGES = (
    Stage(N_("Text → tokens (BPE)"), tokens_intro, notice.tokens_notice, tokens_figure,
          "pages/tokens.py", N_("Tokens: any text as chips, BPE merges step by step, 15 languages")),
    Stage(N_("Tokens → vectors: embeddings and RoPE"), embeddings_intro, notice.embeddings_notice,
          embeddings_figure, "pages/embeddings.py", N_("Embeddings: nearest tokens, a 2-D map, RoPE")),
    Stage(N_("Attention: Q·Kᵀ/√d, softmax, ·V"), attention_intro, notice.attention_notice,
          attention_figure, "pages/attention.py",
          N_("Attention: every layer and head, decode steps, one head step by step")),
    Stage(N_("Feed-forward network and the residual stream"), ffn_intro, notice.ffn_notice,
          ffn_figure, "pages/generate.py",
          N_("Generate: the logit lens — what each layer's residual stream would predict")),
    Stage(N_("The next token: a distribution, then a choice"), next_token_intro,
          notice.sampling_notice, next_token_figure, "pages/generate.py",
          N_("Generate: any step's top-10 candidates")),
    Stage(N_("Prefill vs decode"), phases_intro, cost_notice.phase_notice, phases_figure, "pages/timing.py",
          N_("Prefill vs decode: TTFT, ITL, FLOPs, bytes and the roofline")),
    Stage(N_("The KV cache"), kv_intro, cost_notice.kv_notice, kv_figure, "pages/kvcache.py",
          N_("KV cache: live memory, cache on vs off, calculator, shrinking it — and shrinking "
             "the cache itself: a latent cache (MLA), sparse attention, eviction")),
    Stage(N_("Weights in fewer bits"), weights_intro, weights_notice.weights_notice, weights_figure,
          "pages/quantization.py", N_("Quantization: bytes, speed and quality of every variant, measured")),
)


def go(delta: int) -> None:
    page = app_state().page
    page.story_at = min(max(page.story_at + delta, 0), len(STAGES) - 1)


def jumped() -> None:
    app_state().page.story_at = st.session_state[STORY_STAGE]


def navigation() -> int:
    """← Previous, a picker to jump to any stage, Next →, and the progress under them; the stage
    shown. The picker has the row's room: the longest stage's name is whole in it at 1280 px in
    presentation mode's 22 px type."""
    at = min(max(int(app_state().page.story_at), 0), len(STAGES) - 1)
    st.session_state[STORY_STAGE] = at  # the picker follows the buttons and the keys
    back, jump, forward = st.columns([1.3, 5.4, 1.3], vertical_alignment="bottom")
    back.button(_("← Previous"), key=STORY_PREVIOUS, on_click=go, args=(-1,), disabled=at == 0,
                width="stretch", help=_("Or ← / PageUp"))
    forward.button(_("Next →"), key=STORY_NEXT, on_click=go, args=(1,),
                   disabled=at == len(STAGES) - 1, width="stretch", type="primary",
                   help=_("Or → / PageDown"))
    jump.selectbox(_("Jump to a stage"), range(len(STAGES)), key=STORY_STAGE, on_change=jumped,
                   format_func=lambda i: f"{i + 1}. {_(STAGES[i].title)}",
                   label_visibility="collapsed")
    # the stage's number comes first in every language: KEYS reads it
    st.progress((at + 1) / len(STAGES),
                text=_("Stage {n} of {total}").format(n=at + 1, total=len(STAGES)))
    return at


# One keydown listener on the app's document, added once per browser tab whatever the number of
# reruns (st.html runs the script in the page itself, not in an iframe); it acts only while this
# page's buttons exist, and never while the visitor types in a field or moves a slider. A key (a
# clicker) also brings the new stage's figure into view once the stage is drawn: the figures start
# below the text, under the screen's edge on a projector; a mouse click on the buttons leaves the
# page where it is, so that the next click finds them.
KEYS = """
<script>
if (!window.__storyKeys) {
  window.__storyKeys = true;
  const stageNow = () => {
    const progress = document.querySelector('[data-testid="stProgress"]');
    const found = /\\d+/.exec(progress ? progress.textContent : "");  // the stage: the first number
    return found ? Number(found[0]) : null;
  };
  const showFigure = (target) => {
    const until = Date.now() + 30000;
    const tick = () => {
      const idle = document.querySelector('[data-testid="stApp"][data-test-script-state="notRunning"]');
      const figure = document.querySelector(".st-key-FIGURE");
      if (idle && figure && stageNow() === target) {
        figure.scrollIntoView({block: "start"});
        setTimeout(() => figure.isConnected && figure.scrollIntoView({block: "start"}), 400);
      } else if (Date.now() < until) setTimeout(tick, 100);
    };
    tick();
  };
  document.addEventListener("keydown", (event) => {
    if (event.altKey || event.ctrlKey || event.metaKey || event.shiftKey) return;
    const keys = {ArrowRight: "NEXT", PageDown: "NEXT", ArrowLeft: "PREVIOUS", PageUp: "PREVIOUS"};
    const which = keys[event.key];
    if (!which) return;
    const target = event.target;
    if (target && (target.isContentEditable ||
        ["INPUT", "TEXTAREA", "SELECT"].includes(target.tagName) ||
        (target.closest && target.closest('[role="slider"], [role="listbox"]')))) return;
    const button = document.querySelector(".st-key-" + which + " button");
    if (!button) return;
    event.preventDefault();
    const at = stageNow();
    if (!button.disabled) button.click();
    if (at !== null) showFigure(button.disabled ? at : at + (which === "NEXT" ? 1 : -1));
  });
}
</script>
""".replace("NEXT", STORY_NEXT).replace("PREVIOUS", STORY_PREVIOUS).replace("FIGURE", STORY_FIGURE)


def keyboard() -> None:
    st.html(KEYS, unsafe_allow_javascript=True)


def page() -> None:
    st.title(_("Inference, step by step"))
    trace = require_trace()
    prompt = " ".join(trace.prompt.split())
    shown = wording.isolated(plain(prompt[:80]) + ("…" if len(prompt) > 80 else ""))
    st.caption(_("Your run: “{prompt}” — {prompt_tokens} prompt tokens, {generated} generated. "
                 "Every figure and number below comes from it.").format(
        prompt=shown, prompt_tokens=len(trace.prompt_token_ids), generated=len(trace.steps)))
    at = navigation()
    stage = STAGES[at]
    st.header(_(stage.title))
    st.markdown(stage.intro(trace))
    fact = memo("story_notice", (trace, at, language()),  # once per trace, stage and language
                lambda: stage.notice(trace))
    with st.container(key=STORY_FIGURE):  # what a clicker's key scrolls to (KEYS)
        what_to_notice(fact.text)
        stage.figure(trace, fact)
    st.page_link(stage.page, label=_(stage.link), icon=":material/open_in_new:")
    keyboard()


page()
