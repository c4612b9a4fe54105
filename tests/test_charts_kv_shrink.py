"""The shrink chart's reading aids, on made-up runs: a point's label never takes the place of a
near point's label, perplexity's log axis is ticked 1-2-5 (no 2…9 under each power of ten),
and points at 0 or 1 keep room for their labels."""

from __future__ import annotations

import numpy as np

from charts.kv_shrink import budget_label, label_places, log_ticks, shrink_chart
from engine.kv.shrink.run import ShrinkRun


def run(method: str, budget: str, count: int, held: int, kl: float, ppl: float = 12.0) -> ShrinkRun:
    steps = 4
    return ShrinkRun(method, budget, count, 16, np.full(steps + 1, kl), np.ones(steps + 1, bool),
                     np.full(steps, np.log(ppl)), np.full(steps, np.log(11.9)),
                     np.full(steps + 1, held), np.full(steps + 1, 4096), np.full(steps, held),
                     np.full(steps, 4096), np.full(steps, 1.0), np.full(steps, 1.0), 0, None)


def test_near_points_take_different_label_places():
    a, b = run("topk", "25%", 22, 4096, 0.003), run("topk", "50%", 43, 4096, 0.0005)
    far = run("latent", "25%", 96, 1024, 3.0)
    places = label_places([a, b, far], "kl", "held")
    assert places[id(a)] != places[id(b)]  # both hold the whole cache, both near KL 0
    assert places[id(far)] == "top center"


def test_perplexity_ticks_are_one_two_five():
    assert log_ticks(11.9, 538.0) == [10.0, 20.0, 50.0, 100.0, 200.0, 500.0]
    fig = shrink_chart([run("window", "25%", 8, 1024, 1.0, 40.0),
                        run("h2o", "25%", 8, 1024, 0.8, 28.0)], "ppl", "held")
    assert fig.layout.yaxis.type == "log" and list(fig.layout.yaxis.tickvals) == [10.0, 20.0, 50.0]


def test_points_at_zero_keep_room_under_them():
    fig = shrink_chart([run("topk", "50%", 43, 4096, 0.0), run("latent", "25%", 96, 1024, 2.0)])
    low, high = fig.layout.yaxis.range
    assert low < 0 < 2.0 < high


def test_labels_say_what_the_budget_came_to():
    assert [budget_label(run(m, "25%", 8, 1024, 0.1)) for m in ("latent", "topk", "h2o", "snapkv")] \
        == ["r=8", "k=8", "8 tok", "8 tok + new"]
