"""Generate's "Why this token?" expander: the logit lens of the chosen step — what each layer
would have predicted had the model stopped there (engine/lens/logit_lens.py)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from charts.tokens import piece_text, visible
from engine import Trace
from engine.lens.logit_lens import logit_lens
from i18n import _
from ui.experiment import run_experiment
from ui.keys import LENS_ON
from ui.memo import memo
from ui.state import loaded_model
from ui.tables import show_table


def _lens_rows(trace: Trace, step_index: int) -> tuple | None:
    step = trace.steps[step_index]
    return run_experiment(lambda job: logit_lens(loaded_model(), step.hidden, step.token_id),
                          spinner=_("Reading every layer's prediction (logit lens)…"))


def logit_lens_section(trace: Trace, step) -> None:
    """What each layer would have predicted at this step, if the model had stopped there."""
    with st.expander(_("What each layer would predict (logit lens)")):
        lm = loaded_model()
        if step.hidden is None:
            st.caption(_("This trace was recorded without hidden states, so there is nothing to "
                         "read the lens from."))
            return
        if lm is None or (lm.spec.name, lm.spec.dtype) != (trace.model.name, trace.model.dtype):
            st.caption(_("The lens runs this trace's model's final norm and LM head: load the "
                         "model (and weights dtype) that made the trace."))
            return
        # asked for, not computed with every page: it takes the model's turn, which a page that
        # opens a recorded run (a share link, a replay) should neither wait for nor hold
        if not st.toggle(_("Read every layer's prediction at this step"), key=LENS_ON,
                         help=_("Runs the model's final norm and LM head on each layer's recorded "
                                "residual stream (a fraction of a second, in the model's turn).")):
            return
        rows = memo("lens", (trace, step.index), lambda: _lens_rows(trace, step.index))
        if rows is None:  # the reason is shown
            return
        chosen = f"p({visible(piece_text(step.piece))})"
        # the columns keep their English names (tests read them); the headers shown are translated
        show_table(pd.DataFrame([{
            "layer": _("embeddings") if r.layer == 0
            else _("after layer {layer}").format(layer=r.layer),
            "would predict": f"{visible(piece_text(r.top_pieces[0]))} ({r.top_probs[0]:.0%})",
            "top 5": " | ".join(visible(piece_text(p)) for p in r.top_pieces),
            chosen: f"{r.chosen_prob:.2%}",
            "its rank": r.chosen_rank + 1} for r in rows]), hide_index=True, width="stretch",
            column_config={"layer": _("layer"), "would predict": _("would predict"),
                           "top 5": _("top 5"), "its rank": _("its rank")})
        st.caption(_("Row l: softmax(LM head(final norm(h_l))) at the last position, h_l the "
                     "recorded residual stream after layer l ({layers} layers). The last row, "
                     "after the last layer, is the model's own distribution, equal to the chart "
                     "above.").format(layers=trace.model.layers))
