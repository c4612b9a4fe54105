"""Finds English sentences in text a page shows in Chinese mode (AppTest elements, or the DOM's
text in a browser).

A sentence here is a run of four or more Latin words holding at least one English function word
("the", "of", "to", …), once the words the Chinese text keeps in English (the glossary's kept
terms, model and format names, units) are left out: "每個 token 的 KV cache" is Chinese, "the KV
cache grows with every token" is not. Data is not the app's words: the run's own text (prompt,
output, tokens, the chat template's system line) and code spans are removed first.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FUNCTION_WORDS = frozenset(
    "the a an of to and or is are was be been in on at for with from by as it its this that these "
    "those your you we our not no each every one which what when where how why than then there "
    "here has have had can will would should could may might do does did all any more most less "
    "into onto about over under after before between per only also same other".split())
_GLOSSARY = json.loads((ROOT / "assets" / "glossary.json").read_text())["terms"]
KEPT = frozenset(w.lower() for t in _GLOSSARY if t["zh-Hant"] == t["en"] or t["en"] in t["zh-Hant"]
                 for w in re.findall(r"[A-Za-z]+", t["en"])) | frozenset(
    "token tokens prefill decode kv cache ttft itl embedding embeddings attention batch batches head "
    "heads query key value logit logits softmax prompt prompts smollm smollm2 instruct gguf q4 q8 "
    "int8 int4 fp32 fp16 bf16 float32 float16 ms min mib kib gib tok s vllm llama cpp pytorch torch "
    "cpu gpu cuda top k p greedy bpe rope mlp ffn qkv gqa mha nat nats kl pca id ids utf json npz "
    "html svg png csv api cli url http https streamlit plotly hugging face hub chromium openmp "
    "simd avx native eager compiled roofline gemv gemm flops gflops tflops gb mb kb bytes".split())
WORD = re.compile(r"[A-Za-z][A-Za-z'’\-]*")
RUN = re.compile(r"[A-Za-z][A-Za-z'’\-]*(?:[ ,;:()\"“”/]+[A-Za-z][A-Za-z'’\-]*){3,}")
CODE = re.compile(r"<(script|style)\b.*?</\1>|`[^`]*`|<code>.*?</code>|<[^>]+>", re.S)


def english_sentences(text: str, data: Iterable[str] = ()) -> list[str]:
    """The English sentences in `text`, once `data` (strings that are the run's, not the app's)
    and code are taken out."""
    for item in sorted({d for d in data if d and len(d) > 3}, key=len, reverse=True):
        text = text.replace(item, " ")
    text = CODE.sub(" ", text).replace("\\", "")
    found = []
    for match in RUN.finditer(text):
        words = [w.lower().strip("'’-") for w in WORD.findall(match.group())]
        left = [w for w in words if w not in KEPT]
        if len(left) >= 3 and any(w in FUNCTION_WORDS for w in left):
            found.append(match.group())
    return found


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)


# plotly JSON: the words of a figure (not its data: x, y, text, customdata are the run's)
FIGURE_KEYS = ("title", "name", "hovertemplate", "annotations", "legendgrouptitle", "text")


def figure_words(spec: dict[str, Any]) -> Iterator[str]:
    layout = spec.get("layout", {})
    for key, value in layout.items():
        if key.startswith(("xaxis", "yaxis", "coloraxis", "legend")) or key in ("title", "annotations"):
            for sub in ("title", "annotations"):
                yield from _strings(value.get(sub) if isinstance(value, dict) else None)
            if key in ("title", "annotations"):
                yield from _strings(value)
    for trace in spec.get("data", []):
        for key in ("name", "hovertemplate"):
            yield from _strings(trace.get(key))
        bar = trace.get("colorbar") or (trace.get("marker") or {}).get("colorbar") or {}
        yield from _strings(bar.get("title"))


# AppTest: the protobuf fields of an element that hold the app's words
PROTO_FIELDS = ("body", "label", "help", "placeholder", "options", "caption", "text", "title",
                "message", "delta_description")


def element_words(node: Any) -> Iterator[str]:
    """The words of an AppTest element tree (widgets' values are the visitor's, not included)."""
    proto = getattr(node, "proto", None)
    if proto is not None:
        for field in PROTO_FIELDS:
            if hasattr(proto, field):
                try:
                    yield from _strings(list(getattr(proto, field)) if field == "options"
                                        else getattr(proto, field))
                except TypeError:
                    pass
        spec = getattr(proto, "spec", None)
        if isinstance(spec, str) and spec.startswith("{"):
            yield from figure_words(json.loads(spec))
        if type(node).__name__ == "Dataframe":
            try:
                yield from (str(c) for c in node.value.columns)
            except Exception:  # noqa: BLE001 — an element AppTest cannot read back
                pass
    for child in getattr(node, "children", {}).values() if isinstance(
            getattr(node, "children", None), dict) else []:
        yield from element_words(child)
