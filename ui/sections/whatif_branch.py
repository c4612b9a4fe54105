"""What if's "Branch at a token": pick a generated token of the run (or of a branch), put another
candidate there and let the model go on from the cached prefix (engine/whatif/branch.py). Each
branch is a recorded run, kept in a tree; two of them side by side; any of them opens on every
page."""

from __future__ import annotations

import streamlit as st

from charts.formatting import duration
from charts.tokens import shown_piece
from charts.whatif import node_label, probability_chart, tree_dot
from engine import EngineError, Trace
from engine.whatif.branch import branch, run_snapshot, single_token
from i18n import _
from ui.common import disturbance_warning, no_trace_notice, show_chart
from ui.config import config
from ui.experiment import Job, run_experiment
from ui.present import presenting
from ui.record import keep_new_trace, keep_whatif
from ui.sections.two_runs import attention_section, tokens_section
from ui.session_model import SessionModel
from ui.state import app_state, current_trace, whatif_results
from ui.text import message, plain

FROM, AT, CANDIDATE, TYPED = "whatif_from", "whatif_at", "whatif_candidate", "whatif_typed"
PAIR_A, PAIR_B = "whatif_a", "whatif_b"
LOCAL_NODES, HOSTED_NODES = 32, 8  # runs in one tree (each holds its trace and its cache)


def tree_of(trace: Trace) -> tuple[tuple[Trace, ...], tuple[int, ...]]:
    """The tree the current run belongs to, or a new one rooted at it; caches of runs no
    longer in it are dropped."""
    found = whatif_results()
    if not any(t is trace for t in found.tree):
        found = keep_whatif(tree=(trace,), parents=(-1,))
    caches = app_state().page.branch_caches
    alive = {id(t) for t in found.tree}
    for key in [k for k in caches if k not in alive]:
        del caches[key]
    return found.tree, found.parents


def _candidates(node: Trace, at: int) -> list[int]:
    step = node.steps[at]
    return [i for i in step.top_ids.tolist() if i != step.token_id]


def _candidate_label(node: Trace, at: int, token: int) -> str:
    step = node.steps[at]
    j = step.top_ids.tolist().index(token)
    return _("{token} (p = {p})").format(token=shown_piece(step.top_pieces[j]),
                                        p=f"{float(step.top_probs[j]):.3f}")


def _branch(model: SessionModel, tree: tuple[Trace, ...], parents: tuple[int, ...], index: int,
            at: int, token: int) -> None:
    node, caches = tree[index], app_state().page.branch_caches
    lm = model.lm
    limit = HOSTED_NODES if config().hosted else LOCAL_NODES
    if len(tree) >= limit:
        st.error(_("This tree holds {limit} runs, the most one tree may hold here: generate a "
                   "new run to start another.").format(limit=limit))
        return

    def work(job: Job) -> tuple:
        snapshot = caches.get(id(node))
        rebuilt = None
        if snapshot is None:
            job.progress(0.05, _("Rebuilding this run's KV cache: one prefill of its {n} "
                                 "tokens…").format(
                n=len(node.prompt_token_ids) + len(node.steps) - 1))
            snapshot, ms = run_snapshot(lm, node)
            rebuilt = (snapshot.positions, ms)
        job.progress(0.3, _("Branching at token {at}: reusing {n} cached positions, then "
                            "timing a full re-run of the same branch…").format(
            at=at, n=len(node.prompt_token_ids) + at))
        found = branch(lm, node, at, token, snapshot, model.weights, job.stop,
                       native=model.run_options()["native"])
        return found, snapshot, rebuilt

    done = run_experiment(work, progress=_("Branching…"), cut=False)
    if done is None:
        return
    found, snapshot, rebuilt = done
    caches[id(node)] = snapshot
    caches[id(found.trace)] = found.snapshot
    keep_whatif(tree=(*tree, found.trace), parents=(*parents, index))
    app_state().page.whatif_rebuilt = rebuilt
    st.session_state[PAIR_A], st.session_state[PAIR_B] = index, len(tree)  # drawn below
    st.rerun()


def branch_form(model: SessionModel, tree: tuple[Trace, ...], parents: tuple[int, ...]) -> None:
    page = app_state().page
    if page.whatif_at is not None:  # Generate's "What if it had chosen another token here?"
        st.session_state[FROM] = next(i for i, t in enumerate(tree) if t is current_trace())
        st.session_state[AT], page.whatif_at = page.whatif_at, None
    if st.session_state.get(FROM) not in range(len(tree)):
        st.session_state[FROM] = len(tree) - 1
    c1, c2 = st.columns([1, 1])
    index = c1.selectbox(_("Branch from"), range(len(tree)),
                         format_func=lambda i: node_label(tree, i), key=FROM)
    node = tree[index]
    if not node.steps:
        st.info(_("This run has no generated token to change."))
        return
    if st.session_state.get(AT) not in range(len(node.steps)):
        st.session_state[AT] = min(2, len(node.steps) - 1)
    at = c2.selectbox(_("Token to change"), range(len(node.steps)), key=AT,
                      format_func=lambda i: _("{i}: {token} (p = {p})").format(
                          i=i, token=shown_piece(node.steps[i].piece),
                          p=f"{node.steps[i].chosen_prob:.3f}"),
                      help=_("The generated tokens of this run, in order (0 = the first). "
                             "Everything before it is kept; the tokens after it are the model's "
                             "again."))
    step = node.steps[at]
    options = _candidates(node, at)
    with st.form("branch_form", border=False):
        choice = st.radio(plain(_("Instead of “{token}” (p = {p}), put").format(
                              token=shown_piece(step.piece), p=f"{step.chosen_prob:.3f}")),
                          options,
                          format_func=lambda t: plain(_candidate_label(node, at, t)),
                          horizontal=True, key=CANDIDATE,
                          help=_("The model's other most probable tokens at this step."))
        typed = st.text_input(_("… or type a token"), key=TYPED, max_chars=40,
                              placeholder=_("e.g. ·Lyon (one token of the vocabulary)"),
                              help=_("Used instead of the choice above when filled: text that "
                                     "is exactly one token (a leading space is part of it)."))
        go = st.form_submit_button(_("Branch here"), type="primary",
                                   icon=":material/call_split:")
    if go:
        token = choice
        if typed:
            try:
                token = single_token(model.lm, typed.replace("·", " "))
            except EngineError as err:
                st.error(message(err))
                return
        if token == step.token_id:
            st.error(_("That is the token the run chose here: pick another."))
            return
        same = next((i for i, t in enumerate(tree) if parents[i] == index
                     and t.branch is not None and (t.branch.at, t.branch.token) == (at, token)),
                    None)
        if same is not None:  # the same tokens again: nothing new to compute
            st.info(_("That branch exists already: {branch}. It is shown side by side "
                      "below.").format(branch=node_label(tree, same)))
            st.session_state[PAIR_A], st.session_state[PAIR_B] = index, same
            return
        _branch(model, tree, parents, index, at, token)


def last_branch(tree: tuple[Trace, ...]) -> None:
    b_trace = tree[-1]
    b = b_trace.branch
    if b is None:
        return
    st.markdown(_("**Last branch** ({branch})").format(
        branch=plain(node_label(tree, len(tree) - 1))))
    c1, c2, c3, c4 = st.columns(4)
    c1.metric(_("Reused from the KV cache"),
              _("{n} positions").format(n=b.reused_tokens),
              help=_("The prompt's tokens and the tokens before the branch point: their keys "
                     "and values do not depend on later tokens, so they were not recomputed."))
    c2.metric(_("Computed"), _("{n} positions").format(n=b.computed_tokens),
              help=_("One forward per token after the branch point (one more when a typed "
                     "token's probability needed the model's whole distribution there)."))
    c3.metric(_("Branch took"), duration(b.branch_ms))
    about = _("The same branch recomputed from nothing: a prefill of prompt + prefix + the new "
              "token, then the same decode steps, recorded alike.")
    if b.saved_ms is None:
        c4.metric(_("Full re-run took"), "—", help=about)
        st.caption(_("The per-click budget ran out while the same branch was being recomputed "
                     "from nothing, so there is no full re-run to compare with: branch again "
                     "nearer the end of the run, or with fewer new tokens."))
    else:
        c4.metric(_("Full re-run took"), duration(b.rerun_ms),
                  delta=(_("{time} saved") if b.saved_ms >= 0 else _("{time} more")).format(
                      time=duration(abs(b.saved_ms))),
                  delta_color="normal" if b.saved_ms >= 0 else "inverse", help=about)
    decoder = b_trace.decoder.label if b_trace.decoder is not None else "torch eager"
    timings = (_("Reused = prompt ({prompt}) + tokens before the branch point ({at}), on the "
                 "{decoder}.") if b.rerun_ms is None else
               _("Reused = prompt ({prompt}) + tokens before the branch point ({at}). Both "
                 "timings are wall-clock on this machine, measured one after the other, on the "
                 "same decoder ({decoder}); both chose the same tokens.")
               if b.same_as_rerun else
               _("Reused = prompt ({prompt}) + tokens before the branch point ({at}). Both "
                 "timings are wall-clock on this machine, measured one after the other, on the "
                 "same decoder ({decoder}); the two chose different tokens (float rounding "
                 "differs between a prefill and single steps)."))
    st.caption(timings.format(prompt=len(b_trace.prompt_token_ids), at=b.at, decoder=decoder))
    rebuilt = app_state().page.whatif_rebuilt
    if rebuilt is not None:
        st.caption(_("Before its first branch, the run's KV cache was rebuilt once with one "
                     "prefill of {n} tokens ({time}, not counted in the branch's time): a "
                     "Generate run does not keep its cache (its decode steps may run in the "
                     "native step); a server keeping the conversation would hold it. The saving "
                     "is the prefill of the reused positions: it grows with the prompt and the "
                     "prefix.").format(n=rebuilt[0], time=duration(rebuilt[1])))
    disturbance_warning(b_trace)


def side_by_side(tree: tuple[Trace, ...]) -> None:
    st.subheader(_("Two runs side by side"))
    for key, default in ((PAIR_A, 0), (PAIR_B, len(tree) - 1)):
        if st.session_state.get(key) not in range(len(tree)):
            st.session_state[key] = default
    c1, c2, c3 = st.columns([2, 2, 1])
    a = c1.selectbox(_("First"), range(len(tree)), key=PAIR_A,
                     format_func=lambda i: node_label(tree, i))
    b = c2.selectbox(_("Second"), range(len(tree)), key=PAIR_B,
                     format_func=lambda i: node_label(tree, i))
    names = (node_label(tree, a).split(" · ")[0], node_label(tree, b).split(" · ")[0])
    c3.write("")  # level with the selectors
    if c3.button(_("Open on every page"), icon=":material/open_in_new:", key="whatif_open",
                 help=_("Makes {run} the session's run: every page shows it, and share and "
                        "download include it with where it branched.").format(run=names[1])):
        keep_new_trace(tree[b])
        st.success(plain(_("{run} is now the run every page shows.").format(
            run=f"{names[1][:1].upper()}{names[1][1:]}")))
    tokens_section(tree[a], tree[b], names, title=_("Tokens"))
    st.markdown(_("**Probability of each chosen token**"))
    show_chart(probability_chart(tree[a], tree[b], names), key="whatif_probs",
               name="probability of each chosen token")
    attention_section(tree[a], tree[b], names, prefix="whatif", rows=1)  # the prompt's: alike


def branch_section(model: SessionModel | None) -> None:
    st.caption(_("Pick a generated token, put another candidate there, and the model goes on "
                 "from there. The prompt and the tokens before it are not recomputed: their keys "
                 "and values sit in the KV cache, and a later token cannot change them. That is "
                 "why a branch costs only its own tokens — and why servers share cached "
                 "prefixes."))
    trace = current_trace()
    if trace is None:
        no_trace_notice(_("Then branch it here."))
        return
    tree, parents = tree_of(trace)
    if model is None:
        st.info(_("Branching runs the model: load it in the sidebar."))
    elif trace.model.name != model.lm.spec.name:
        st.info(plain(_("This run was made by {model}; branching continues it on the same "
                        "model: load it in the sidebar.").format(model=trace.model.name)))
    else:
        branch_form(model, tree, parents)
    pair = (st.session_state.get(PAIR_A, 0), st.session_state.get(PAIR_B, len(tree) - 1))
    st.graphviz_chart(tree_dot(tree, parents, pair, font=18 if presenting() else 14))
    if len(tree) == 1:
        return
    last_branch(tree)
    side_by_side(tree)
