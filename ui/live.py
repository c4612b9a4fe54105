"""One memory budget for what every live session holds: its runs, results and download files.

The session store (ui/sessions.py) bounds what is kept for reloads, but a session's own state
holds its trace and results whether or not the store kept them, so a few tabs could still fill
the server's memory with files the store refused. Every session's AppState is listed, weakly
(ui/state.py `live_states`: a closed session's state goes with it), and before a session takes
in something new and large (a file it opens) the live total, shared objects counted once
(ui/footprint.py), plus the newcomer must fit `AppConfig.session_mb`, or it is refused in one
line.
"""

from __future__ import annotations

from typing import Any

from engine.errors import InputError
from i18n import _
from ui.config import config
from ui.footprint import footprint
from ui.state import AppState, live_states


def holdings(state: AppState) -> tuple[Any, ...]:
    """What a session's state holds that can be large (not its model: the model store's)."""
    return (state.run.trace, state.run.pending, state.experiments, state.compare.b, state.serving,
            state.remote, state.whatif, state.page.branch_caches, state.memos)


def live_bytes() -> int:
    """Bytes held by every live session's runs, results and files (shared parts once)."""
    return footprint([holdings(s) for s in live_states()])


def make_room(value: Any, what: str) -> None:
    """Refuse `value` (InputError, one line) if taking it in would put the live sessions
    together over the server's budget."""
    budget = config().session_mb << 20
    held, size = live_bytes(), footprint(value)
    if held + size > budget:
        raise InputError(_("{what} needs {size} MB and this server's memory for visitors' runs "
                           "is full ({held} of {budget} MB held by open sessions); try again in a "
                           "few minutes").format(what=what, size=f"{size / 2**20:,.0f}",
                                                 held=f"{held / 2**20:,.0f}",
                                                 budget=f"{budget >> 20:,}"))
