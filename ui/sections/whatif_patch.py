"""What if's "Patch activations": a clean and a corrupted prompt of the same token length; for
every layer and position, the corrupted run with the clean run's residual stream put in there,
and how much of the clean answer comes back (engine/whatif/patch.py)."""

from __future__ import annotations

import numpy as np
import streamlit as st

from charts.tokens import shown_piece
from charts.whatif import patch_heatmap
from engine.forward import prepare_prompt
from engine.whatif.patch import check_pair, patch_grid
from i18n import N_, _, chinese
from ui.common import show_chart
from ui.config import config
from ui.experiment import Job, run_experiment
from ui.record import keep_whatif
from ui.results import Patching
from ui.session_model import SessionModel
from ui.state import whatif_results
from ui.text import plain

CLEAN = "The Eiffel Tower is in the city of"
CORRUPT = "The Colosseum is in the city of"
LOCAL_TOKENS, HOSTED_TOKENS = 48, 16  # prompt length: the sweep runs layers × positions copies
SHOWN = {"share of the clean answer restored (0 … 1)": N_("share of the clean answer restored "
                                                         "(0 … 1)"),
         "logit difference": N_("logit difference")}  # value: its label


def patch_form(model: SessionModel) -> None:
    lm = model.lm
    limit = HOSTED_TOKENS if config().hosted else LOCAL_TOKENS
    with st.form("patch_form", border=False):
        c1, c2 = st.columns(2)
        clean = c1.text_input(_("Clean prompt"), CLEAN, key="patch_clean", max_chars=400)
        corrupt = c2.text_input(_("Corrupted prompt"), CORRUPT, key="patch_corrupt",
                                max_chars=400,
                                help=_("The same number of tokens as the clean one: change a "
                                       "word for another that is one token as well."))
        chat = st.toggle(_("Chat template"), False, key="patch_chat")
        go = st.form_submit_button(_("Patch every layer and position"), type="primary",
                                   icon=":material/swap_horiz:")
    if not go:
        return
    ids = [prepare_prompt(lm.tokenizer, p, chat) for p in (clean, corrupt)]
    pieces = [lm.tokenizer.convert_ids_to_tokens(i) for i in ids]
    if len(ids[0]) != len(ids[1]):
        st.error(plain(_("The two prompts must have the same number of tokens: clean {clean} "
                         "({clean_tokens}), corrupted {corrupt} ({corrupt_tokens}).").format(
            clean=len(ids[0]), clean_tokens=" ".join(map(shown_piece, pieces[0])),
            corrupt=len(ids[1]), corrupt_tokens=" ".join(map(shown_piece, pieces[1])))))
        return
    if len(ids[0]) > limit:
        st.error(_("The prompts are {n} tokens; patching here takes up to {limit} (the sweep "
                   "runs one copy of the prompt per position, at every layer).").format(
            n=len(ids[0]), limit=limit))
        return

    def work(job: Job) -> Patching:
        check_pair(lm, ids[0], ids[1])
        found = patch_grid(lm, ids[0], ids[1], say=job.say, stop=job.stop.is_set)
        answer = lm.tokenizer.convert_ids_to_tokens
        return Patching(found, tuple(pieces[0]), tuple(pieces[1]),
                        answer(found.clean_token), answer(found.corrupt_token),
                        bool(np.isfinite(found.logit_diff).all()))

    run_experiment(work, progress=_("Patching…"), cut=lambda found: not found.complete,
                   keep=lambda found: keep_whatif(patching=found))


def _labels(found: Patching) -> list[str]:
    return [f"{i}:{shown_piece(c)}" if c == d else f"{i}:{shown_piece(c)}/{shown_piece(d)}"
            for i, (c, d) in enumerate(zip(found.clean_pieces, found.corrupt_pieces))]


def patch_result() -> None:
    found = whatif_results().patching
    if found is None:
        return
    r = found.result
    good, bad = (plain(shown_piece(t)) for t in (found.clean_answer, found.corrupt_answer))
    st.markdown(_("Clean answer **{good}**, corrupted answer **{bad}**: logit({good}) − "
                  "logit({bad}) = {clean_diff} on the clean prompt, {corrupt_diff} on the "
                  "corrupted one. Where the prompts differ, the chart's labels read "
                  "clean/corrupted.").format(good=good, bad=bad,
                                             clean_diff=f"{r.clean_diff:+.2f}",
                                             corrupt_diff=f"{r.corrupt_diff:+.2f}"))
    if r.clean_token == r.corrupt_token:
        st.warning(_("Both prompts give the same answer: there is nothing for patching to bring "
                     "back. Change the corrupted prompt so that its answer differs."))
    shown = st.radio(_("Show"), list(SHOWN), horizontal=True, key="patch_show",
                     format_func=lambda v: _(SHOWN[v]))
    normalized = shown.startswith("share")
    grid = r.normalized if normalized else r.logit_diff
    show_chart(patch_heatmap(grid, _labels(found), normalized,
                             0.0 if normalized else r.corrupt_diff), name="activation patching")
    st.caption(plain(_notice(found)))


def _notice(found: Patching) -> str:
    r = found.result
    norm = r.normalized
    text = _("Cell (l, p): the corrupted prompt run with the residual stream entering layer l "
             "at position p replaced by the clean run's (l = 0: the embedding output), then "
             "logit(“{clean}”) − logit(“{corrupt}”) at the last position; share = (that − "
             "corrupted run's) ÷ (clean run's − corrupted run's). {layers} layers × {positions} "
             "positions = {runs} patched runs in {seconds} s.").format(
        clean=shown_piece(found.clean_answer), corrupt=shown_piece(found.corrupt_answer),
        layers=norm.shape[0], positions=norm.shape[1], runs=norm.size,
        seconds=f"{r.seconds:.1f}")
    if np.isfinite(norm).any() and r.clean_token != r.corrupt_token:
        differ = [i for i, (c, d) in enumerate(zip(r.clean_ids, r.corrupt_ids)) if c != d]
        last = norm.shape[1] - 1
        where = ", ".join(f"{p}" for p in differ) or _("none")
        early = np.nanmax(norm[:, differ], axis=0) if differ else np.array([np.nan])
        late = norm[:, last]
        flip = next((int(i) for i in np.flatnonzero(late >= 0.5)), None)
        sep = "" if chinese() else " "  # between sentences
        text += sep + _("What to notice: the prompts differ at position {where}; patched there, "
                        "early layers restore up to {share} of the clean answer's lead.").format(
            where=where, share=f"{np.nanmax(early):.0%}") + sep
        if flip is not None:
            text += _("At the last position it comes back from layer {layer} on: by then the "
                      "fact has been moved to where the answer is read out.").format(layer=flip)
    return text


def patch_section(model: SessionModel | None) -> None:
    st.caption(_("Which layer and position carry the fact that makes the clean answer come "
                 "out? Put the clean run's activation into the corrupted run at one place at a "
                 "time, and see where the answer comes back."))
    if model is None:
        st.info(_("Patching runs the model: load it in the sidebar."))
    else:
        patch_form(model)
    patch_result()
