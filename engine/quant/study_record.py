"""The quantization study as a plain, versioned record: JSON in and out, no pickle.

`study_from_dict` checks everything it reads (types, ranges, lengths, the variant names) and
raises TraceFormatError in one line, as engine/records does for traces and experiments: a record
comes back from a session store or a downloaded file, which a visitor may have edited.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import fields
from typing import Any

from ..errors import TraceFormatError
from . import VARIANT_NAMES
from .gguf_grid import GridCheck
from .study import (
    MAX_NEW_TOKENS,
    MAX_PROMPTS,
    MAX_VARIANTS,
    STUDY_VERSION,
    Answer,
    QuantStudy,
    Speed,
    VariantResult,
)
from .variants import WeightReport


def study_to_dict(study: QuantStudy) -> dict[str, Any]:
    return {
        "version": study.version, "model": study.model, "dtype": study.dtype,
        "device": study.device, "text": study.text, "text_tokens": study.text_tokens,
        "prompts": list(study.prompts), "new_tokens": study.new_tokens,
        "bandwidth_gb_s": study.bandwidth_gb_s, "stopped": study.stopped,
        "created_at": study.created_at,
        "grid_layers": None if study.grid_layers is None else list(study.grid_layers),
        "grid": [g.to_dict() for g in study.grid],
        "embedding_grid": [g.to_dict() for g in study.embedding_grid],
        "variants": [{
            "report": {f.name: getattr(v.report, f.name) for f in fields(WeightReport)},
            "perplexity": v.perplexity, "perplexity_transformers": v.perplexity_transformers,
            "kl_mean": v.kl_mean, "top1_agreement": v.top1_agreement,
            "answers": [{"tokens": list(a.tokens), "pieces": list(a.pieces)} for a in v.answers],
            "speed": dataclasses.asdict(v.speed), "seconds": v.seconds,
        } for v in study.variants],
    }


def _bad(what: str) -> TraceFormatError:
    return TraceFormatError(f"quantization study: {what}")


def _num(value: Any, what: str, positive: bool = False, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value) and value >= 0 and (not positive or value > 0))
    if not ok:
        raise _bad(f"{what} must be a finite number {'> 0' if positive else '≥ 0'}")
    return float(value)


def _int(value: Any, what: str, low: int = 0, high: int = 1 << 50) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise _bad(f"{what} must be a whole number from {low} to {high}")
    return value


def _text(value: Any, what: str, limit: int = 2000) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise _bad(f"{what} must be text of at most {limit} characters")
    return value


def _list(value: Any, what: str, limit: int, low: int = 0) -> list[Any]:
    if not isinstance(value, list) or not low <= len(value) <= limit:
        raise _bad(f"{what} must be a list of {low} to {limit} entries")
    return value


def _share(value: Any, what: str) -> float | None:
    share = _num(value, what, optional=True)
    if share is not None and share > 1:
        raise _bad(f"{what} must be a share from 0 to 1")
    return share


def _report(d: Any) -> WeightReport:
    names = {f.name for f in fields(WeightReport)}
    # records from before the K-quant variants have no formula_code_bytes (0 then)
    if not isinstance(d, dict) or set(d) not in (names, names - {"formula_code_bytes"}):
        raise _bad("a weight report must hold exactly the WeightReport fields")
    text_fields = {"variant", "storage", "embedding_storage", "scope"}
    values = {k: _text(v, k) if k in text_fields
              else _num(v, k) if k == "embedding_bits" else _int(v, k) for k, v in d.items()}
    if values["variant"] not in VARIANT_NAMES:
        raise _bad(f"unknown weights variant {values['variant'][:40]!r}")
    if values["quantized_params"] < 1:  # bits per weight divides by it
        raise _bad("a weight report must count at least one quantized parameter")
    return WeightReport(**values)


def _grid_check(d: Any) -> GridCheck:
    if not isinstance(d, dict):
        raise _bad("a grid check must be an object")
    return GridCheck(_text(d.get("grid"), "grid", 100), _int(d.get("bits"), "grid bits", 1, 32),
                     _int(d.get("group"), "grid group", 1), bool(d.get("zero_point")),
                     _int(d.get("tensors"), "grid tensors"), _int(d.get("weights"), "grid weights"),
                     _num(d.get("max_abs_error"), "grid error"),
                     _num(d.get("max_abs_weight"), "grid max weight"),
                     _num(d.get("mean_step"), "grid step"),
                     _num(d.get("exact_fraction"), "grid exact share"))


def _variant(d: Any, prompts: int, new_tokens: int) -> VariantResult:
    if not isinstance(d, dict):
        raise _bad("a variant must be an object")
    answers = []
    for a in _list(d.get("answers"), "answers", prompts, prompts):
        tokens = [_int(t, "token id", 0, 1 << 31) for t in _list(a.get("tokens"), "answer tokens",
                                                                  new_tokens, 1)]
        pieces = [_text(p, "piece", 400) for p in _list(a.get("pieces"), "answer pieces",
                                                        new_tokens, len(tokens))]
        answers.append(Answer(tuple(tokens), tuple(pieces)))
    s = d.get("speed")
    if not isinstance(s, dict):
        raise _bad("speed must be an object")
    speed = Speed(_text(s.get("decoder"), "decoder", 40), _text(s.get("note"), "note"),
                  _num(s.get("ttft_ms"), "TTFT", positive=True),
                  _num(s.get("itl_ms"), "ITL", positive=True), _int(s.get("steps"), "steps", 1),
                  _int(s.get("bytes_per_step"), "bytes per step", 1),
                  _share(s.get("others_share"), "other programs' CPU share"))
    top1 = _num(d.get("top1_agreement"), "top-1 agreement")
    if top1 > 1:
        raise _bad("top-1 agreement must be a share from 0 to 1")
    return VariantResult(_report(d.get("report")), _num(d.get("perplexity"), "perplexity", True),
                         _num(d.get("perplexity_transformers"), "perplexity", True),
                         _num(d.get("kl_mean"), "KL"), top1, tuple(answers), speed,
                         _num(d.get("seconds"), "seconds"))


def study_from_dict(data: Any) -> QuantStudy:
    """Rebuild and check a study record; any damage raises TraceFormatError in one line."""
    if not isinstance(data, dict):
        raise _bad("the record must be an object")
    if data.get("version") != STUDY_VERSION:
        raise _bad(f"unknown version {str(data.get('version'))[:20]} (this app reads "
                   f"{STUDY_VERSION})")
    try:
        prompts = tuple(_text(p, "prompt") for p in _list(data.get("prompts"), "prompts",
                                                          MAX_PROMPTS, 1))
        new_tokens = _int(data.get("new_tokens"), "new tokens", 2, MAX_NEW_TOKENS)
        layers = data.get("grid_layers")
        variants = tuple(_variant(v, len(prompts), new_tokens)
                         for v in _list(data.get("variants"), "variants", MAX_VARIANTS, 1))
        if variants[0].name != "fp32" or len({v.name for v in variants}) != len(variants):
            raise _bad("variants must be distinct, fp32 (the reference) first")
        return QuantStudy(
            _text(data.get("model"), "model", 300), _text(data.get("dtype"), "dtype", 20),
            _text(data.get("device"), "device", 300), _text(data.get("text"), "text name", 300),
            _int(data.get("text_tokens"), "text tokens", 2), prompts, new_tokens,
            _num(data.get("bandwidth_gb_s"), "bandwidth", positive=True, optional=True),
            tuple(_grid_check(g) for g in _list(data.get("grid"), "grid", 16)),
            tuple(_grid_check(g) for g in _list(data.get("embedding_grid"), "grid", 16)),
            None if layers is None else tuple(_int(i, "grid layer", 0, 10_000)
                                              for i in _list(layers, "grid layers", 10_000, 1)),
            variants, bool(data.get("stopped")), _text(data.get("created_at", ""), "date", 40))
    except TraceFormatError:
        raise
    except (AttributeError, TypeError, ValueError, ArithmeticError) as err:
        raise _bad(f"damaged ({err})") from err


def study_to_json(study: QuantStudy) -> str:
    return json.dumps(study_to_dict(study), indent=1)


def study_from_json(text: str) -> QuantStudy:
    try:
        data = json.loads(text)
    except ValueError as err:
        raise _bad(f"not JSON ({err.msg} at line {err.lineno})") from err
    return study_from_dict(data)

