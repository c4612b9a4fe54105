"""Model loading: GGUF → cache equivalence, atomic cache writes, clear errors, the spec."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors import safe_open

from engine import ModelLoadError, load_model, loader
from engine.loader import default_gguf_path, write_model_cache


@pytest.mark.real_model  # converts the real GGUF, then reloads it
def test_cached_model_equals_fresh_gguf_load(tmp_path, monkeypatch):
    monkeypatch.setenv(loader.CACHE_ENV, str(tmp_path))
    fresh = load_model()  # dequantizes the GGUF, then writes the cache under tmp_path
    cached = load_model()  # reads the cache
    assert not fresh.from_cache and cached.from_cache
    ids = torch.tensor([fresh.tokenizer("The quick brown fox jumps over the lazy dog.")["input_ids"]])
    with torch.inference_mode():
        assert torch.equal(cached.model(input_ids=ids).logits, fresh.model(input_ids=ids).logits)
    text = "héllo 世界 🌍"
    assert cached.tokenizer(text)["input_ids"] == fresh.tokenizer(text)["input_ids"]
    assert cached.tokenizer.chat_template == fresh.tokenizer.chat_template
    assert cached.spec == fresh.spec


def test_crash_mid_write_leaves_no_cache(tmp_path, lm, monkeypatch):
    target = tmp_path / "model"

    def explode(*_args, **_kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr("safetensors.torch.save_model", explode)
    with pytest.raises(RuntimeError):
        write_model_cache(lm.model, lm.tokenizer, target, {})
    assert not target.exists()
    assert list(tmp_path.iterdir()) == [], "the temporary folder is removed too"


def test_stale_half_cache_is_replaced(tmp_path, tiny_lm):
    target = tmp_path / "model"
    target.mkdir()
    (target / "config.json").write_text("{}")  # left by a crash: no completion mark
    assert not loader.is_complete_cache(target)
    write_model_cache(tiny_lm.model, tiny_lm.tokenizer, target, {"test": True})
    assert loader.is_complete_cache(target)
    assert json.loads((target / "config.json").read_text())["num_hidden_layers"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_param_count_equals_sum_over_tensors(lm):
    path = loader._default_cache_dir(default_gguf_path()) / "model.safetensors"
    with safe_open(str(path), framework="pt") as f:
        total = sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())
    assert lm.spec.param_count == total == 134_515_008
    assert lm.spec.weight_bytes == 4 * total


def test_missing_folder(tmp_path):
    with pytest.raises(ModelLoadError, match="not found"):
        load_model(str(tmp_path / "no-such-model"))


def test_unknown_hub_id_offline():
    with pytest.raises(ModelLoadError, match="cannot load model 'nobody/no-such-model-xyz'"):
        load_model("nobody/no-such-model-xyz")


def test_non_causal_model_is_refused(tmp_path):
    from transformers import BertConfig

    BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
               intermediate_size=64).save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="not a causal"):
        load_model(str(tmp_path))


def test_local_folder_loads_safetensors(tmp_path, tiny_lm):
    tiny_lm.model.save_pretrained(tmp_path)
    tiny_lm.tokenizer.save_pretrained(tmp_path)
    assert any(p.suffix == ".safetensors" for p in tmp_path.iterdir())
    loaded = load_model(str(tmp_path))
    assert loaded.spec.layers == 2 and loaded.spec.kv_heads == 2
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "llama"
    ids = torch.tensor([[5, 6, 7]])
    with torch.inference_mode():
        assert torch.allclose(loaded.model(input_ids=ids).logits, tiny_lm.model(input_ids=ids).logits)


def test_bad_device_and_dtype():
    with pytest.raises(ModelLoadError, match="dtype"):
        loader.resolve_dtype("int3", torch.device("cpu"))
    if not torch.cuda.is_available():
        with pytest.raises(ModelLoadError, match="CUDA"):
            loader.resolve_device("cuda")
