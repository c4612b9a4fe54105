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
from ui.common import no_trace_notice, show_chart
from ui.sections.tokens_chinese import chinese_cost
from ui.state import current_trace, loaded_model
from ui.tables import show_table
from ui.text import code_span, plain

SENTENCES = json.loads((Path(__file__).parents[1] / "assets" / "multilingual.json").read_text())


def last_run(trace: Trace | None) -> None:
    if trace is None:
        no_trace_notice("Your run's tokens will show here; meanwhile, try any text below.")
        return
    st.subheader("The last run")
    st.markdown(token_chips_html(trace), unsafe_allow_html=True)
    st.caption(f"{len(trace.prompt_token_ids)} prompt tokens (special tokens of the chat "
               f"template in purple) and {len(trace.steps)} generated tokens (orange).")


def text_to_tokens(tok: Any) -> None:
    st.subheader("Text → tokens")
    text = st.text_area("Text", "Tokenization isn't magic: unhappiness, 東京, 😀 and naïve café.",
                        key="tok_text", max_chars=5000)
    tokens = tokenize(tok, text)
    st.markdown(chips_html(tokens), unsafe_allow_html=True)
    st.caption(WHITESPACE_NOTE)
    cols = st.columns(3)
    cols[0].metric("Tokens", len(tokens))
    cols[1].metric("Characters", len(text))
    cols[2].metric("Characters per token", f"{len(text) / max(len(tokens), 1):.2f}",
                   help="characters ÷ tokens")
    if join_tokens(tokens) == text:
        st.caption("✓ The chips' bytes, joined, decode back to exactly this text.")
    else:
        st.warning("The tokenizer normalizes this text: the chips do not decode back to it "
                   "exactly.")
    split = [t for t in tokens if not t.special and splits_character(t.raw)]
    if split:
        st.caption(f"Chips like {plain(piece_text(split[0].piece).strip())} (dashed) hold UTF-8 bytes "
                   "of a character split across tokens: this tokenizer works on bytes, and a "
                   "character it saw rarely is cut into pieces of 1–3 of its bytes that only "
                   "together decode to the character. Hover a chip to see which character.")


def how_bpe_built_a_word(tok: Any) -> None:
    st.subheader("How BPE built a word")
    word = st.text_input("Word", " unhappiness", max_chars=40, key="bpe_word",
                         help="A leading space matters: most words follow one, and it is part of "
                              "the word's first piece (·).")
    for pre in pre_tokens(tok, word)[:4]:
        steps = bpe_steps(tok, pre)
        at = st.select_slider(f"Merge step for “{plain(shown_piece(pre))}”", range(len(steps)),
                              value=len(steps) - 1, key=f"bpe-{pre}")
        st.markdown(" ".join(code_span(shown_piece(p)) for p in steps[at].pieces))
        show_table(merge_table(steps, at), hide_index=True, width="stretch",
                     height=table_height(len(steps)))
    st.caption("Start from single bytes; repeatedly merge the adjacent pair that comes first in the "
               "tokenizer's own merge list (lowest rank). The last row equals the tokenizer's "
               "output; the highlighted row is the step on the slider.")


def same_sentence_many_languages(lm: LoadedModel) -> None:
    st.subheader("Same sentence, many languages")
    tok, spec = lm.tokenizer, lm.spec
    own = st.text_input("Add your own sentence", key="own_sentence", max_chars=1000,
                        placeholder="Type a translation to compare…")
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
    show_chart(language_bars(list(frame.language), list(frame.tokens), list(frame["× English"])),
               name="tokens per language")
    show_table(frame, hide_index=True, width="stretch")
    st.caption(f"Cost on {plain(spec.name)}: KV cache = 2 · {spec.layers} layers · {spec.kv_heads} "
               f"KV heads · {spec.head_dim} head_dim · {spec.dtype_bytes} bytes · tokens = "
               f"{spec.kv_bytes_per_token:,} B per token; prefill FLOPs ≈ 2 · "
               f"{spec.param_count / 1e6:.0f} M parameters · tokens. Languages the tokenizer saw "
               "less of are cut into more pieces: more memory, more compute, slower answers. "
               f"{SENTENCES['about']}")


def page() -> None:
    st.title("Tokens")
    st.caption("A model reads integers, not letters. Byte-pair encoding (BPE) cuts text into "
               "pieces from its vocabulary; each piece has an id. Hover a chip for its id and raw "
               "bytes.")
    last_run(current_trace())
    lm = loaded_model()
    if lm is None:
        st.info("Load a model in the sidebar to tokenize your own text.")
        st.stop()
    text_to_tokens(lm.tokenizer)
    how_bpe_built_a_word(lm.tokenizer)
    chinese_cost(lm)
    same_sentence_many_languages(lm)


page()
