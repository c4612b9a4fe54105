"""The KV cache page's "A long context to feel it": the unmodified model's KV bytes, TTFT and ITL
as the prompt grows, measured; and a needle in a haystack read by each shrinking method
(engine/kv/shrink/needle.py), with the methods and budgets chosen above."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from charts.kv_shrink import long_context_chart
from engine import LoadedModel
from engine.kv.shrink.budget import Shrink, described
from engine.kv.shrink.needle import (
    DECODE_STEPS,
    NEEDLE,
    NeedleRun,
    long_context,
    needle_probe,
    per_token_growth,
)
from engine.timing.disturbance import advice
from i18n import _
from ui.common import show_chart
from ui.config import config
from ui.experiment import Job, run_experiment
from ui.record import keep_experiments
from ui.state import current_experiments
from ui.tables import show_table
from ui.text import listed

LENGTHS = (256, 512, 1024, 2048, 4096)


def longest(lm: LoadedModel) -> int:
    """The longest prompt this server runs: the model's context and the per-click limits."""
    limit = config().limits.sequence_tokens
    return min(limit, lm.spec.max_context or limit)


def long_section(lm: LoadedModel | None, shrinks: list[Shrink]) -> None:
    st.subheader(_("A long context to feel it"))
    if lm is None:
        st.info(_("Needs the model loaded."))
        return
    lengths = [n for n in LENGTHS if n <= longest(lm)]
    if not lengths:
        st.info(_("This server's limits leave no room for a long prompt."))
        return
    st.markdown(_("Prompts of {lengths} tokens (public-domain text), each prefilled and then "
                  "decoded for {steps} steps: the cache grows with every token; the chart shows "
                  "what that does to the time to the first token and to each decode "
                  "step.").format(
        lengths=listed([f"{n:,}" for n in lengths]), steps=DECODE_STEPS))
    if st.button(_("Measure each length"), icon=":material/straighten:", key="kv_long_measure"):
        def work(job: Job):
            done = []
            for n in lengths:
                done += long_context(lm, [n], job.stop)
                job.progress(len(done) / len(lengths), _("{n:,} tokens").format(n=n))
            return tuple(done)

        run_experiment(work, progress=_("Prefilling the shortest prompt…"),
                       keep=lambda found: keep_experiments(long_context=found))
    points = list(current_experiments().long_context)
    if points:
        show_chart(long_context_chart(points), name="kv long context")
        st.caption(_("Measured on this machine, the unmodified model; the cache grows by "
                     "{per:,.0f} B per token (2 · layers · KV heads · head_dim · 4 B in "
                     "float32).").format(per=per_token_growth(points)))
        delayed = [p.tokens for p in points if p.delayed]
        if delayed:
            st.warning(_("Other work on this machine delayed the lengths {lengths} (hollow "
                         "points): their times show the machine, not the model. {advice}").format(
                lengths=listed([f"{n:,}" for n in delayed]), advice=advice(config().hosted)),
                icon=":material/hourglass_top:")
        _shell("--lengths " + " ".join(str(p.tokens) for p in points))
    _needle(lm, lengths, shrinks)


def _needle(lm: LoadedModel, lengths: list[int], shrinks: list[Shrink]) -> None:
    st.markdown(_("**A needle in a haystack**: the English sentence “{needle}” placed at a "
                  "chosen depth of a long English text (the public-domain texts above), then the "
                  "question. Each method reads it with the budgets chosen above; it finds the "
                  "needle when every digit of the answer is its most probable "
                  "token.").format(needle=NEEDLE))
    c1, c2 = st.columns(2)
    tokens = c1.select_slider(_("Haystack (tokens)"), lengths, value=lengths[min(2, len(lengths) - 1)],
                              key="kv_needle_tokens")
    depth = c2.slider(_("Depth of the needle"), 0, 100, 25, step=5, format="%d%%",
                      key="kv_needle_depth")
    if st.button(_("Hide the needle and ask"), icon=":material/search:", key="kv_needle_run"):
        def work(job: Job) -> NeedleRun:
            return NeedleRun(tokens, depth / 100, tuple(needle_probe(
                lm, shrinks, tokens, depth / 100, job.stop, say=job.say)))

        run_experiment(work, progress=_("Reading the haystack with the unmodified model…"),
                       keep=lambda found: keep_experiments(needle=found))
    found = current_experiments().needle
    if found is not None:
        number = st.column_config.NumberColumn
        show_table(pd.DataFrame([{
            "method": _("unmodified model") if r.method is None else described(r.method, r.budget),
            "found": "✓" if r.found else "✗", "logp": r.answer_logprob, "held": r.kv_bytes / 2**20}
            for r in found.results]), hide_index=True, html=True, column_config={
            "method": _("method · budget"), "found": _("finds the needle"),
            "logp": number(_("log p(answer)"), format="%.2f"),
            "held": number(_("KV held (MiB)"), format="%.1f")})
        st.caption(_("A haystack of {tokens:,} tokens, the needle at {depth:.0%} of it; log p is "
                     "the answer's digits' log-probability, teacher-forced (0 is certain).").format(
            tokens=found.tokens, depth=found.depth))
        pairs = [r for r in found.results if r.method is not None]
        if pairs:
            _shell(f"--needle {found.tokens} --depth {found.depth:g} --method "
                   + " ".join(dict.fromkeys(r.method for r in pairs)) + " --budget "
                   + " ".join(dict.fromkeys(r.budget for r in pairs)))


def _shell(arguments: str) -> None:
    st.caption(_("The same numbers from the shell:"))
    st.code(f"python -m engine kv-shrink {arguments} --json", language="bash")
