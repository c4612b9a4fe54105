"""Attention views: chart data equal the trace's weights; per-head summaries equal numpy;
the one-head recomputation from the model's own q/k/v equals recorded and eager attention."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from charts.attention import (decode_row_chart, downsample, full_attention, gqa_groups, head_summary,
                              head_view, heatmap, model_view, sequence_labels)
from engine import GenerationSettings, generate_trace
from engine.inspect_head import capture_qkv, explain_head

from .conftest import eager_attentions


@pytest.fixture(scope="module")
def tiny_trace(tiny_lm):
    return generate_trace(tiny_lm, "The cat sat on the mat.", GenerationSettings(max_new_tokens=5))


def test_full_attention_stitches_prefill_and_decode_rows(tiny_trace):
    full = full_attention(tiny_trace, 1)
    t = len(tiny_trace.prompt_token_ids)
    n = len(tiny_trace.steps)
    assert full.shape == (4, t + n - 1, t + n - 1)
    prefill = tiny_trace.steps[0].attention[1].astype(np.float32)
    lower = np.tril(np.ones((t, t), dtype=bool))
    np.testing.assert_array_equal(full[:, :t, :t][:, lower], prefill[:, lower])
    assert np.isnan(full[:, :t, :t][:, ~lower]).all(), "masked cells are NaN, not zero"
    for k in range(1, n):
        np.testing.assert_array_equal(full[:, t + k - 1, : t + k],
                                      tiny_trace.steps[k].attention[1, :, 0].astype(np.float32))
    assert len(sequence_labels(tiny_trace)) == full.shape[-1]


def test_heatmap_carries_the_weights(tiny_trace):
    full = full_attention(tiny_trace, 0)
    labels = sequence_labels(tiny_trace)
    fig = heatmap(full[2], labels, "x")
    np.testing.assert_array_equal(np.asarray(fig.data[0].z, dtype=np.float32), full[2])
    assert list(fig.data[0].x) == labels
    assert fig.layout.xaxis.title.text and fig.layout.yaxis.title.text


def test_downsample_is_a_nan_aware_block_mean():
    m = np.tril(np.arange(1, 101, dtype=np.float32).reshape(10, 10))
    m[np.triu_indices(10, 1)] = np.nan
    pooled, names, block = downsample(m, [str(i) for i in range(10)], 4)
    assert block == 3 and pooled.shape == (4, 4) and names[0] == "0–2" and names[-1] == "9–9"
    assert pooled[0, 0] == pytest.approx(np.nanmean(m[:3, :3]))
    assert pooled[3, 2] == pytest.approx(np.nanmean(m[9:, 6:9]))
    assert np.isnan(pooled[0, 3])
    same, _, one = downsample(m, [], 10)
    assert one == 1 and same is m


def test_head_summary_matches_numpy(tiny_trace):
    s = head_summary(tiny_trace)
    a = tiny_trace.steps[0].attention.astype(np.float64)
    layers, heads, t, _ = a.shape
    for li in range(layers):
        for h in range(heads):
            m = a[li, h]
            ent = np.mean([-sum(p * np.log(p) for p in row if p > 0) for row in m])
            assert s["entropy"][li, h] == pytest.approx(ent, rel=1e-6)
            assert s["first"][li, h] == pytest.approx(m[:, 0].mean())
            assert s["self"][li, h] == pytest.approx(np.diag(m).mean())
            assert s["previous"][li, h] == pytest.approx(np.mean([m[i, i - 1] for i in range(1, t)]))


def test_model_view_head_view_and_decode_rows(tiny_trace):
    fig, step = model_view(tiny_trace, tile=4)
    z = np.asarray(fig.data[0].z, dtype=np.float32)
    assert z.shape == (4 * step, 2 * step)  # heads down, layers across
    view = head_view(tiny_trace, 0, [0, 1], query=3)
    widths = [tr.line.width for tr in view.data if tr.mode == "lines" and tr.x[0] is not None]
    assert len(widths) == 2 * 4  # 4 visible keys for query 3, two heads
    dec = decode_row_chart(tiny_trace, 2, 1)
    np.testing.assert_array_equal(np.asarray(dec.data[0].z, dtype=np.float32),
                                  tiny_trace.steps[2].attention[1, :, 0].astype(np.float32))


def test_gqa_groups_follow_repeat_kv():
    from transformers.integrations.sdpa_attention import repeat_kv

    groups = gqa_groups(9, 3)
    assert groups == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    kv = torch.arange(3.0).view(1, 3, 1, 1)
    expanded = repeat_kv(kv, 3)[0, :, 0, 0]
    for j, members in enumerate(groups):
        assert all(expanded[h] == j for h in members)


def test_one_head_recomputation_matches_recorded_and_eager(lm):
    trace = generate_trace(lm, "Name a colour.", GenerationSettings(max_new_tokens=3))
    ids = list(trace.prompt_token_ids) + [s.token_id for s in trace.steps[:-1]]
    layer, head = 7, 4
    inputs = capture_qkv(lm, ids, layer)
    assert inputs.scaling == pytest.approx(64 ** -0.5)
    full = full_attention(trace, layer)
    eager = eager_attentions(lm, ids)[layer, head]
    for pos in (0, 5, len(ids) - 2, len(ids) - 1):
        steps = explain_head(inputs, head, pos)
        assert steps.weights.sum() == pytest.approx(1.0)
        np.testing.assert_allclose(steps.weights, full[head, pos, : pos + 1], atol=1e-3)
        np.testing.assert_allclose(steps.weights, eager[pos, : pos + 1], atol=1e-5)
    # the weighted sum of values equals torch's own scaled_dot_product_attention for that head
    q = torch.from_numpy(inputs.query)[None]  # (1, H, S, D)
    k = torch.from_numpy(inputs.key).repeat_interleave(3, dim=0)[None]
    v = torch.from_numpy(inputs.value).repeat_interleave(3, dim=0)[None]
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)[0, head]
    np.testing.assert_allclose(explain_head(inputs, head, 5).output, sdpa[5].numpy(), atol=1e-5)
    assert lm.model.config._attn_implementation == "sdpa"
