"""`python -m engine tokens [TEXT ...]`: what the same sentence costs in each language on the
model — tokens, tokens per character, × the first text's tokens, KV-cache bytes (the formula) and
prefill FLOPs. Without TEXT: the article's opening sentences in 繁體中文, 简体中文 and English
(assets/multilingual.json), as the Tokens page shows them."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..errors import InputError
from .tokens import article_sentences, sentence_costs


def add_parser(sub: Any) -> argparse.ArgumentParser:
    parser = sub.add_parser("tokens", help="what the same sentence costs in each language: tokens, "
                                           "tokens per character, KV bytes (default: the article's "
                                           "sentences in 繁體, 简体 and English)")
    parser.add_argument("texts", nargs="*", metavar="TEXT")
    parser.add_argument("--json", action="store_true", help="machine-readable JSON")
    parser.add_argument("--model", default=None, help="hub id or local folder (default: "
                                                      "SmolLM2-135M)")
    return parser


def run(args: argparse.Namespace) -> int:
    from ..loader import load_model

    texts = dict(enumerate(args.texts)) if args.texts else article_sentences()
    if any(not text.strip() for text in texts.values()):
        raise InputError("a TEXT is empty")
    lm = load_model(args.model)
    costs = sentence_costs(lm.tokenizer, lm.spec, list(texts.values()))
    first = costs[0].tokens
    rows = [{"text": text, "label": str(label), "tokens": c.tokens, "characters": c.characters,
             "tokens_per_char": round(c.tokens_per_char, 4),
             "times_first": round(c.tokens / first, 4) if first else None,
             "kv_bytes": c.kv_bytes, "prefill_flops": c.prefill_flops}
            for (label, text), c in zip(texts.items(), costs)]
    if args.json:
        print(json.dumps({"model": lm.spec.name, "kv_bytes_per_token": lm.spec.kv_bytes_per_token,
                          "texts": rows}, ensure_ascii=False, indent=1))
        return 0
    print(f"{lm.spec.name}: KV cache = 2 · {lm.spec.layers} layers · {lm.spec.kv_heads} KV heads · "
          f"{lm.spec.head_dim} head_dim · {lm.spec.dtype_bytes} bytes · tokens")
    for row in rows:
        print(f"{row['label']:>8} {row['tokens']:5} tokens {row['characters']:5} chars "
              f"{row['tokens_per_char']:6.2f} tok/char {row['times_first']:5.2f}× "
              f"{row['kv_bytes']:>10,} B KV  {row['text']}")
    return 0
