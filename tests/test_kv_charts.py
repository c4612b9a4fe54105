"""KV-cache page figures: one colour per cache variant in every chart, a legend on the paged-blocks
grid, and a calculator chart that a long model name cannot squeeze."""

from __future__ import annotations

import numpy as np

from charts.kvcache import blocks_chart, per_token_bars, variant_chart
from engine.kv.cachelab import VariantRun
from engine.kv.kvcache import CacheConfig
from engine.kv.paging import paged_layout

CONFIGS = [CacheConfig(), CacheConfig("int8"), CacheConfig("int4"),
           CacheConfig("window", 32, 4), CacheConfig("window", 32, 0)]


def runs(configs=CONFIGS) -> list[VariantRun]:
    n = 5
    return [VariantRun(c, np.linspace(0, i, n), np.ones(n, dtype=bool), np.arange(n) * 1024.0)
            for i, c in enumerate(configs)]


def colours(fig) -> dict[str, str]:
    return {trace.name: trace.line.color for trace in fig.data}


def test_each_variant_has_the_same_colour_in_the_kl_and_memory_charts():
    found = runs()
    kl = colours(variant_chart(found[1:], "kl", "KL(full ‖ variant), nats"))  # as the page draws
    memory = colours(variant_chart(found, "kv_bytes", "KV cache (KiB)", 1024))
    assert set(kl) == {r.config.label for r in found[1:]}
    for label, colour in kl.items():
        assert memory[label] == colour, label
    assert len(set(memory.values())) == len(memory)  # and the variants are told apart


def test_a_variant_keeps_its_colour_whatever_else_is_drawn():
    alone = colours(variant_chart(runs([CacheConfig("int4")]), "kl", "KL"))
    together = colours(variant_chart(runs(), "kl", "KL"))
    assert alone["int4 cache"] == together["int4 cache"]


def test_paged_blocks_grid_has_a_legend_for_owners_and_unused_slots():
    layout = paged_layout([20, 7, 33], block_size=8)
    names = ["this trace", "seq 1", "seq 2"]
    fig = blocks_chart(layout, names)
    shown = [t.name for t in fig.data if t.showlegend is not False]
    assert shown == names + ["unused slots (wasted)"]
    assert fig.layout.barmode == "stack" and fig.layout.showlegend is not False
    assert fig.layout.legend.traceorder == "normal"  # stacked bars would list them reversed
    # each sequence's trace holds exactly its blocks; used + unused fill every block
    for seq, name in enumerate(names):
        trace = next(t for t in fig.data if t.name == name)
        assert sorted(trace.x) == sorted(layout.block_tables[seq])
    total = {}
    for trace in fig.data:
        for x, y in zip(trace.x, trace.y):
            total[x] = total.get(x, 0) + y
    assert total == {p: 8 for p in range(layout.blocks)}
    unused = next(t for t in fig.data if t.name == "unused slots (wasted)")
    assert sum(unused.y) == layout.total_waste
    colours_used = [t.marker.color for t in fig.data]
    assert len(set(colours_used)) == len(colours_used)


def test_calculator_chart_is_not_squeezed_by_a_long_model_name():
    long_name = "some-organisation/an-extremely-long-fine-tuned-model-name-v2-instruct (loaded)"
    names = ["Llama-2-7B", "DeepSeek-V3", long_name]
    fig = per_token_bars(names, ["MHA", "MLA", "GQA"], [524_288, 70_272, 46_080])
    assert all(t.orientation == "h" for t in fig.data)  # names on the y axis, not rotated ticks
    assert list(fig.layout.yaxis.tickvals) == names
    assert max(len(t) for t in fig.layout.yaxis.ticktext) <= 28
    cut = fig.layout.yaxis.ticktext[2]
    assert "…" in cut and cut.startswith("some-") and cut.endswith("(loaded)")
    assert list(fig.layout.yaxis.categoryarray) == names  # the table's order
    assert {t.name for t in fig.data} == {"MHA", "GQA", "MLA"}  # a legend for the colours
    bars = {y: x for t in fig.data for y, x in zip(t.y, t.x)}
    assert bars["Llama-2-7B"] == 512 and bars[long_name] == 45
    assert fig.layout.xaxis.title.text == "KV cache per token (KiB)"


def test_live_memory_counts_a_big_models_cache_in_mib():
    """An 8B model's cache after a 542-token prompt (Llama 3.1 8B: 262,144 B a token) reads
    141 MiB on the axis, as Generate's metric writes it, not "150k KiB"; a small model's stays in
    KiB. Step 0 is named as the Generate chart names it: the prefill of the whole prompt."""
    from types import SimpleNamespace

    from charts.kvcache import live_memory_chart

    def trace(per_token: int, prompt: int, steps: int = 24):
        model = SimpleNamespace(kv_bytes=lambda n: per_token * n)
        return SimpleNamespace(model=model, settings=SimpleNamespace(kv_cache=True), steps=[
            SimpleNamespace(index=i, context_len=prompt + i, kv_bytes=per_token * (prompt + i))
            for i in range(steps)])

    big = live_memory_chart(trace(262_144, 542))
    assert big.layout.yaxis.title.text == "KV cache (MiB)"
    assert big.data[0].y[-1] == 565 * 262_144 / 2**20  # 141.25
    assert big.layout.xaxis.title.text == "step (0 = prefill of the whole prompt)"
    small = live_memory_chart(trace(61_440, 20))  # SmolLM2-135M, 20 tokens: 1.2 MiB
    assert small.layout.yaxis.title.text == "KV cache (KiB)" and small.data[0].y[0] == 1200.0
