"""A serving run in detail, on the Serving page: the block pool and block tables at any
recorded step, and every request's prompt, answer and times."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from charts.serving import block_grid_chart, finish_name, step_name
from engine.serving.metrics import peak_step
from engine.serving.record import ServingRun
from i18n import _
from ui.common import show_chart
from ui.tables import show_table


def block_tables(run: ServingRun) -> None:
    """The block grid at any recorded step, and that step's block tables."""
    st.subheader(_("Block tables, step by step"))
    if not run.steps:
        st.info(_("No step was recorded."))
        return
    last = len(run.steps) - 1
    pick = st.slider(_("Step"), 0, last, peak_step(run), key="serving_step",
                     help=_("Starts at the step with the most blocks in use.")) if last else 0
    show_chart(block_grid_chart(run, pick), name="block pool")
    step = run.steps[pick]
    if not step.tables:
        st.caption(_("After step {step} no request is running: every block is free.").format(
            step=step.index))
        return
    rows = [{_("request"): row.request, _("tokens"): row.tokens,
             _("block table (logical → physical)"): " ".join(map(str, row.blocks)),
             _("empty slots in its last block"): len(row.blocks) * run.config.block_size
             - row.tokens}
            for row in step.tables]
    show_table(pd.DataFrame(rows), hide_index=True, width="stretch")
    values = {"step": step.index, "kind": step_name(step.kind), "ms": step.ms,
              "requests": ", ".join(map(str, step.requests)), "positions": sum(step.new_tokens),
              "shared": step.shared_blocks, "copied": step.copied_blocks,
              "waiting": step.waiting, "preempted": ", ".join(map(str, step.preempted)),
              "empty": step.empty_slots(run.config.block_size)}
    st.caption((_("Step {step} ({kind}, {ms:.1f} ms): requests {requests}; positions computed: "
                  "{positions}; blocks shared: {shared}, copied on write: {copied}; requests "
                  "waiting: {waiting}; preempted: {preempted}. Waste: empty slots: {empty}, at "
                  "most block size − 1 per request (contiguous preallocation would reserve "
                  "every request's maximum length up front).") if step.preempted else
                _("Step {step} ({kind}, {ms:.1f} ms): requests {requests}; positions computed: "
                  "{positions}; blocks shared: {shared}, copied on write: {copied}; requests "
                  "waiting: {waiting}. Waste: empty slots: {empty}, at most block size − 1 per "
                  "request (contiguous preallocation would reserve every request's maximum "
                  "length up front).")).format(**values))


def requests_table(run: ServingRun) -> None:
    with st.expander(_("Every request: prompt, answer, times"), key="serving_requests"):
        show_table(pd.DataFrame([{
            _("request"): r.id, _("arrival (ms)"): r.spec.arrival_ms, _("queue (ms)"): r.queue_ms,
            _("TTFT (ms)"): r.ttft_ms, _("TPOT (ms)"): r.tpot_ms,
            _("prompt tokens"): len(r.spec.prompt_token_ids),
            _("from shared blocks"): r.cached_tokens, _("output tokens"): len(r.token_ids),
            _("preempted"): r.preemptions, _("finish"): finish_name(r.finish),
            _("answer"): r.text, _("prompt"): r.spec.prompt} for r in run.requests]).round(1),
            hide_index=True, width="stretch")
