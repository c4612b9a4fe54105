"""Attention views: chart data equal the trace's weights; per-head summaries equal numpy;
the one-head recomputation from the model's own q/k/v equals recorded and eager attention.
Each figure says what a reader needs (layer and head on hover, one colour scale over the decode
steps, a height that fits a screen, lines that read on a diffuse head) and checks its input."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from charts.attention import (
    MAX_HEIGHT,
    clicked_tile,
    decode_frame_steps,
    decode_row_chart,
    decode_steps_chart,
    downsample,
    head_view,
    heatmap,
    model_view,
    sequence_labels,
)
from charts.text import as_text
from engine import GenerationSettings, generate_trace
from engine.lens.attention_stats import full_attention, gqa_groups, head_roles, head_summary
from engine.lens.inspect_head import capture_qkv, explain_head

from .conftest import eager_attentions


@pytest.fixture(scope="module")
def tiny_trace(tiny_lm):
    return generate_trace(tiny_lm, "The cat sat on the mat.", GenerationSettings(max_new_tokens=5))


def causal(heads: int, s: int, rng: np.random.Generator | None = None) -> np.ndarray:
    """(H, S, S) softmax rows over the keys up to each query, NaN above the diagonal."""
    scores = (rng or np.random.default_rng(0)).normal(size=(heads, s, s)).astype(np.float32)
    scores[:, np.triu(np.ones((s, s), dtype=bool), 1)] = -np.inf
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    weights[:, np.triu(np.ones((s, s), dtype=bool), 1)] = np.nan
    return weights


def lines(fig) -> list:
    """The head view's weight lines (legend entries have x = [None])."""
    return [tr for tr in fig.data if tr.mode == "lines" and tr.x[0] is not None]


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


def test_heatmap_gives_every_row_room_for_its_label_beside_the_tilted_key_labels():
    """A chat-template prompt of 15 tokens (Llama 3's `13:<|end_header_id|>` among the key labels,
    tilted 60° below the plot): after the title, the axis titles and the labels' own height,
    each query row keeps at least 16 px, the height a 12 px label needs for plotly to label
    every row (at 13 px it labelled every other one)."""
    pieces = ["<|begin_of_text|>", "<|start_header_id|>", "user", "<|end_header_id|>", "ĊĊ",
              "The", "Ġcapital", "Ġof", "ĠFrance", "Ġis", "<|eot_id|>", "<|start_header_id|>",
              "assistant", "<|end_header_id|>", "ĊĊ"]
    labels = [as_text(f"{i}:{p}") for i, p in enumerate(pieces)]
    fig = heatmap(causal(1, len(labels))[0], labels, "layer 0, head 0")
    tilted = max(len(f"{i}:{p}") for i, p in enumerate(pieces)) * 6 * np.sin(np.radians(60))
    plot = fig.layout.height - fig.layout.margin.t - tilted - 60  # x title, y label padding
    assert plot / len(labels) >= 16, (fig.layout.height, plot)
    assert fig.layout.height <= 900
    assert heatmap(causal(1, 300)[0], [str(i) for i in range(300)], "x").layout.height == 900


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


def test_head_roles_label_by_the_strongest_habit():
    summary = {name: np.zeros((1, 4)) for name in ("entropy", "first", "previous", "self")}
    summary["first"][0, 0], summary["previous"][0, 1], summary["self"][0, 2] = 0.9, 0.8, 0.7
    assert list(head_roles(summary)[0]) == ["sink (first token)", "previous-token", "self", "mixed"]


def test_model_view_hover_and_click_name_layer_and_head(tiny_trace):
    """The click target: a selectable trace whose every point carries (layer, head) — plotly
    cannot select heatmap cells, so a heatmap alone never reaches Streamlit's on_select."""
    prefill = tiny_trace.steps[0].attention  # (2, 4, T, T)
    layers = (3, 7)  # model layer numbers need not be slots: the click must return these
    fig = model_view(prefill, layers, tile=4)
    mosaic = np.asarray(fig.data[0].z, dtype=np.float32)
    step = 4 + 1
    assert mosaic.shape == (4 * step, 2 * step)  # heads down, layers across
    assert fig.data[0].hoverinfo == "skip"  # the overlay answers hover and click
    overlay = [tr for tr in fig.data[1:] if tr.type in ("scatter", "scattergl")]
    assert overlay and all(tr.mode == "markers" for tr in overlay)
    covered = 0
    for tr in overlay:
        assert "layer %{customdata[0]}, head %{customdata[1]}" in tr.hovertemplate
        x, y = np.asarray(tr.x), np.asarray(tr.y)
        data = np.asarray(tr.customdata, dtype=np.float64)
        np.testing.assert_array_equal(data[:, 0], np.asarray(layers)[x // step])
        np.testing.assert_array_equal(data[:, 1], y // step)
        if data.shape[1] == 3:  # cells with a weight: hover shows that cell's weight
            assert "weight %{customdata[2]" in tr.hovertemplate
            np.testing.assert_allclose(data[:, 2], mosaic[y, x], rtol=1e-6)
        else:
            assert np.isnan(mosaic[y, x]).all()
        covered += len(x)
    assert covered == 2 * 4 * 4 * 4, "every cell of every tile, masked ones too, can be clicked"


def test_clicked_tile_reads_what_the_browser_sends():
    # as Chromium delivered it: a typed customdata array arrives as an object keyed "0", "1", …
    sent = [{"curve_number": 1, "point_index": 5789, "x": 41, "y": 34,
             "customdata": {"0": 29, "1": 2, "2": 0.5513}}]
    assert clicked_tile(sent) == (29, 2)
    assert clicked_tile([{"customdata": [7.0, 3.0, 0.25]}]) == (7, 3)
    assert clicked_tile([{"x": 3, "y": 4}, {"customdata": [1, 0]}]) == (1, 0)
    for nothing in (None, [], [{"x": 1}], [{"customdata": "layer"}], [{"customdata": {"0": None}}]):
        assert clicked_tile(nothing) is None


def test_decode_steps_play_as_frames_on_one_colour_scale_and_axis(tiny_trace):
    """Play is plotly's animation: a frame per step, its slider bound to the frames, one colour
    scale and one key axis in every frame, and the figure drawn at step 1 before anything plays."""
    full = full_attention(tiny_trace, 1)
    labels = sequence_labels(tiny_trace)
    t, steps = len(tiny_trace.prompt_token_ids), len(tiny_trace.steps) - 1
    fig = decode_steps_chart(full, labels, t, [s.piece for s in tiny_trace.steps[1:]])
    top = max(float(step.attention[1].max()) for step in tiny_trace.steps[1:])  # all decode rows
    assert [f.name for f in fig.frames] == [str(k) for k in range(1, steps + 1)]
    for k, frame in enumerate(fig.frames, start=1):
        heat = frame.data[0]
        assert (heat.zmin, heat.zmax) == (0, pytest.approx(top))
        z = np.asarray(heat.z, dtype=np.float32)
        assert z.shape == (4, len(labels)), "every frame spans the whole key axis"
        np.testing.assert_array_equal(z[:, : t + k], tiny_trace.steps[k].attention[1, :, 0])
        assert np.isnan(z[:, t + k:]).all(), "keys not cached yet are empty"
        assert f"step {k}:" in frame.layout.title.text
    first = fig.data[0]  # what the browser draws at once: step 1, on the frames' scale and axis
    np.testing.assert_array_equal(np.asarray(first.z, dtype=np.float32),
                                  np.asarray(fig.frames[0].data[0].z, dtype=np.float32))
    assert (first.zmin, first.zmax) == (0, pytest.approx(top)) and list(first.x) == labels
    assert fig.layout.title.text.startswith("step 1:")
    slider = fig.layout.sliders[0]
    assert slider.active == 0
    bound = [(step.method, list(step.args[0])) for step in slider.steps]
    assert bound == [("animate", [frame.name]) for frame in fig.frames]
    play, pause = fig.layout.updatemenus[0].buttons
    assert play.method == pause.method == "animate"
    assert play.args[0] is None and play.args[1]["frame"]["redraw"] and play.args[1]["fromcurrent"]
    assert fig.layout.height <= MAX_HEIGHT


def test_one_decode_step_alone(tiny_trace):
    full = full_attention(tiny_trace, 0)
    labels = sequence_labels(tiny_trace)
    t = len(tiny_trace.prompt_token_ids)
    fig = decode_row_chart(full, labels, t, 2, tiny_trace.steps[2].piece)
    np.testing.assert_array_equal(np.asarray(fig.data[0].z, dtype=np.float32)[:, : t + 2],
                                  tiny_trace.steps[2].attention[0, :, 0].astype(np.float32))


def test_decode_frames_stay_bounded_for_a_long_trace():
    assert decode_frame_steps(63, 9, 100) == list(range(1, 64))
    many = decode_frame_steps(256, 9, 1280)  # 256 steps of 9 × 1280 weights: ~3 M numbers
    assert many[0] == 1 and many[-1] == 256 and len(many) * 9 * 1280 <= 1_000_000 + 9 * 1280
    assert len(decode_frame_steps(4000, 1, 10)) <= 101
    strides = np.diff(many)
    assert (strides[:-1] == strides[0]).all() and strides[-1] <= strides[0]


def test_head_view_fits_a_screen_for_a_long_sequence():
    weights = causal(9, 400)
    labels = [f"{i}:tok" for i in range(400)]
    for heads in ([0], [0, 1, 2], list(range(9))):
        fig = head_view(weights, labels, heads, query=399)
        assert fig.layout.height <= MAX_HEIGHT
        keys = next(tr for tr in fig.data if tr.mode == "text" and len(tr.text) > 1)
        assert len(keys.text) * 18 <= MAX_HEIGHT, "listed keys fit without overlapping"
        assert len(lines(fig)) >= len(heads)


def test_head_view_lines_read_on_a_diffuse_head():
    """Layer 0 spreads ~1/S over every key: absolute weights drew 1 px lines at 5 % opacity."""
    s = 60
    weights = np.full((2, s, s), np.nan, dtype=np.float32)
    for q in range(s):
        weights[:, q, : q + 1] = 1.0 / (q + 1)
    weights[1, s - 1, : s] = np.linspace(1, 2, s) / np.linspace(1, 2, s).sum()  # mildly graded
    fig = head_view(weights, [str(i) for i in range(s)], [0, 1], query=s - 1)
    drawn = lines(fig)
    assert min(tr.opacity for tr in drawn) >= 0.3
    assert min(tr.line.width for tr in drawn) >= 1.5
    for head in ("head 0", "head 1"):  # each head's strongest key at full strength
        own = [tr for tr in drawn if tr.text.startswith(head + ":")]
        assert max(tr.opacity for tr in own) == pytest.approx(1.0)
        assert max(tr.line.width for tr in own) == pytest.approx(8.0)
    graded = sorted((float(tr.text.rsplit(" ", 1)[1]), tr.line.width, tr.opacity)
                    for tr in drawn if tr.text.startswith("head 1:"))
    assert [w for _, w, _ in graded] == sorted(w for _, w, _ in graded), "width grows with weight"


def test_head_view_lines_go_to_the_listed_keys(tiny_trace):
    full = full_attention(tiny_trace, 0)
    labels = sequence_labels(tiny_trace)
    fig = head_view(full, labels, [0, 1], query=3)
    assert len(lines(fig)) == 2 * 4  # 4 visible keys for query 3, two heads
    listed = next(tr for tr in fig.data if tr.mode == "text" and len(tr.text) > 1).text
    assert list(listed) == labels[:4]
    for tr in lines(fig):
        head, key = tr.text.split(":")[0], tr.text.split(" → ")[1].split(" · ")[0]
        assert round(tr.y[1]) == listed.index(key)
        weight = float(tr.text.rsplit(" ", 1)[1])
        assert weight == pytest.approx(full[int(head.split()[1]), 3, listed.index(key)], abs=5e-4)


@pytest.mark.parametrize("call, message", [
    (lambda w, lb: heatmap(w[0, :, :3], lb, "x"), "square"),
    (lambda w, lb: heatmap(w[0], lb[:-1], "x"), "labels"),
    (lambda w, lb: head_view(w[0], lb, [0], 1), "heads, S, S"),
    (lambda w, lb: head_view(w, lb[:-1], [0], 1), "5 labels for 6 positions"),
    (lambda w, lb: head_view(w, lb, [0, 4], 1), "heads [4] out of range"),
    (lambda w, lb: head_view(w, lb, [0], 6), "query 6 out of range"),
    (lambda w, lb: head_view(w, lb, [], 1), "at least one head"),
    (lambda w, lb: decode_row_chart(w, lb, 4, 3, "x"), "decode step 3 out of range"),
    (lambda w, lb: decode_row_chart(w, lb, 0, 1, "x"), "prompt length 0 leaves"),
    (lambda w, lb: decode_steps_chart(w, lb, 6, []), "prompt length 6 leaves no decode rows"),
    (lambda w, lb: decode_steps_chart(w, lb, 4, ["a"]), "1 produced pieces for 2 decode steps"),
    (lambda w, lb: model_view(w, [0], 2), "(layers, heads, T, T)"),
    (lambda w, lb: model_view(w[None], [0, 1], 2), "2 layer numbers for 1 recorded layers"),
    (lambda w, lb: downsample(w, lb, 2), "square (S, S)"),
])
def test_charts_check_their_input_shapes(call, message):
    weights, labels = causal(2, 6), [str(i) for i in range(6)]
    with pytest.raises(ValueError, match=re.escape(message)):
        call(weights, labels)


def test_gqa_groups_follow_repeat_kv():
    from transformers.integrations.sdpa_attention import repeat_kv

    groups = gqa_groups(9, 3)
    assert groups == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    kv = torch.arange(3.0).view(1, 3, 1, 1)
    expanded = repeat_kv(kv, 3)[0, :, 0, 0]
    for j, members in enumerate(groups):
        assert all(expanded[h] == j for h in members)
    with pytest.raises(ValueError, match="9 query heads cannot share 2 KV heads"):
        gqa_groups(9, 2)


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
