"""bench/gguf_bench.py's parts that need neither engine: the rounds reduced to a row (medians,
paired ratios, MBU and the roof), the markdown, the first step's agreement, the page-cache check,
and the restart of a llama.cpp worker without extra buffers when its defaults crash."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from bench import gguf_peer
from bench.gguf_bench import agreement
from bench.gguf_files import prompt_ids, resident_fraction, synth_dir, synthetic_path
from bench.gguf_table import markdown, summarize


def _side(ttft: float, itl: float, disturbed: bool = False) -> dict:
    return {"open_s": 1.0, "peak_rss": 2e9, "cold_ttft_ms": ttft * 2, "ttft_ms": ttft,
            "ttft_long_ms": ttft * 8, "itl_ms": itl, "resident_before": 1.0,
            "step_read_bytes": 4e9, "window": {"disturbed": disturbed}}


def _row() -> dict:
    rounds = [{"ours": _side(100, 200), "llama": _side(200, 250), "disturbed": False},
              {"ours": _side(300, 210, True), "llama": _side(100, 300), "disturbed": True},
              {"ours": _side(120, 190), "llama": _side(150, 200), "disturbed": False}]
    return {"shape": "8b", "type": "q4_k_m", "file_bytes": 4.9e9, "rounds": rounds,
            "agreement": {"kl": 1e-4, "top10_overlap": 10, "greedy_equal": 12, "greedy_of": 16},
            "note": gguf_peer.NO_EXTRA}


def test_a_row_is_medians_and_paired_ratios():
    s = summarize(_row(), ceiling_gb_s=40.0)
    assert s["ttft_ms"] == {"ours": 120, "llama": 150, "ratio": 0.8}  # ratios 0.5, 3, 0.8
    assert s["itl_ms"]["ours"] == 200 and s["itl_ms"]["llama"] == 250
    assert s["itl_ms"]["ratio"] == pytest.approx(0.8)  # 0.8, 0.7, 0.95
    assert s["roof_itl_ms"] == pytest.approx(100.0)  # 4 GB at 40 GB/s
    assert s["mbu"]["ours"] == pytest.approx(0.5) and s["mbu"]["llama"] == pytest.approx(0.4)
    assert s["disturbed_rounds"] == 1 and s["file_gb"] == pytest.approx(4.9)


def test_bracketed_mbu_divides_each_round_by_its_own_better_read():
    row = _row()
    for r, (ours, llama) in zip(row["rounds"], [([20, 25], [40, 10]), ([40, 40], [20, 20]),
                                                 ([30, 10], [25, 25])]):
        r["ours"]["read_gb_s_around_steps"], r["llama"]["read_gb_s_around_steps"] = ours, llama
    s = summarize(row, ceiling_gb_s=40.0)
    # ours: 4 GB a step at 200 / 210 / 190 ms = 20 / 19.05 / 21.05 GB/s over 25 / 40 / 30
    assert s["mbu_bracketed"]["ours"] == pytest.approx(0.7017, abs=1e-4)  # median of .8, .476, .702
    # llama.cpp: 16 / 13.3 / 20 GB/s over 40 / 20 / 25
    assert s["mbu_bracketed"]["llama"] == pytest.approx(2 / 3)  # median of .4, .667, .8
    assert summarize(_row(), 40.0)["mbu_bracketed"] == {"ours": None, "llama": None}  # no reads


def test_the_markdown_names_the_machine_and_marks_the_crash_workaround():
    row = _row()
    report = {"date": "2026-12-06T00:00:00+00:00", "rows": [row | {"summary": summarize(row, 40)}],
              "machine": {"cpu": "Some CPU", "cores": 2, "threads": 2, "amx": False,
                          "llama_cpp": "installed"},
              "bandwidth": {"ceiling_gb_s": 40.0, "median_gb_s": 30.0, "reads": [30.0, 40.0]},
              "settings": {"rounds": 3, "prompt": 64, "long": 512, "steps": 32, "agree": 16}}
    text = markdown(report)
    table = [line for line in text.splitlines() if line.startswith("|")]
    assert len({line.count("|") for line in table}) == 1  # header, rule and row line up
    assert "TTFT-512" in table[0] and "does not advertise AMX" in text
    assert "q4_k_m (extra buffers off: crashed with defaults)" in table[2]
    assert "| 120 / 150 | 0.80 |" in table[2] and "| 12/16 | 1/3 |" in table[2]


def test_agreement_of_equal_and_different_distributions():
    logits = np.linspace(-3, 3, 50).astype(np.float32)
    same = {"top": [[i, float(v)] for i, v in enumerate(logits)], "tokens": [49, 7, 8],
            "margins": [1.0, 1.0, 0.001]}
    got = agreement({"tokens": [49, 7, 9]}, logits, same)
    assert got["kl"] == pytest.approx(0.0, abs=1e-12) and got["top10_overlap"] == 10
    assert got["greedy_equal"] == 2 and got["equal_until_tie"] is True  # parted at the tie
    shuffled = np.random.default_rng(0).permutation(logits)
    other = agreement({"tokens": [1, 7, 8]}, shuffled, same)
    assert other["kl"] > 0.1 and other["top10_overlap"] < 10 and other["greedy_equal"] == 0


def test_prompt_ids_are_fixed_and_a_short_prompt_is_a_prefix():
    assert prompt_ids(64) == prompt_ids(512)[:64]
    assert all(256 <= i < 32000 for i in prompt_ids(512))


def test_synthetic_files_are_named_by_all_they_are_written_with(monkeypatch, tmp_path):
    monkeypatch.setenv("INFERENCE_EXPLORER_SYNTH", str(tmp_path))
    assert synth_dir() == tmp_path
    assert synthetic_path("8b", "q4_k_m").name == "8b-llama3-q4_k_m-llama3_1-s0.gguf"
    assert synthetic_path("135m", "q4_0", 3).name == "135m-llama-q4_0-llama2-s3.gguf"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore is Linux's")
def test_a_file_just_written_is_in_the_page_cache(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * (1 << 20))
    assert resident_fraction(path) == pytest.approx(1.0)


FAKE_PEER = """
import json, os, signal, sys
if "--no-extra-buffers" not in sys.argv:
    signal.signal(signal.SIGSEGV, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGSEGV)
print(json.dumps({"ready": True, "version": "fake", "load_s": 0.1, "n_vocab": 10}), flush=True)
for line in sys.stdin:
    if line.strip() == "quit":
        break
    n = json.loads(line)["tokens"]
    print(json.dumps({"tokens": [1] * n, "prefill_ms": 1.0, "step_ms": [1.0] * (n - 1)}), flush=True)
"""


def test_a_peer_that_crashes_with_its_defaults_runs_again_without_extra_buffers(monkeypatch,
                                                                                 tmp_path):
    script = tmp_path / "peer.py"
    script.write_text(FAKE_PEER)
    monkeypatch.setattr(gguf_peer, "PEER_PYTHON", sys.executable)
    monkeypatch.setattr(gguf_peer, "PEER_SCRIPT", script)
    worker, answer, note = gguf_peer.first_run(tmp_path / "m.gguf", 2, [5, 6], 3)
    with worker:
        assert note == gguf_peer.NO_EXTRA and not worker.extra_buffers
        assert answer["tokens"] == [1, 1, 1] and worker.peak_rss() > 0
        assert json.loads(json.dumps(worker.ask([5], 2)))["step_ms"] == [1.0]
    with pytest.raises(gguf_peer.PeerCrashed, match="status -11"):
        gguf_peer.Worker(tmp_path / "m.gguf", 2, extra_buffers=True)
