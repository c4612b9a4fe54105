"""run_experiment's progress bar says "waiting for the model" only while another run holds the
model, for every experiment (the Serving page's speculative section among them): a free turn
starts on the caller's own text."""

from __future__ import annotations

import threading
import time

from ui.experiment import WAITING, run_experiment
from ui.shared import LOCK


class Bar:
    """Stands in for the bar's place on the page: records every text the bar shows."""

    def __init__(self) -> None:
        self.texts: list[str | None] = []

    def progress(self, value: float, text: str | None = None) -> "Bar":
        self.texts.append(text)
        return self

    def empty(self) -> None:
        self.texts.append("(gone)")


def test_a_free_turn_never_says_waiting():
    bar = Bar()
    found = run_experiment(lambda job: job.progress(0.5, "half way") or 42,
                           progress="Speculative decoding: starting…", where=bar)
    assert found == 42
    assert bar.texts == ["Speculative decoding: starting…", "half way", "(gone)"]
    assert not any("wait" in (t or "").lower() for t in bar.texts)


def test_a_held_turn_says_waiting_until_the_work_starts():
    held, release = threading.Event(), threading.Event()

    def other_visitor() -> None:
        with LOCK.turn():
            held.set()
            release.wait(30)

    thread = threading.Thread(target=other_visitor, daemon=True)
    thread.start()
    assert held.wait(30)
    threading.Timer(1.0, release.set).start()  # the other run ends while this one waits
    bar, seen = Bar(), []
    started = time.monotonic()
    run_experiment(lambda job: seen.append(list(bar.texts)), progress="Starting…", where=bar)
    thread.join(30)
    assert time.monotonic() - started >= 0.9  # it did wait for the other run
    assert seen == [[WAITING, "Starting…"]]  # waiting while held, its own text once it runs
    assert bar.texts[-1] == "(gone)"


def test_the_speculative_section_does_not_say_waiting_when_no_one_holds_the_model(monkeypatch):
    """The Serving page's speculative section as it calls the helper (its work left out: only
    the bar's words are under test), with the model turn free."""
    import ui.sections.serving as serving

    bar = Bar()
    monkeypatch.setattr(serving, "run_experiment",
                        lambda work, **kwargs: run_experiment(lambda job: None, where=bar, **kwargs))
    assert not LOCK.locked()
    serving._measure_speculation(None, 1)
    assert bar.texts[0].startswith("Speculative decoding")
    assert not any("wait" in (t or "").lower() for t in bar.texts)
