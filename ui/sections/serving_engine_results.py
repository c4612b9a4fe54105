"""The Serving engine page's results (pages/serving_engine.py): what the client measured beside
what the server's /metrics counted, the server's counters over the load, errors, and the same
load on this app's engine — side by side, whether the greedy tokens agree, and why the speeds
differ, from what was measured."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from charts.formatting import duration, rate
from charts.remote import finish_name
from engine import EngineError
from engine.remote.compare import NEAR_TIE, Agreement, SideBySide, side_by_side
from engine.remote.record import LoadRun
from engine.remote.summary import (
    CLIENT_DELAY_LIMIT,
    ClientStats,
    ServerStats,
    client_delay,
    client_stats,
    server_stats,
)
from engine.serving.record import ServingRun
from engine.timing.disturbance import OTHERS_LIMIT
from i18n import N_, _, chinese
from ui.experiment import Job, run_experiment
from ui.record import keep_remote
from ui.results import RemoteResults
from ui.sections.serving import busy_warning, cpu_watch
from ui.sections.serving_engine import DEFAULT_URL, LOCAL, YOUR_LOAD, hosted
from ui.state import loaded_model, remote_results, session_model
from ui.tables import show_table
from ui.text import message, plain

CLIENT_VS_SERVER = N_("The client's TTFT also holds what the server's cannot see: the HTTP "
                      "request, tokenizing and queueing in its API process, and the trip back; "
                      "the server's histograms count only into fixed buckets, so their quantiles "
                      "are estimates (≈, Prometheus's histogram_quantile) and their means, sum ÷ "
                      "count, are exact. The client's ITL mean is per token (Σ last − first token "
                      "÷ Σ tokens − 1), as the server's is; its percentiles are per streamed "
                      "chunk. Completed requests only.")
# Shown column names (the frames keep their English columns, which tests and code read).
LATENCY_COLUMNS = {"metric": N_("metric"), "client (ms)": N_("client (ms)"),
                   "server /metrics (ms)": N_("server /metrics (ms)"),
                   "client − server (ms)": N_("client − server (ms)")}
REQUEST_COLUMNS = {"request": N_("request"), "sent (s)": N_("sent (s)"),
                   "TTFT (ms)": N_("TTFT (ms)"), "TPOT (ms)": N_("TPOT (ms)"),
                   "e2e (ms)": N_("e2e (ms)"), "prompt tokens": N_("prompt tokens"),
                   "output tokens": N_("output tokens"), "finish": N_("finish"),
                   "answer": N_("answer"), "prompt": N_("prompt")}
SIDE_COLUMNS = {"engine": N_("engine"), "output tokens": N_("output tokens"),
                "throughput (tokens/s)": N_("throughput (tokens/s)"),
                "TTFT p50 (ms)": N_("TTFT p50 (ms)"), "TTFT p90 (ms)": N_("TTFT p90 (ms)"),
                "ITL p50 (ms)": N_("ITL p50 (ms)"), "ITL p90 (ms)": N_("ITL p90 (ms)"),
                "e2e p50 (ms)": N_("e2e p50 (ms)")}
AGREEMENT_COLUMNS = {"request": N_("request"), "same prompt tokens": N_("same prompt tokens"),
                     "same output": N_("same output"), "parts at token": N_("parts at token"),
                     "top-2 logit gap there": N_("top-2 logit gap there"),
                     "near-tie": N_("near-tie")}
LOCAL_ENGINE = N_("this app's engine")  # engine/remote/compare.py's name for this app's row


def shown(frame: pd.DataFrame, columns: dict[str, str]) -> pd.DataFrame:
    """`frame` with its columns named in the session's language, just before it is drawn."""
    return frame.rename(columns={k: _(v) for k, v in columns.items()})


def sentences(*parts: str) -> str:
    """Whole sentences one after another: a space between them in English, none after a
    Chinese full stop."""
    return ("" if chinese() else " ").join(p for p in parts if p)


def _ms(value: float | None, approx: bool = False) -> str:
    return "–" if value is None else ("≈ " if approx else "") + f"{value:,.1f}"


def latency_table(client: ClientStats, server: ServerStats | None) -> pd.DataFrame:
    """TTFT and ITL mean/p50/p90 from the client and from the server's histograms over the load
    (last /metrics sample minus the first), and client − server."""
    rows = []
    for metric, mine, theirs in (("TTFT", client.ttft, server.ttft if server else {}),
                                 ("ITL", client.itl, server.itl if server else {})):
        for stat in ("mean", "p50", "p90"):
            c, s = mine.get(stat), theirs.get(stat)
            if metric == "ITL" and stat == "mean":  # per token, as the server's mean counts
                c = client.itl_per_token_ms
            label = _("{metric} mean").format(metric=metric) if stat == "mean" else \
                f"{metric} {stat}"
            rows.append({"metric": label, "client (ms)": _ms(c),
                         "server /metrics (ms)": _ms(s, approx=stat != "mean"),
                         "client − server (ms)": "–" if c is None or s is None else
                         ("≈ " if stat != "mean" else "") + f"{c - s:+,.1f}"})
    return pd.DataFrame(rows)


def summary_metrics(run: LoadRun, client: ClientStats) -> None:
    cols = st.columns(5)
    cols[0].metric(_("Throughput"), rate(client.throughput_tok_s), help=_(
        "Output tokens ÷ (last token − first request sent): {tokens} tokens in {time}.").format(
            tokens=client.output_tokens, time=duration(run.duration_ms)))
    cols[1].metric("TTFT p50", duration(client.ttft["p50"]), help=_(
        "Time to first token = first streamed token − request sent, on the client; median over "
        "requests (p90: {p90}, p99: {p99}).").format(p90=duration(client.ttft["p90"]),
                                                     p99=duration(client.ttft["p99"])))
    cols[2].metric("ITL p50", duration(client.itl["p50"]), help=_(
        "Every gap between a request's consecutive streamed chunks, median over all of them "
        "(p90: {p90}, p99: {p99}).").format(p90=duration(client.itl["p90"]),
                                            p99=duration(client.itl["p99"])))
    cols[3].metric("TPOT p50", duration(client.tpot["p50"]), help=_(
        "Per request: (last − first token) ÷ (output tokens − 1); median over requests."))
    cols[4].metric(_("Requests done"), f"{client.requests_done} / {len(run.requests)}",
                   help=_("Finished with a length limit or a stop token (not an error, not "
                          "stopped)."))


def counters(server: ServerStats | None, run: LoadRun) -> None:
    """The server's counters over the load, each said with its formula."""
    if server is None:
        st.info(_("No server view: {reason}").format(reason=message(run.metrics_error))
                if run.metrics_error else
                _("No server view: fewer than two /metrics samples were taken."))
        return
    cols = st.columns(5)
    pct = "–" if server.peak_kv_usage is None else f"{100 * server.peak_kv_usage:.1f} %"
    cols[0].metric(_("Peak running"), _count(server.peak_running), help=_(
        "Most requests in the server's batch at one /metrics sample "
        "(vllm:num_requests_running)."))
    cols[1].metric(_("Peak waiting"), _count(server.peak_waiting), help=_(
        "Most requests queued inside the server at one sample (vllm:num_requests_waiting)."))
    cols[2].metric(_("Peak KV usage"), pct, help=_(
        "Largest share of its KV-cache blocks in use at one sample (vllm:kv_cache_usage_perc)."))
    cols[3].metric(_("Preemptions"), _count(server.preemptions), help=_(
        "Requests the server evicted to free KV blocks and recomputed later, over the load "
        "(counter delta)."))
    hit = server.prefix_hit_rate
    cols[4].metric(_("Prefix-cache hits"), "–" if hit is None else f"{hit:.0%}", help=_(
        "Prompt tokens found in its prefix cache ÷ prompt tokens looked up: {hits} of {queries} "
        "over the load.").format(hits=_count(server.prefix_hits),
                                 queries=_count(server.prefix_queries)))
    spec = (_("Speculative decoding is off on this server (it exports no draft counters).")
            if server.acceptance is None else
            _("Speculative decoding accepted {share} of drafted tokens ({accepted} of "
              "{drafted}).").format(share=f"{server.acceptance:.0%}",
                                    accepted=_count(server.spec_accepted),
                                    drafted=_count(server.spec_drafts)))
    made = ("" if server.generation_tokens is None else
            _("It counted {generated} generated tokens; the client received {received}.").format(
                generated=_count(server.generation_tokens), received=run.output_tokens))
    st.caption(sentences(made, _(
        "Counters are the last /metrics sample minus the first (taken before the first "
        "request); peaks are over {n} samples.").format(n=len(run.samples)), spec))


def _count(x: float | None) -> str:
    return "–" if x is None else f"{x:,.0f}"


def errors(run: LoadRun) -> None:
    """One message for the run, one for its /metrics, one line per failed request."""
    if run.error:
        st.error(_("The load failed: {error}").format(error=message(run.error)))
    if run.metrics_error and run.samples:
        st.warning(_("Part of the server's metrics is missing: {error}").format(
            error=message(run.metrics_error)))
    failed = [r for r in run.requests if r.error]
    if failed:
        st.warning("\n".join(_("- request {id}: {error} (its {tokens} tokens are kept)").format(
            id=r.id, error=message(r.error), tokens=r.output_tokens) for r in failed))


def results_section(run: LoadRun) -> None:
    st.subheader(_("Client and server, side by side"))
    client, server = client_stats(run), server_stats(run)
    summary_metrics(run, client)
    st.table(shown(latency_table(client, server), LATENCY_COLUMNS), hide_index=True)
    st.caption(_(CLIENT_VS_SERVER))
    delay = client_delay(client, server)
    if delay is not None and delay > CLIENT_DELAY_LIMIT:
        st.warning(_("The client's gaps between tokens are {delay} % longer than the server's own "
                     "histogram says (more than {limit} %): this machine was busy — the page's "
                     "drawing shares the cores with the client's streams — so the client's ITL "
                     "here is not the engine's; the server's column is. `python -m engine "
                     "loadtest` measures the same load without a page.").format(
                         delay=f"{100 * delay:.0f}", limit=f"{100 * CLIENT_DELAY_LIMIT:.0f}"))
    counters(server, run)
    errors(run)
    with st.expander(_("Every request: prompt, answer, times"), key="remote_requests"):
        show_table(shown(pd.DataFrame([{
            "request": r.id, "sent (s)": None if r.sent_ms is None else r.sent_ms / 1000,
            "TTFT (ms)": r.ttft_ms, "TPOT (ms)": r.tpot_ms, "e2e (ms)": r.e2e_ms,
            "prompt tokens": r.prompt_tokens, "output tokens": r.output_tokens,
            "finish": finish_name(r.finish), "answer": r.text, "prompt": r.prompt} for r in run.requests]
            ).round(2), REQUEST_COLUMNS), hide_index=True, width="stretch")


def compare_section(run: LoadRun, label: str) -> None:
    """The same load on this app's engine (in this process, under the model turn), beside the
    server's: a table with the same definitions, agreement of the greedy tokens, and why."""
    st.subheader(_("Same load on this app's engine"))
    found = remote_results()
    lm = loaded_model()
    if label == YOUR_LOAD and not hosted() and lm is not None and st.button(
            _("Run the same load here"), icon=":material/compare_arrows:", key="remote_run_here",
            help=_("The same prompts, chat template, output limits and arrivals on this app's "
                   "batched engine (continuous batching, max batch = the load's concurrency), "
                   "greedy; the Serving page shows its steps.")):
        found = run_local(run) or found
    if found.local is None:
        st.caption(_("Run a load above, then run it here too: same prompts, same greedy outputs "
                     "(checked token by token), different speed. A file's load is shown as "
                     "recorded; nothing is re-run."))
        return
    st.caption(_("This app's engine: {name}, in this process.").format(
        name=plain(found.local_name)))
    busy_warning(found.local_share, N_("the local run"), runs=(found.local,))
    rows = side_by_side(found.local, run, _("server ({name})").format(name=run.server))
    st.table(shown(side_table(rows), SIDE_COLUMNS), hide_index=True)
    st.caption(_("Completed requests; TTFT and end-to-end from the moment each request got its "
                 "slot (sent, for the server; admitted into the batch, for this app's engine), "
                 "so the concurrency limit's wait counts on neither side. ITL: every gap between "
                 "consecutive tokens (chunks, for the server)."))
    st.markdown(agreement_text(found.agreement))
    if any(a.equal is not None for a in found.agreement):
        with st.expander(_("Per request: prompt tokens, output tokens, where they part"),
                         expanded=any(a.equal is False for a in found.agreement),
                         key="remote_agreement"):
            show_table(shown(agreement_table(found.agreement), AGREEMENT_COLUMNS),
                       hide_index=True, width="stretch")
    busy = bool(found.local.delayed_steps()) or (found.local_share or 0.0) >= OTHERS_LIMIT
    st.markdown(why_text(rows, server_stats(run), client_stats(run), found.agreement,
                         eager=LOCAL.eager and run.config.base_url == DEFAULT_URL, busy=busy))


def run_local(run: LoadRun) -> RemoteResults | None:
    """Run the load's config on the session's model, under the model turn, with progress."""
    from engine.remote.compare import agreement, local_config, local_requests
    from engine.serving.engine import ServingEngine

    model = session_model()
    lm = model.lm
    if model.source != "default" or model.weights != "fp32":
        st.warning(_("The server serves the default model in float32; this session runs "
                     "{model} with {weights} weights, so the tokens will differ for that reason "
                     "too.").format(model=plain(model.source), weights=plain(model.weights)))
    total = run.config.requests * run.config.max_new_tokens

    def work(job: Job) -> tuple[ServingRun, float | None, tuple[Agreement, ...]]:
        specs = local_requests(lm.tokenizer, run.config)
        others = cpu_watch(lm.device)
        engine = ServingEngine(lm, specs, local_config(run.config, specs), stop_event=job.stop,
                               weights=model.weights)
        done = 0
        for step in engine:
            done += step.batch_size
            job.progress(done / total, _("This app's engine, step {step}: {done} of at most "
                                         "{total} tokens").format(step=step.index + 1, done=done,
                                                                  total=total))
        local = engine.record()
        share = others()
        job.progress(1.0, _("Checking where the greedy tokens part (one forward each)…"))
        return local, share, tuple(agreement(lm, local, run))

    found = run_experiment(work, progress=_("Starting…"), failed=_("The local run failed: "),
                           errors=(EngineError, ValueError))
    if found is None:
        return None
    local, share, agree = found
    name = _("{model}, {weights} weights").format(model=lm.spec.name.split(" (")[0],
                                                  weights=model.weights)
    return keep_remote(local=local, local_name=name, agreement=agree, local_share=share)


def side_table(rows: list[SideBySide]) -> pd.DataFrame:
    return pd.DataFrame([{
        "engine": _(LOCAL_ENGINE) if r.engine == LOCAL_ENGINE else r.engine,
        "output tokens": f"{r.output_tokens:,}",
        "throughput (tokens/s)": f"{r.throughput_tok_s:,.1f}",
        "TTFT p50 (ms)": _ms(r.ttft_p50), "TTFT p90 (ms)": _ms(r.ttft_p90),
        "ITL p50 (ms)": _ms(r.itl_p50), "ITL p90 (ms)": _ms(r.itl_p90),
        "e2e p50 (ms)": _ms(r.e2e_p50)} for r in rows])


def agreement_table(agree: tuple[Agreement, ...]) -> pd.DataFrame:
    def yes(x: bool | None) -> str:
        return "–" if x is None else _("yes") if x else _("no")

    return pd.DataFrame([{
        "request": a.id, "same prompt tokens": yes(a.same_prompt), "same output": yes(a.equal),
        "parts at token": "–" if a.first_diff is None else str(a.first_diff),
        "top-2 logit gap there": "–" if a.gap is None else f"{a.gap:.4f}",
        "near-tie": "–" if a.gap is None else yes(a.gap < NEAR_TIE)} for a in agree])


def agreement_text(agree: tuple[Agreement, ...]) -> str:
    known = [a for a in agree if a.equal is not None]
    if not known:
        return _("The server returned no token ids, so the outputs cannot be compared token by "
                 "token.")
    equal = sum(1 for a in known if a.equal)
    parted = [a for a in known if a.equal is False]
    text = _("**Greedy tokens equal for {equal} of {n} requests.**").format(equal=equal,
                                                                           n=len(known))
    if parted:
        unexplained = [a for a in parted if not a.explained]
        text = sentences(text, _(
            "Where they part, the local model's top-2 logits are within {tie} (a near-tie: two "
            "implementations round differently).").format(tie=NEAR_TIE) if not unexplained else _(
            "{n} request(s) part where the top-2 gap is ≥ {tie}: not a near-tie, so not explained "
            "by rounding (a different model, prompt or template?).").format(
                n=len(unexplained), tie=NEAR_TIE))
    return text


def why_text(rows: list[SideBySide], server: ServerStats | None, client: ClientStats,
             agree: tuple[Agreement, ...], eager: bool = False, busy: bool = False) -> str:
    """'Same prompts, same outputs (greedy), different speed — and why', from measured numbers
    only: the throughputs, the per-token gaps on both sides of the server's API, and the part of
    its TTFT spent outside its engine."""
    remote, local = rows[0], rows[-1]
    if len(rows) < 2 or not remote.throughput_tok_s or not local.throughput_tok_s:
        return ""
    ratio = local.throughput_tok_s / remote.throughput_tok_s
    faster = (_("ours {ratio}× as fast here").format(ratio=f"{ratio:.2f}") if ratio >= 1 else
              _("the server {ratio}× as fast here").format(ratio=f"{1 / ratio:.2f}"))
    known = [a for a in agree if a.equal is not None]
    same = (_("same outputs for {equal} of {n} requests").format(
        equal=sum(1 for a in known if a.equal), n=len(known))
            if known else _("outputs not comparable (no token ids)"))
    head = _("**Same prompts, {same} (greedy), different speed — and why.**").format(same=same)
    speeds = {"ours": f"{local.throughput_tok_s:,.1f}", "theirs": f"{remote.throughput_tok_s:,.1f}",
              "faster": faster, "ours_itl": _ms(local.itl_p50), "their_itl": _ms(remote.itl_p50)}
    if server is not None and server.itl["mean"] is not None \
            and client.itl_per_token_ms is not None:
        inside, seen = server.itl["mean"], client.itl_per_token_ms
        if inside >= 0.8 * seen:
            per_token = _(
                "This app's engine made {ours} tokens/s, the server {theirs} ({faster}). Per "
                "token (ITL p50) ours took {ours_itl} ms and the server's stream {their_itl} ms; "
                "the server's own histogram puts {inside} ms of its {seen} ms mean gap inside its "
                "engine, so the per-token difference is in the engines' steps (kernels, "
                "batching), not in HTTP.").format(inside=_ms(inside), seen=_ms(seen), **speeds)
        else:
            per_token = _(
                "This app's engine made {ours} tokens/s, the server {theirs} ({faster}). Per "
                "token (ITL p50) ours took {ours_itl} ms and the server's stream {their_itl} ms; "
                "the server's own histogram puts {inside} ms of its {seen} ms mean gap inside its "
                "engine, so {outside} ms of every gap is spent outside it (streaming over HTTP, "
                "its API process).").format(inside=_ms(inside), seen=_ms(seen),
                                            outside=f"{seen - inside:,.1f}", **speeds)
    else:
        per_token = _("This app's engine made {ours} tokens/s, the server {theirs} ({faster}). "
                      "Per token (ITL p50) ours took {ours_itl} ms and the server's stream "
                      "{their_itl} ms.").format(**speeds)
    parts = [head, per_token]
    if server is not None and server.ttft["mean"] is not None and client.ttft["mean"] is not None:
        outside = client.ttft["mean"] - server.ttft["mean"]
        parts.append(_("Of the server's TTFT ({mean} ms mean on the client), {outside} ms was "
                       "outside its engine: the HTTP request, its API process and the trip back, "
                       "which ours, in this process, does not pay.").format(
                           mean=_ms(client.ttft["mean"]), outside=f"{outside:,.1f}"))
    if eager:
        parts.append(_("The server was started by this app in eager mode (no torch.compile)."))
    if busy:
        parts.append(_("Other work on this machine delayed the local run (see the warning "
                       "above): its times are slower than this machine's best."))
    return sentences(*parts)
