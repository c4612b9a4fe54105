"""A weights variant of a loaded model as a GGUF file llama.cpp and transformers can run.

Which GGML type each tensor gets, by variant (the same choice engine/quant/variants.py makes for
the variant the engine runs, so the file holds exactly the weights `--weights VARIANT` decodes):
- decoder Linear weights (attn_q / attn_k / attn_v / attn_output, ffn_gate / ffn_up / ffn_down):
  fp32 → F32, fp16 → F16, bf16 → BF16, q8_0 / q4_0 / q4_1 → Q8_0 / Q4_0 / Q4_1, their block
  bytes from engine/quant's GGML quantizers (`formats.quantize`, `ggml_blocks`: gguf-py's
  bytes exactly); K-quant variants as engine/quant/kquants.py's `tensor_types` says;
- token embedding (and an untied output head): the variant's float type, or Q8_0 for every
  integer variant;
- norms (and qwen2's q / k / v biases): F32.
Our own formats (int8 per row, q3, q2) and the AWQ variants have no GGML type and are refused.

attn_q / attn_k rows are permuted into llama.cpp's order (`names.permute`) for the llama
architecture; quantization is per row, so a row's blocks move with it and permuting the quantized
rows gives the bytes of quantizing the permuted weight.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import InputError
from ..loader import LoadedModel, default_gguf_path, is_gguf_path
from ..outfile import OutFile
from .header import read_header
from .names import PERMUTED, gguf_name, heads_for, permute
from .table import GGUFTable
from .writer import OutTensor, settings_from_config, vocab_from_tokenizer, write_gguf

FLOAT_TYPES = {"fp32": "F32", "fp16": "F16", "bf16": "BF16"}
GGML_VARIANTS = {"q8_0": "Q8_0", "q4_0": "Q4_0", "q4_1": "Q4_1"}
KQUANT_VARIANTS = ("q4_k", "q6_k", "q4_k_m")  # once engine/quant/kquants.py implements them
EXPORT_ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2"}  # model_type → file's


def exportable() -> tuple[str, ...]:
    """The variant names `export --weights` takes: the float ones and those with GGML blocks."""
    from ..quant import VARIANT_NAMES

    kq = tuple(v for v in KQUANT_VARIANTS if v in VARIANT_NAMES)
    return (*FLOAT_TYPES, *GGML_VARIANTS, *kq)


@dataclass(frozen=True, slots=True)
class Exported:
    """What was written: the file's table, read back from the file by the checked reader."""

    table: GGUFTable
    variant: str
    tensors: tuple[OutTensor, ...]  # as handed to the writer (the tests compare the file with it)


def tensor_types(model: Any, variant: str) -> dict[str, str]:
    """Hugging Face parameter name → GGML type name, for every tensor that goes in the file."""
    if variant in KQUANT_VARIANTS:
        from ..quant import kmix

        kq = kmix.tensor_types(variant, model)  # weight name → type, Linears and embedding
    else:
        kq = {}
    linear = FLOAT_TYPES.get(variant) or GGML_VARIANTS.get(variant)
    if linear is None and not kq:
        raise InputError(f"{variant!r} has no GGML type to export: use one of "
                         f"{', '.join(exportable())}")
    embed = FLOAT_TYPES.get(variant, "Q8_0")
    types = {}
    for name, p in model.named_parameters(remove_duplicate=True):
        if name in kq:
            types[name] = kq[name]
        elif p.dim() == 1:
            types[name] = "F32"
        elif ".layers." not in name:  # the embedding, an untied head
            types[name] = embed
        elif linear is not None:
            types[name] = linear
        else:
            raise InputError(f"{variant} gives no GGML type for {name}")
    return types


def gguf_tensors(model: Any, variant: str, arch: str) -> list[OutTensor]:
    """Every parameter as a GGUF tensor in its variant's type (tied head: once, as token_embd)."""
    cfg = model.config
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads or cfg.num_attention_heads
    out = []
    for hf, ggml in tensor_types(model, variant).items():
        try:
            name = gguf_name(hf)
        except KeyError:
            raise InputError(f"{hf} has no llama.cpp tensor name: not a plain {arch} "
                             "model") from None
        w = model.get_parameter(hf).detach().float().cpu()  # (rows, cols) or (n,)
        n_head = heads_for(name, heads, kv_heads) if arch in PERMUTED else None
        if n_head is not None:
            w = permute(w, n_head)
        out.append(OutTensor(name, _encode(w, ggml), ggml))
    return out


def _encode(w: torch.Tensor, ggml: str) -> np.ndarray:
    """float32 w → the array GGUFWriter stores: values for F32 / F16, uint8 blocks otherwise."""
    if ggml == "F32":
        return w.numpy()
    if ggml == "F16":
        return w.half().numpy()
    if ggml == "BF16":
        return w.bfloat16().view(torch.uint8).numpy()  # (rows, 2 · cols) little-endian
    if ggml in GGML_VARIANTS.values():
        return block_bytes(w, ggml).numpy()
    from ..quant import kquants

    return kquants.quantize_blocks(w, ggml).numpy()


@torch.no_grad()
def block_bytes(w: torch.Tensor, ggml: str) -> torch.Tensor:
    """(rows, cols) float32 → (rows, cols / 32 · block bytes) uint8: GGML's Q8_0 / Q4_0 / Q4_1
    blocks of `w`, byte for byte what engine/quant's `ggml_blocks(quantize(w, fmt))` returns
    (tests/test_gguf_export.py compares them, and gguf-py's quantizer). The same codes, from the
    same `choose_codes`, laid straight into blocks: `quantize` packs them two to a byte in its
    own order and `ggml_blocks` unpacks them again, 3× the time on the whole model."""
    from ..quant.formats import choose_codes
    from ..quant.ggml_blocks import GGML_BLOCK
    from ..quant.scheme import FORMATS

    fmt = FORMATS[ggml.lower()]
    rows, cols = w.shape
    if cols % GGML_BLOCK:
        raise InputError(f"cannot store a {rows} × {cols} weight as {ggml}: rows of {cols} are "
                         f"not whole blocks of {GGML_BLOCK}")
    x = w.reshape(rows, cols // GGML_BLOCK, GGML_BLOCK)  # (rows, G, 32)
    codes, d, m = choose_codes(x, fmt)  # (rows, G, 32) in [0, 2^bits); (rows, G, 1) float32
    parts = [_half_bytes(d, ggml)]
    if m is not None:
        parts.append(_half_bytes(m, ggml))
    if fmt.bits == 8:  # stored offset by 128; GGML keeps the signed int8
        parts.append((codes - 128).to(torch.int8).view(torch.uint8))  # (rows, G, 32)
    else:  # byte j: weight j in the low nibble, weight j + 16 in the high one
        c = codes.to(torch.uint8)
        parts.append(c[..., :16] | (c[..., 16:] << 4))  # (rows, G, 16)
    return torch.cat(parts, dim=-1).reshape(rows, -1)


def _half_bytes(v: torch.Tensor, ggml: str) -> torch.Tensor:
    """(rows, G, 1) float32 → (rows, G, 2) the float16's little-endian bytes."""
    h = v.to(torch.float16)
    if not torch.isfinite(h).all():
        raise InputError(f"cannot store this model's weights as {ggml}: a block's scale does "
                         "not fit a float16 (weights beyond ±65504)")
    return h.view(torch.uint8)


def _main_type(variant: str) -> str:
    """llama.cpp's general.file_type names the type of the bulk of the weights."""
    if variant == "q4_k_m":
        return "Q4_K"
    return FLOAT_TYPES.get(variant) or GGML_VARIANTS.get(variant) or variant.upper()


def source_gguf(lm: LoadedModel) -> Path | None:
    """The GGUF a loaded model came from (the default model's shipped file, or a .gguf path)."""
    if lm.source in (None, "", "default"):
        return default_gguf_path()
    return Path(lm.source).expanduser() if is_gguf_path(lm.source) else None


def export_gguf(lm: LoadedModel, variant: str, out: OutFile) -> Exported:
    """Write `lm` with its weights in `variant` to `out` (all or nothing), and read it back."""
    config = lm.model.config
    arch = EXPORT_ARCH.get(config.model_type)
    if arch is None:
        raise InputError(f"export writes llama-family models ({', '.join(EXPORT_ARCH)}); this "
                         f"one is {config.model_type!r}")
    source = source_gguf(lm)
    pre = "default"
    if source is not None:
        pre = str(read_header(source).get("tokenizer.ggml.pre", "default"))
    settings = settings_from_config(config, arch, lm.spec.name)
    vocab = vocab_from_tokenizer(lm.tokenizer, settings.vocab, pre)
    tensors = gguf_tensors(lm.model, variant, arch)
    out.check()
    handle, temporary = tempfile.mkstemp(dir=out.path.parent, prefix=f".{out.path.name}.",
                                         suffix=".part")
    os.close(handle)
    try:
        write_gguf(Path(temporary), settings, vocab, tensors, _main_type(variant))
        table = read_header(temporary).table
        out.place(Path(temporary))
    finally:
        Path(temporary).unlink(missing_ok=True)
    return Exported(GGUFTable(str(out.path), table.file_bytes, table.version, table.architecture,
                              table.name, table.tensors), variant, tuple(tensors))
