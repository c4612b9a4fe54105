"""The eviction scores of engine/kv/shrink/evict.py pick the tokens NVIDIA's kvpress picks, on the
same tensors: SnapKV, key norm and StreamingLLM, the presses both have (kvpress has no H2O press;
its ObservedAttentionPress averages where H2O sums).

kvpress 0.5.5 pins transformers < 5.3, older than the app's, so it is not a dependency: `make
kvpress` unpacks it (and the two small packages its press modules import) into .kvpress/ without
its dependencies, and this test loads the press modules alone, past kvpress/__init__.py (which
imports its whole pipeline: datasets, peft, ...)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import torch

from engine.kv.shrink.evict import keep_top, knorm_scores, snapkv_scores, window_scores

KVPRESS = Path(__file__).resolve().parents[1] / ".kvpress"


@pytest.fixture(scope="module")
def kvpress():
    if not (KVPRESS / "kvpress" / "presses" / "snapkv_press.py").exists():
        pytest.skip("kvpress is not unpacked (make kvpress)")
    sys.path.insert(0, str(KVPRESS))
    saved = {k: v for k, v in sys.modules.items() if k == "kvpress" or k.startswith("kvpress.")}
    for name, path in (("kvpress", KVPRESS / "kvpress"),
                       ("kvpress.presses", KVPRESS / "kvpress" / "presses")):
        stub = types.ModuleType(name)
        stub.__path__ = [str(path)]
        sys.modules[name] = stub
    try:
        from kvpress.presses.knorm_press import KnormPress
        from kvpress.presses.snapkv_press import SnapKVPress
        from kvpress.presses.streaming_llm_press import StreamingLLMPress

        yield SnapKVPress, KnormPress, StreamingLLMPress
    finally:
        for name in [k for k in sys.modules if k == "kvpress" or k.startswith("kvpress.")]:
            del sys.modules[name]
        sys.modules.update(saved)
        sys.path.remove(str(KVPRESS))


def tensors(seed: int, heads: int = 8, kv_heads: int = 2, s: int = 40, d: int = 16):
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn(1, kv_heads, s, d, generator=g)
    scores = torch.randn(1, heads, s, s, generator=g) * 3
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    attentions = torch.softmax(scores.masked_fill(~causal, float("-inf")), -1)
    config = types.SimpleNamespace(num_attention_heads=heads, num_key_value_heads=kv_heads)
    module = types.SimpleNamespace(config=config, head_dim=d)
    hidden = torch.zeros(1, s, heads * d)
    return module, hidden, keys, attentions


@pytest.mark.parametrize("seed, window", [(0, 8), (1, 16), (2, 5)])
def test_snapkv_picks_what_kvpress_picks(kvpress, seed, window):
    press_class = kvpress[0]
    module, hidden, keys, attentions = tensors(seed)
    theirs = press_class(window_size=window, kernel_size=5).score(module, hidden, keys, keys,
                                                                  attentions, {})
    ours = snapkv_scores(attentions[..., -window:, :], kv_heads=2)
    assert torch.allclose(ours, theirs, atol=1e-6)
    kept = 20
    assert torch.equal(keep_top(ours, kept), theirs.topk(kept, -1).indices.sort(-1).values)


def test_key_norm_picks_what_kvpress_picks(kvpress):
    module, hidden, keys, _ = tensors(3)
    theirs = kvpress[1]().score(module, hidden, keys, keys, None, {})
    assert torch.allclose(knorm_scores(keys), theirs)


@pytest.mark.parametrize("kept", [6, 13, 30])
def test_streaming_llm_keeps_what_kvpress_keeps(kvpress, kept):
    module, hidden, keys, _ = tensors(4)
    s = keys.shape[2]
    press = kvpress[2](compression_ratio=1 - kept / s, n_sink=4)
    theirs = press.score(module, hidden, keys, keys, None, {})
    n_kept = int(s * (1 - press.compression_ratio))  # kvpress's own count of what it keeps
    assert torch.equal(keep_top(window_scores(keys, n_kept), n_kept),
                       theirs.topk(n_kept, -1).indices.sort(-1).values)


def test_a_different_score_is_caught(kvpress):
    """The comparison can fail: SnapKV without its pooling picks other tokens."""
    module, hidden, keys, attentions = tensors(5)
    theirs = kvpress[0](window_size=8, kernel_size=5).score(module, hidden, keys, keys,
                                                            attentions, {})
    ours = snapkv_scores(attentions[..., -8:, :], kv_heads=2, kernel=1)
    assert not torch.allclose(ours, theirs, atol=1e-6)
