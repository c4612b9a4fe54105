"""The GGUF benchmark's rounds reduced to one row per (shape, type), and the markdown table.

Apart from bench/gguf_bench.py so the reduction can be tested on made-up rounds without running
either engine (tests/test_gguf_bench.py). Medians over rounds; a ratio is the median of each
round's own ratio (ours ÷ llama.cpp in the same round: paired, so a slow stretch of a shared
machine that falls on one round counts once, for both).
"""

from __future__ import annotations

import statistics
from typing import Any

TIMES = ("ttft_ms", "ttft_long_ms", "itl_ms")


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def summarize(row: dict, ceiling_gb_s: float) -> dict:
    """One row's medians, paired ratios, MBU and roof (see bench/gguf_bench.py's docstring)."""
    rounds = row["rounds"]
    paired = [r for r in rounds if "llama" in r]
    out: dict[str, Any] = {"file_gb": row["file_bytes"] / 1e9, "rounds": len(rounds),
                           "disturbed_rounds": sum(bool(r["disturbed"]) for r in rounds)}
    for key in ("open_s", "peak_rss", "cold_ttft_ms", *TIMES):
        out[key] = {"ours": _median([r["ours"][key] for r in rounds]),
                    "llama": _median([r["llama"][key] for r in paired])}
    for key in TIMES:
        out[key]["ratio"] = _median([r["ours"][key] / r["llama"][key] for r in paired
                                     if r["ours"][key] and r["llama"][key]])
    read = rounds[0]["ours"]["step_read_bytes"]
    out["step_read_bytes"] = read
    out["roof_itl_ms"] = read / (ceiling_gb_s * 1e9) * 1000 if ceiling_gb_s else None
    out["mbu"] = {k: (read / (v / 1000) / 1e9 / ceiling_gb_s if v and ceiling_gb_s else None)
                  for k, v in out["itl_ms"].items() if k != "ratio"}
    out["mbu_bracketed"] = {k: _median([_bracketed(read, r[k]) for r in rounds if k in r])
                            for k in ("ours", "llama")}
    out["resident_before"] = min((r[k]["resident_before"] for r in rounds for k in ("ours", "llama")
                                  if k in r and r[k]["resident_before"] is not None), default=None)
    out["agreement"] = row.get("agreement")
    out["note"] = row.get("note", "")
    return out


def _bracketed(read: int, run: dict) -> float | None:
    """MBU against the better of two plain reads taken right before and right after the timed
    steps (the bandwidth of that stretch of a VM whose bandwidth changes in states that last
    seconds), rather than the best read of the whole run."""
    around = run.get("read_gb_s_around_steps")
    if not around or not run.get("itl_ms"):
        return None
    return read / (run["itl_ms"] / 1000) / 1e9 / max(around)


def _num(value: float | None, digits: int) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _pair(cell: dict, digits: int, scale: float = 1.0) -> str:
    def one(v: float | None) -> str:
        return _num(None if v is None else v / scale, digits)

    return f"{one(cell['ours'])} / {one(cell['llama'])}"




def header(prompt: int, long: int) -> str:
    return ("| shape | type | file GB | open s ours / llama.cpp | peak RSS GB ours / llama.cpp "
            f"| TTFT-{prompt} ms ours / llama.cpp | ratio | TTFT-{long} ms ours / llama.cpp "
            "| ratio | ITL ms ours / llama.cpp | ratio | MBU ours / llama.cpp "
            "| MBU bracketed ours / llama.cpp | roof ITL ms | KL "
            "| top-10 | greedy equal | disturbed rounds |")


def table_row(row: dict) -> str:
    s = row["summary"]
    agree = s["agreement"] or {}
    greedy = (f"{agree['greedy_equal']}/{agree['greedy_of']}" if agree else "–")
    kind = row["type"] + (f" ({s['note']})" if s["note"] else "")
    cells = [row["shape"], kind, _num(s["file_gb"], 2), _pair(s["open_s"], 2),
             _pair(s["peak_rss"], 2, 1e9),
             _pair(s["ttft_ms"], 0), _num(s["ttft_ms"]["ratio"], 2),
             _pair(s["ttft_long_ms"], 0), _num(s["ttft_long_ms"]["ratio"], 2),
             _pair(s["itl_ms"], 2), _num(s["itl_ms"]["ratio"], 2),
             _pair(s["mbu"], 2), _pair(s["mbu_bracketed"], 2), _num(s["roof_itl_ms"], 2),
             f"{agree['kl']:.1e}" if agree else "–",
             f"{agree['top10_overlap']}/10" if agree else "–", greedy,
             f"{s['disturbed_rounds']}/{s['rounds']}"]
    return "| " + " | ".join(cells) + " |"


def markdown(report: dict) -> str:
    """The table with the lines a reader needs to judge it: date, machine, AMX, bandwidth, and
    what each column means where it is not plain."""
    m, bw, st = report["machine"], report["bandwidth"], report["settings"]
    head = header(st["prompt"], st["long"])
    amx = {True: "advertises AMX (amx_tile)", False: "does not advertise AMX (no amx_tile)",
           None: "AMX unknown (no /proc/cpuinfo)"}[m["amx"]]
    lines = [f"`python -m bench.gguf_bench`, {report['date']}, {m['cpu']}, {m['cores']} usable "
             f"cores, {m['threads']} threads; the CPU {amx}; llama.cpp: {m['llama_cpp']}. "
             f"Read bandwidth with {m['threads']} threads: best {bw['ceiling_gb_s']:.1f} GB/s "
             f"(median {bw['median_gb_s']:.1f} of {len(bw['reads'])} reads). Rounds: "
             f"{st['rounds']}; {st['prompt']}- and {st['long']}-token prompts, ITL the median of "
             f"{st['steps']} steps, {st['agree']} greedy tokens compared.", "", head,
             "|" + "---|" * (head.count(" | ") + 1)]
    lines += [table_row(row) for row in report["rows"]]
    resident = [r["summary"]["resident_before"] for r in report["rows"]
                if r["summary"]["resident_before"] is not None]
    lines += ["", "Ratios are ours ÷ llama.cpp (below 1: ours is faster), the median of each "
              "round's own ratio. MBU and the roof count the bytes a decode step reads (the "
              "stored weights, an untied embedding for one row, our float32 KV cache); MBU divides by "
              "the run's best read, MBU bracketed by the better of two reads right before and "
              "right after each engine's timed steps (ours: the matrices a step streams, read "
              "plainly in its process; llama.cpp's: the benchmark's buffer, read by the parent), "
              "median over rounds. KL is "
              "KL(llama.cpp ‖ ours) of the first step's distribution. Peak RSS: each process's "
              "high-water mark (VmHWM), the mapped file's touched pages included."]
    if resident:
        lines.append(f"Share of each file in the page cache before a measurement: at least "
                     f"{min(resident):.0%} (nothing was dropped).")
    return "\n".join(lines)
