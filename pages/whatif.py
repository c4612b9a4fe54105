"""What if: change one thing in a run and see what follows — branch a generation at any token
(on its cached prefix), switch heads off, patch activations between two prompts.

The page reads like its table of contents: one tab per question, each a section of
ui/sections/whatif_*.py; the model work is engine/whatif/'s, run under the model turn.
"""

from __future__ import annotations

import streamlit as st

from i18n import _
from ui.sections.whatif_ablate import ablate_section
from ui.sections.whatif_branch import branch_section
from ui.sections.whatif_patch import patch_section
from ui.state import session_model

st.title(_("What if"))
MODEL = session_model()
BRANCH, ABLATE, PATCH = st.tabs([_("Branch at a token"), _("Switch heads off"),
                                  _("Patch activations")])
with BRANCH:
    branch_section(MODEL)
with ABLATE:
    ablate_section(MODEL)
with PATCH:
    patch_section(MODEL)
