"""Open a llama-family GGUF as a torch model built from the file's own tensors.

The loader calls `open_gguf` for a `--model PATH.gguf`. Order of work, so that a bad file is
refused before it costs memory:
1. `header.read_header` checks every count and size against the file (nothing large allocated);
2. the architecture must be llama-family (llama, mistral, qwen2; an encoder such as BERT is
   named as one) and its settings whole and consistent (heads divide the width, …);
3. every tensor the settings imply must be in the table with exactly the implied shape (so a
   tensor disagreeing with the head count is caught here), and nothing else may be;
4. the float32 model must fit in the free memory;
5. only then: each tensor is dequantized once (gguf-py's `gguf.quants.dequantize`), the q / k rows
   of a llama file put back in Hugging Face's order (`names.unpermute`), and loaded into a model
   made on the meta device — a parameter the file did not fill stays on meta and is refused, so
   a missing tensor can never run as random initial values.
The tokenizer is transformers' own conversion of the file's vocabulary (the one
`AutoTokenizer.from_pretrained(..., gguf_file=...)` makes, without that path re-reading every
tensor), so a GGUF opened here tokenizes as the default model, which transformers converts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from .fit import check_fit, need
from .header import GGUFError, Header, read_header
from .mapped import mapped_model, rope_frequencies, stored_problem
from .names import (
    ARCHITECTURES,
    PERMUTED,
    ROPE_FREQS,
    Shapes,
    expected_tensors,
    heads_for,
    hf_name,
    unpermute,
)
from .table import GGUFTable, GGUFTensor

# architectures of encoder models llama.cpp writes (embeddings / rerankers): named as such
ENCODERS = frozenset({"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "jina-bert-v3",
                      "neo-bert", "modern-bert", "t5encoder", "t5", "roberta", "xlm-roberta",
                      "eurobert", "gte", "clip"})
MAX_SETTING = 1 << 31  # any single size in the metadata (the shapes are checked against the file)
CPU = torch.device("cpu")
DEFAULT_CONTEXT = 4096  # positions the KV cache is sized for when asking whether a model fits


# Settings a trained model can have (a file outside them is damaged or crafted): RMS norms'
# epsilon is 1e-6 or 1e-5 in today's files, RoPE's base 10,000 (Llama 2) to 10^6–10^7 (Qwen,
# long-context models).
EPS_RANGE = (1e-12, 1e-2)
THETA_RANGE = (1.0, 1e9)


def open_gguf(path: Path, say: Callable[[str], None] = lambda _m: None,
              device: torch.device = CPU, dtype: torch.dtype = torch.float32,
              context: int = DEFAULT_CONTEXT, on_blocks: bool = True
              ) -> tuple[Any, Any, GGUFTable]:
    """(model, tokenizer, tensor table) of the llama-family GGUF at `path`. On the CPU the model
    runs on the file's mapped blocks (engine/gguf/mapped.py); on a GPU, or asked for a float copy
    (`on_blocks=False`: to quantize the weights again), each tensor is dequantized to `dtype` on
    the device, one at a time. Either way it must fit first: the weights, the KV cache at
    `context` positions and the work buffers (engine/gguf/fit.py)."""
    header = read_header(path)
    arch, shapes, config = check_model(header)
    table = header.table
    say(f"Opening {path.name}: {arch}, {shapes.layers} layers, "
        f"{len(table.tensors)} tensors ({', '.join(table.type_counts())})")
    on_blocks = on_blocks and device.type == "cpu"
    if on_blocks:
        problem = stored_problem(header)
        if problem:
            raise _fail(header, problem)
    weights = table.tensor_bytes if on_blocks else table.n_elements * dtype.itemsize
    check_fit(path.name, need(weights, shapes.layers, shapes.kv_heads, shapes.head_dim,
                              min(context, config.max_position_embeddings)))
    if not isinstance(header.get("tokenizer.ggml.tokens"), tuple):
        raise _fail(header, "it has no vocabulary (tokenizer.ggml.tokens), so no tokenizer")
    tokenizer = _tokenizer(path, header)
    if on_blocks:
        return mapped_model(header, arch, shapes, config), tokenizer, table
    return _model(header, arch, shapes, config, device, dtype), tokenizer, table


def _fail(header: Header, what: str) -> GGUFError:
    return GGUFError(f"{Path(header.table.path).name}: {what}")


def check_model(header: Header) -> tuple[str, Shapes, Any]:
    """(architecture, shapes, transformers config) once the file is known to hold a whole
    llama-family model; GGUFError naming the first thing that is not so."""
    arch = header.table.architecture
    causal = header.get(f"{arch}.attention.causal", True)
    if arch in ENCODERS or f"{arch}.pooling_type" in header.metadata or causal is False:
        raise _fail(header, f"a {arch!r} model is an encoder, not a decoder-only language model")
    if arch not in ARCHITECTURES:
        raise _fail(header, f"architecture {arch!r} is not one this engine opens "
                            f"({', '.join(ARCHITECTURES)})")
    scaling = header.get(f"{arch}.rope.scaling.type", "none")
    if not isinstance(scaling, str) or scaling != "none":  # (a value of any type may come)
        raise _fail(header, f"RoPE scaling {_short(scaling)} is not supported (plain RoPE only)")
    experts = header.get(f"{arch}.expert_count", 0)
    if not isinstance(experts, int) or experts:
        raise _fail(header, "a mixture-of-experts model is not supported")
    need = _settings_reader(header, arch)
    hidden, heads = need("embedding_length"), need("attention.head_count")
    kv_heads = need("attention.head_count_kv", heads)
    head_dim = need("attention.key_length", hidden // heads)
    if f"{arch}.attention.key_length" not in header.metadata and hidden % heads:
        raise _fail(header, f"an embedding length of {hidden} is not a multiple of {heads} heads")
    if heads % kv_heads:
        raise _fail(header, f"{heads} query heads are not a multiple of {kv_heads} KV heads")
    if head_dim % 2:
        raise _fail(header, f"a head dimension of {head_dim} is odd (RoPE rotates pairs)")
    tokens = header.get("tokenizer.ggml.tokens")
    vocab = need("vocab_size", len(tokens) if isinstance(tokens, tuple) else None)
    shapes = Shapes(vocab, hidden, need("feed_forward_length"), need("block_count"), heads,
                    kv_heads, head_dim)
    n_tensors = len(header.table.tensors)
    if shapes.layers * 9 > n_tensors:  # checked before listing the tensors the layers imply
        raise _fail(header, f"{arch}.block_count says {shapes.layers:,} layers, but the file holds "
                            f"{n_tensors} tensors (9 a layer)")
    _check_tensors(header, arch, shapes)
    eps = header.get(f"{arch}.attention.layer_norm_rms_epsilon")
    theta = header.get(f"{arch}.rope.freq_base", 10000.0)
    for key, value, (low, high) in (("attention.layer_norm_rms_epsilon", eps, EPS_RANGE),
                                     ("rope.freq_base", theta, THETA_RANGE)):
        if not isinstance(value, float) or not np.isfinite(value) or value <= 0:
            raise _fail(header, f"{arch}.{key} is {value!r}, not a positive number")
        if not low <= value <= high:
            raise _fail(header, f"{arch}.{key} is {value:g}, outside {low:g} to {high:g} (what "
                                "a model can be trained with)")
    for key in ("bos_token_id", "eos_token_id", "padding_token_id"):
        token = header.get(f"tokenizer.ggml.{key}")
        if isinstance(token, int) and not 0 <= token < shapes.vocab:
            raise _fail(header, f"tokenizer.ggml.{key} is {token:,}, outside the vocabulary of "
                                f"{shapes.vocab:,}")
    tied = "output.weight" not in header.table.by_name()
    config = _config(arch, shapes, need("context_length"), float(eps), float(theta), tied, header)
    return arch, shapes, config


def _settings_reader(header: Header, arch: str) -> Callable[..., int]:
    missing = object()

    def need(key: str, default: Any = missing) -> int:
        value = header.get(f"{arch}.{key}", default)
        if value is missing or value is None:
            raise _fail(header, f"the setting {arch}.{key} is missing")
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < MAX_SETTING:
            raise _fail(header, f"the setting {arch}.{key} is {_short(value)}, not a size")
        return value
    return need


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_tensors(header: Header, arch: str, s: Shapes) -> None:
    have = header.table.by_name()
    want = expected_tensors(arch, s)
    if "output.weight" in have:
        want["output.weight"] = (s.vocab, s.hidden)
    for name, shape in want.items():
        if name not in have:
            raise _fail(header, f"tensor {name} is missing")
        if have[name].shape != shape:
            raise _fail(header, f"tensor {name} is {_dims(have[name].shape)}, but the settings "
                                f"({s.heads} heads × {s.head_dim}, {s.kv_heads} KV heads, width "
                                f"{s.hidden}, FFN {s.ffn}, vocabulary {s.vocab}) need {_dims(shape)}")
    if ROPE_FREQS in have:  # Llama 3.x: one divisor per frequency (head_dim / 2 of them)
        want[ROPE_FREQS] = (s.head_dim // 2,)
        if have[ROPE_FREQS].shape != want[ROPE_FREQS]:
            raise _fail(header, f"tensor {ROPE_FREQS} is {_dims(have[ROPE_FREQS].shape)}, but "
                                f"a head of {s.head_dim} has {s.head_dim // 2} frequencies")
    extra = [n for n in have if n not in want]
    if extra:
        raise _fail(header, f"tensor {extra[0]} is not part of a {arch} model"
                            + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""))


def _dims(shape: tuple[int, ...]) -> str:
    return " × ".join(str(d) for d in shape)


def _config(arch: str, s: Shapes, context: int, eps: float, theta: float, tied: bool,
            header: Header) -> Any:
    from transformers import AutoConfig

    ids = {k: header.get(f"tokenizer.ggml.{g}") for k, g in
           (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
            ("pad_token_id", "padding_token_id"))}
    return AutoConfig.for_model(
        ARCHITECTURES[arch], vocab_size=s.vocab, hidden_size=s.hidden, intermediate_size=s.ffn,
        num_hidden_layers=s.layers, num_attention_heads=s.heads, num_key_value_heads=s.kv_heads,
        head_dim=s.head_dim, max_position_embeddings=context, rms_norm_eps=eps,
        rope_parameters={"rope_type": "default", "rope_theta": theta}, tie_word_embeddings=tied,
        architectures=[f"{ARCHITECTURES[arch].capitalize()}ForCausalLM"],
        **{k: v for k, v in ids.items() if isinstance(v, int)})


def _tokenizer(path: Path, header: Header | None = None) -> Any:
    """The file's tokenizer as llama.cpp reads its vocabulary (engine/gguf/vocab.py), from the
    header already read when there is one."""
    from .vocab import gguf_tokenizer

    return gguf_tokenizer(path, None if header is None else header.metadata)


def read_tensor(header: Header, name: str | GGUFTensor) -> np.ndarray:
    """One tensor dequantized to float32, numpy (rows, cols) — GGUF's ne reversed — read by its
    checked offset (a read-only memmap of just its bytes)."""
    import gguf

    t = header.table.by_name()[name] if isinstance(name, str) else name
    qtype = gguf.GGMLQuantizationType[t.ggml_type]
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    raw = np.memmap(header.table.path, dtype=np.uint8, mode="r", offset=t.offset,
                    shape=(t.nbytes,))
    rows = (t.nbytes // (t.shape[-1] // block * type_size),)
    blocks = raw.reshape(*rows, -1) if len(t.shape) > 1 else raw.reshape(1, -1)
    try:
        values = gguf.quants.dequantize(blocks, qtype)  # (rows, cols) float32
    except NotImplementedError as err:
        raise _fail(header, f"tensor {t.name} is {t.ggml_type}, which gguf-py cannot "
                            "dequantize") from err
    return np.asarray(values, dtype=np.float32).reshape(t.shape)


def _model(header: Header, arch: str, s: Shapes, config: Any, device: torch.device,
           dtype: torch.dtype) -> Any:
    """Every tensor dequantized (gguf-py) and moved to `device` in `dtype` one at a time, so the
    host never holds more than one tensor in float32."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    state, factors = {}, None
    for t in header.table.tensors:
        w = torch.from_numpy(read_tensor(header, t).copy())
        if t.name == ROPE_FREQS:
            factors = w
            continue
        n_head = heads_for(t.name, s.heads, s.kv_heads) if arch in PERMUTED else None
        w = w if n_head is None else unpermute(w, n_head)
        state[hf_name(t.name)] = w.to(device=device, dtype=dtype).contiguous()
    loaded = model.load_state_dict(state, strict=False, assign=True)
    if loaded.unexpected_keys:
        raise _fail(header, f"the {arch} model has no place for {loaded.unexpected_keys[0]}")
    if config.tie_word_embeddings:
        model.tie_weights()
    rope_frequencies(model, config, factors)
    model.model.rotary_emb.to(device)
    left = [n for n, p in [*model.named_parameters(), *model.named_buffers()] if p.is_meta]
    if left:  # _check_tensors makes this unreachable; a model class with more parts would not be
        raise _fail(header, f"the file has no tensor for {left[0]}")
    return model.eval()
