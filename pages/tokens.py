"""Tokens: from text to numbers — pieces, ids and bytes, BPE merges, and what languages cost."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from charts.embeddings import language_bars
from charts.tokens import (
    WHITESPACE_NOTE,
    chips_html,
    merge_table,
    piece_text,
    shown_piece,
    table_height,
    token_chips_html,
)
from engine import LoadedModel, Trace
from engine.lens.tokens import bpe_steps, join_tokens, pre_tokens, splits_character, text_cost, tokenize
from i18n import N_, _, chinese
from ui.common import no_trace_notice, show_chart
from ui.sections.tokens_chinese import chinese_cost
from ui.state import current_trace, loaded_model
from ui.tables import show_table
from ui.text import code_span, plain

SENTENCES = json.loads((Path(__file__).parents[1] / "assets" / "multilingual.json").read_text())
# The words of assets/multilingual.json the table shows, for the catalogs (`_` where shown).
SENTENCE_WORDS = (
    N_("One sentence, 'The weather is nice today, so we are going for a walk in the park.', "
       "translated by the Inference Explorer team for comparing tokenizer cost across languages "
       "and scripts."),
    N_("English"), N_("Spanish"), N_("German"), N_("French"), N_("Turkish"), N_("Swahili"),
    N_("Russian"), N_("Arabic"), N_("Hebrew"), N_("Hindi"), N_("Bengali"), N_("Chinese"),
    N_("Japanese"), N_("Korean"), N_("Amharic"), N_("yours"),
    N_("Latin"), N_("Cyrillic"), N_("Devanagari"), N_("Han"), N_("Kanji + kana"), N_("Hangul"),
    N_("Ge'ez"),
)


def last_run(trace: Trace | None) -> None:
    if trace is None:
        no_trace_notice(_("Your run's tokens will show here; meanwhile, try any text below."))
        return
    st.subheader(_("The last run"))
    st.markdown(token_chips_html(trace), unsafe_allow_html=True)
    st.caption(_("{prompt} prompt tokens (special tokens of the chat template in purple) and "
                 "{generated} generated tokens (orange).").format(
        prompt=len(trace.prompt_token_ids), generated=len(trace.steps)))


def text_to_tokens(tok: Any) -> None:
    st.subheader(_("Text → tokens"))
    text = st.text_area(_("Text"), "Tokenization isn't magic: unhappiness, 東京, 😀 and naïve café.",
                        key="tok_text", max_chars=5000)
    tokens = tokenize(tok, text)
    st.markdown(chips_html(tokens), unsafe_allow_html=True)
    st.caption(_(WHITESPACE_NOTE))
    cols = st.columns(3)
    cols[0].metric(_("Tokens"), len(tokens))
    cols[1].metric(_("Characters"), len(text))
    cols[2].metric(_("Characters per token"), f"{len(text) / max(len(tokens), 1):.2f}",
                   help=_("characters ÷ tokens"))
    if join_tokens(tokens) == text:
        st.caption(_("✓ The chips' bytes, joined, decode back to exactly this text."))
    else:
        st.warning(_("The tokenizer normalizes this text: the chips do not decode back to it "
                     "exactly."))
    split = [t for t in tokens if not t.special and splits_character(t.raw)]
    if split:
        st.caption(_("Chips like {piece} (dashed) hold UTF-8 bytes of a character split across "
                     "tokens: this tokenizer works on bytes, and a character it saw rarely is cut "
                     "into pieces of 1–3 of its bytes that only together decode to the character. "
                     "Hover a chip to see which character.").format(
            piece=plain(piece_text(split[0].piece).strip())))


def how_bpe_built_a_word(tok: Any) -> None:
    st.subheader(_("How BPE built a word"))
    word = st.text_input(_("Word"), " unhappiness", max_chars=40, key="bpe_word",
                         help=_("A leading space matters: most words follow one, and it is part "
                                "of the word's first piece (·)."))
    for pre in pre_tokens(tok, word)[:4]:
        steps = bpe_steps(tok, pre)
        at = st.select_slider(_("Merge step for “{piece}”").format(piece=plain(shown_piece(pre))),
                              range(len(steps)),
                              value=len(steps) - 1, key=f"bpe-{pre}")
        st.markdown(" ".join(code_span(shown_piece(p)) for p in steps[at].pieces))
        show_table(merge_table(steps, at), hide_index=True, width="stretch",
                     height=table_height(len(steps)))
    st.caption(_("Start from single bytes; repeatedly merge the adjacent pair that comes first in "
                 "the tokenizer's own merge list (lowest rank). The last row equals the "
                 "tokenizer's output; the highlighted row is the step on the slider."))


def same_sentence_many_languages(lm: LoadedModel) -> None:
    st.subheader(_("Same sentence, many languages"))
    tok, spec = lm.tokenizer, lm.spec
    own = st.text_input(_("Add your own sentence"), key="own_sentence", max_chars=1000,
                        placeholder=_("Type a translation to compare…"))
    rows = [(s["language"], s["script"], s["text"]) for s in SENTENCES["sentences"]]
    if own.strip():
        rows.append(("yours", "–", own.strip()))
    english = len(tok(rows[0][2]).input_ids)
    table = []
    for language, script, sentence in rows:
        n = len(tok(sentence).input_ids)
        cost = text_cost(spec, sentence, n)
        table.append({"language": language, "script": script, "tokens": n,
                      "characters": cost.characters, "tokens/char": round(cost.tokens_per_char, 3),
                      "× English": round(n / english, 2), "KV cache (bytes)": cost.kv_bytes,
                      "prefill GFLOPs": round(cost.prefill_flops / 1e9, 1), "sentence": sentence})
    frame = pd.DataFrame(table)
    frame["language"] = [_(name) for name in frame.language]  # the data's English, shown translated
    frame["script"] = [_(name) if name != "–" else name for name in frame.script]
    show_chart(language_bars(list(frame.language), list(frame.tokens), list(frame["× English"])),
               name="tokens per language")
    show_table(frame.rename(columns={
        "language": _("language"), "script": _("script"), "tokens": _("tokens"),
        "characters": _("characters"), "tokens/char": _("tokens/char"), "× English": _("× English"),
        "KV cache (bytes)": _("KV cache (bytes)"), "prefill GFLOPs": _("prefill GFLOPs"),
        "sentence": _("sentence")}), hide_index=True, width="stretch")
    st.caption(_("Cost on {model}: KV cache = 2 · {layers} layers · {kv_heads} KV heads · "
                 "{head_dim} head_dim · {dtype_bytes} bytes · tokens = {per_token} B per token; "
                 "prefill FLOPs ≈ 2 · {params} M parameters · tokens. Languages the tokenizer saw "
                 "less of are cut into more pieces: more memory, more compute, slower answers.")
               .format(model=plain(spec.name), layers=spec.layers, kv_heads=spec.kv_heads,
                       head_dim=spec.head_dim, dtype_bytes=spec.dtype_bytes,
                       per_token=f"{spec.kv_bytes_per_token:,}",
                       params=f"{spec.param_count / 1e6:.0f}")
               + ("" if chinese() else " ") + _(SENTENCES["about"]))  # Chinese: no space after 。


def page() -> None:
    st.title(_("Tokens"))
    st.caption(_("A model reads integers, not letters. Byte-pair encoding (BPE) cuts text into "
                 "pieces from its vocabulary; each piece has an id. Hover a chip for its id and "
                 "raw bytes."))
    last_run(current_trace())
    lm = loaded_model()
    if lm is None:
        st.info(_("Load a model in the sidebar to tokenize your own text."))
        st.stop()
    text_to_tokens(lm.tokenizer)
    how_bpe_built_a_word(lm.tokenizer)
    chinese_cost(lm)
    same_sentence_many_languages(lm)


page()
