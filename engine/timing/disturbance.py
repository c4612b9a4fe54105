"""Was a run's timing disturbed by other work on the machine? A named rule over what each step
recorded (wall time, this process's CPU time, other processes' share of the CPUs).

Why both signals: when other programs take the cores, a step's wall time grows while the CPU time
this process gets does not keep up — but torch's worker threads spin while they wait for each
other, so CPU time alone understates the damage, and a short step spans only a few clock ticks of
`/proc/stat`, so the machine's share alone is noisy. A step is marked only when both agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from i18n import N_, _, chinese

from ..records.trace import Step, Trace

OTHERS_LIMIT = 0.25  # share of all CPUs' time other processes used during the step
CPU_SHARE_LIMIT = 0.75  # share of its threads' possible CPU time this process got

# A message of the catalogs (`_(RULE)` shows it in the session's language), so its numbers are
# OTHERS_LIMIT's and CPU_SHARE_LIMIT's values written in: change them together (a test checks).
RULE = N_("A step is marked *delayed by other work on this machine* when other programs used at "
          "least 25% of all CPUs' time during it **and** this process got under 75% of the CPU "
          "time its threads could have used (CPU time < 0.75 × threads × wall time; on a GPU, "
          "× 1 host thread).")

ADVICE = N_("Run it again, and close other programs (or wait for them) first.")
# On a server many visitors share (a hosted demo) the other programs are not theirs to close.
# (Other visitors' runs are this process's own work, not counted as other programs: a batched
# run's page says how it shared the model with them.)
SHARED_ADVICE = N_("This server shares its CPUs with programs that are not yours to close (a "
                   "hosted demo runs beside others on its machine): run it again in a minute, "
                   "or run the app on your own computer (`make run`) for times that show your "
                   "machine.")


def advice(shared: bool = False) -> str:
    """What to do about a disturbed measurement, in the session's language: on a shared server
    (`shared`), advice a visitor can act on."""
    return _(SHARED_ADVICE if shared else ADVICE)


def expected_threads(trace: Trace) -> int:
    """Threads that should be busy for the whole step: the model's threads on a CPU (capped by
    the cores this process may use), the one host thread that waits on a GPU."""
    machine = trace.machine
    if machine is None or not trace.device.startswith("cpu"):
        return 1
    return max(1, min(machine.threads, machine.cores))


def cpu_share(step: Step, threads: int) -> float | None:
    """CPU time this process got during the step ÷ (threads × wall time)."""
    if step.cpu_ms is None:
        return None
    return step.cpu_ms / (threads * step.latency_ms)


def step_delayed(step: Step, threads: int) -> bool:
    share = cpu_share(step, threads)
    if share is None or step.others_share is None:
        return False
    return over_limits(step.others_share, share)


def over_limits(others_share: float, cpu_share: float) -> bool:
    """The delay rule: other processes used ≥ OTHERS_LIMIT of all CPUs while this one got
    < CPU_SHARE_LIMIT of its threads' possible time."""
    return others_share >= OTHERS_LIMIT and cpu_share < CPU_SHARE_LIMIT


@dataclass(frozen=True, slots=True)
class Disturbance:
    """What the rule says about one trace."""

    measured: bool  # the trace recorded CPU time and the machine's share (format 3 and later)
    delayed_steps: tuple[int, ...]
    steps: int
    others_share: float | None  # over the whole run
    load_before: float | None
    load_after: float | None

    @property
    def disturbed(self) -> bool:
        return bool(self.delayed_steps)

    def warning(self, shared: bool = False) -> str | None:
        """One plain paragraph for the page, or None when the run was not disturbed; `shared`:
        the app runs on a server its visitors share (advice they can act on)."""
        if not self.disturbed:
            return None
        parts = [_("This run's timing was disturbed: {n} of {steps} steps were delayed by other "
                   "work on this machine, so their times show the machine, not the "
                   "model.").format(n=len(self.delayed_steps), steps=self.steps)]
        if self.others_share is not None:
            if self.load_before is not None and self.load_after is not None:
                parts.append(_("Other programs used {share:.0%} of all CPUs' time during the run "
                               "(load average {before:.1f} before, {after:.1f} after).").format(
                    share=self.others_share, before=self.load_before, after=self.load_after))
            else:
                parts.append(_("Other programs used {share:.0%} of all CPUs' time during the "
                               "run.").format(share=self.others_share))
        parts.append(advice(shared))
        return ("" if chinese() else " ").join(parts)


def assess(trace: Trace) -> Disturbance:
    threads = expected_threads(trace)
    measured = bool(trace.steps) and all(s.cpu_ms is not None and s.others_share is not None
                                         for s in trace.steps)
    delayed = tuple(s.index for s in trace.steps if step_delayed(s, threads))
    machine = trace.machine
    return Disturbance(
        measured=measured, delayed_steps=delayed, steps=len(trace.steps),
        others_share=machine.others_share if machine else None,
        load_before=machine.load_before if machine else None,
        load_after=machine.load_after if machine else None)
