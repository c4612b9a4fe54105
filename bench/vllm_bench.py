"""vLLM (CPU build) vs this app's batched engine on the same 8-request load: throughput and TTFT /
ITL p50, measured side by side in one run, in rounds whose order alternates.

The load: the eight sample prompts (engine/remote/cli.py), chat-templated, 32 new tokens each, all
in flight together (concurrency 8 = the local engine's max batch), greedy. vLLM serves the same
float32 weights (engine/remote/server.py) on the same two cores; the local engine runs in this
process with no HTTP in the way, so vLLM's numbers include its API server and the trip over
loopback — that is what a user of a serving engine gets. No target: the number is the lesson.
Greedy tokens are compared each round (agreement or a near-tie, else the bench fails). Then
vLLM's prompt-lookup speculation on the Serving page's two samples: acceptance and tokens/s
against the same eager server without it (bench.spec_bench measures this app's).

The server is started here (torch.compile on unless --eager; the first compiled start takes
minutes, later ones reuse vLLM's compile cache) unless --base-url names a running one. Skipped,
with one line, when `make vllm` has not been run.

    python -m bench.vllm_bench [--rounds 3] [--tokens 32] [--eager] [--base-url URL]
                               [--out bench/out/vllm.json]
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # an entry point: offline unless asked, as the app

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
from datetime import datetime, timezone  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from engine import load_model  # noqa: E402
from engine.remote.cli import DEFAULT_PROMPTS  # noqa: E402
from engine.remote.compare import agreement, chat_text, run_local, side_by_side  # noqa: E402
from engine.remote.loadtest import LoadTest  # noqa: E402
from engine.remote.record import LoadConfig  # noqa: E402
from engine.remote.server import DEFAULT_PORT, is_installed, start_server  # noqa: E402
from engine.remote.summary import server_stats  # noqa: E402


def run(rounds: int = 3, tokens: int = 32, eager: bool = False, base_url: str | None = None,
        out: str | None = "bench/out/vllm.json",
        speculation: bool = True) -> dict[str, Any] | None:
    if base_url is None and not is_installed():
        print("vllm_bench: skipped (vLLM is not installed: `make vllm`)")
        return None
    lm = load_model()
    server = None
    if base_url is None:
        server = start_server(DEFAULT_PORT + 1, eager=eager)
        base_url = server.base_url
        print(f"vLLM healthy after {server.start_s:.0f} s ({'eager' if eager else 'compiled'})")
    try:
        config = LoadConfig(base_url, "", DEFAULT_PROMPTS, 8, tokens, 8)
        render = lambda p: chat_text(lm.tokenizer, p)  # noqa: E731
        LoadTest(config, render).run_all()  # warm-up: both engines once, untimed
        run_local(lm, config)
        rows: dict[str, list[Any]] = {"vllm": [], "local": []}
        for i in range(rounds):
            order = ("vllm", "local") if i % 2 == 0 else ("local", "vllm")
            for who in order:
                if who == "vllm":
                    remote = LoadTest(config, render).run_all()
                    rows["vllm"].append(remote)
                else:
                    rows["local"].append(run_local(lm, config))
            agree = agreement(lm, rows["local"][-1], rows["vllm"][-1])
            if not all(a.explained for a in agree):
                raise SystemExit(f"round {i}: greedy tokens differ beyond a near-tie: {agree}")
        report = _report(rows, eager if server else None, server.start_s if server else None,
                         agree)
    finally:
        if server is not None:
            server.stop()
    if speculation:
        report["speculation"] = _speculation(lm)
    print(json.dumps({k: report[k] for k in ("summary", "speculation") if k in report}, indent=1))
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(report, indent=1))
    return report


def _speculation(lm: Any) -> dict[str, Any]:
    """vLLM's prompt-lookup speculation (eager, this app's settings) on the Serving page's two
    samples, 96 tokens, one request at a time: its acceptance counters and tokens/s, beside an
    eager server without speculation on the same samples."""
    from engine.remote.server import DEFAULT_PORT as PORT
    from engine.serving.speculative import FREE_PROMPT, REWRITE_PROMPT

    render = lambda p: chat_text(lm.tokenizer, p)  # noqa: E731
    out: dict[str, Any] = {}
    for speculative in (False, True):
        with start_server(PORT + 2, eager=True, speculative=speculative) as server:
            for name, prompt in (("rewrite", REWRITE_PROMPT), ("free", FREE_PROMPT)):
                config = LoadConfig(server.base_url, "", (prompt,), 1, 96, 1)
                LoadTest(config, render).run_all()  # warm-up
                load = LoadTest(config, render).run_all()
                stats = server_stats(load)
                row = out.setdefault(name, {})
                key = "speculative" if speculative else "plain"
                row[f"{key}_tok_s"] = load.throughput_tok_s
                if speculative and stats is not None:
                    row["acceptance"] = stats.acceptance
                    row["tokens"] = load.output_tokens
                    row["chunks"] = len(load.requests[0].chunk_ms)
    for row in out.values():
        row["speedup"] = row["speculative_tok_s"] / row["plain_tok_s"]
    return out


def _report(rows: dict[str, list[Any]], eager: bool | None, start_s: float | None,
            agree: list[Any]) -> dict[str, Any]:
    per_round = []
    for remote, local in zip(rows["vllm"], rows["local"]):
        vllm_row, local_row = side_by_side(local, remote, "vLLM")
        server = server_stats(remote)
        per_round.append({"vllm": _row(vllm_row), "local": _row(local_row),
                          "vllm_server_ttft_mean_ms": server.ttft["mean"] if server else None})
    med = lambda who, key: statistics.median(r[who][key] for r in per_round)  # noqa: E731
    summary = {
        "vllm_tok_s": med("vllm", "throughput_tok_s"), "local_tok_s": med("local", "throughput_tok_s"),
        "vllm_over_local_throughput": statistics.median(
            r["vllm"]["throughput_tok_s"] / r["local"]["throughput_tok_s"] for r in per_round),
        "vllm_ttft_p50_ms": med("vllm", "ttft_p50"), "local_ttft_p50_ms": med("local", "ttft_p50"),
        "vllm_itl_p50_ms": med("vllm", "itl_p50"), "local_itl_p50_ms": med("local", "itl_p50"),
        "greedy_equal_requests": sum(a.equal is True for a in agree), "requests": len(agree),
        "vllm_mode": None if eager is None else "eager" if eager else "compiled",
        "vllm_start_s": start_s,
    }
    return {"date": datetime.now(timezone.utc).isoformat(timespec="minutes"),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores", "summary": summary,
            "rounds": per_round}


def _row(row: Any) -> dict[str, Any]:
    return {k: getattr(row, k) for k in row.__slots__}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--eager", action="store_true")
    parser.add_argument("--base-url", default=None)
    parser.add_argument("--out", default="bench/out/vllm.json")
    parser.add_argument("--no-speculation", action="store_true")
    a = parser.parse_args()
    run(a.rounds, a.tokens, a.eager, a.base_url, a.out, not a.no_speculation)
