"""Tokens: the article's point, measured — a language the tokenizer saw less of costs more tokens
for the same sentence, hence more KV cache and slower answers. The same two sentences of the
article in 繁體中文, 简体中文 and English, tokenized by the loaded model's own tokenizer."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from charts.embeddings import language_bars
from charts.formatting import size
from engine import LoadedModel
from engine.lens.tokens import article_sentences, sentence_costs
from i18n import _
from ui.common import show_chart
from ui.tables import show_table
from ui.text import plain

FORMS = (("zh-Hant", "繁體中文"), ("zh-Hans", "简体中文"), ("en", "English"))


def chinese_cost(lm: LoadedModel) -> None:
    st.subheader(_("The same sentence in Chinese and in English"))
    spec, article = lm.spec, article_sentences()  # `python -m engine tokens` prints the same
    costs = dict(zip(article, sentence_costs(lm.tokenizer, spec, list(article.values()))))
    english = costs["en"]
    rows = [{_("form"): name, _("characters"): costs[form].characters, _("tokens"): costs[form].tokens,
             _("tokens per character"): round(costs[form].tokens_per_char, 2),
             _("× English tokens"): round(costs[form].tokens / english.tokens, 2),
             _("KV cache"): size(costs[form].kv_bytes), _("sentence"): article[form]}
            for form, name in FORMS]
    show_chart(language_bars([name for _form, name in FORMS], [costs[f].tokens for f, _n in FORMS],
                             [costs[f].tokens / english.tokens for f, _n in FORMS]),
               name="tokens Chinese English")
    show_table(pd.DataFrame(rows), hide_index=True, width="stretch")
    hant = costs["zh-Hant"]
    st.markdown(_(
        "On {model}, the article's sentence takes **{hant} tokens in Traditional Chinese, {hans} in "
        "Simplified and {en} in English** ({per_char} tokens per character in Traditional, "
        "{en_per_char} in English). A language the tokenizer saw "
        "less of costs more tokens for the same meaning: the prompt's prefill does {ratio}× the "
        "work, its KV cache holds {kv} instead of {kv_en} (KV cache = 2 · {layers} layers · "
        "{kv_heads} KV heads · {head_dim} head_dim · {dtype_bytes} bytes · tokens), and an answer "
        "in that language takes {ratio}× the decode steps, one token each — a slower answer for "
        "the same words.").format(
            model=plain(spec.name), hant=hant.tokens, hans=costs["zh-Hans"].tokens, en=english.tokens,
            per_char=f"{hant.tokens_per_char:.2f}", en_per_char=f"{english.tokens_per_char:.2f}",
            ratio=f"{hant.tokens / english.tokens:.1f}",
            kv=size(hant.kv_bytes), kv_en=size(english.kv_bytes), layers=spec.layers,
            kv_heads=spec.kv_heads, head_dim=spec.head_dim, dtype_bytes=spec.dtype_bytes))
