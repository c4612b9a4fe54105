"""The Serving and Serving engine pages' results, typed with the engine's records: what a session
keeps of them (and a reload restores)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine import Trace
from engine.remote.compare import Agreement
from engine.remote.record import LoadRun
from engine.serving.record import ServingRun
from engine.serving.speculative import SpeculationComparison
from engine.whatif.ablate import AblationResult
from engine.whatif.patch import PatchResult

# One sample of the speculative-decoding comparison: its title, the output's token pieces, and
# the measured comparison.
SpeculationSample = tuple[str, tuple[str, ...], SpeculationComparison]


@dataclass(frozen=True, slots=True, eq=False)
class ServingResults:
    """The Serving page's results: the last stream run (`run`) and what it was (`label`: "your
    stream", "file x.json"); static vs continuous batching on one stream (`batching`: static,
    continuous); prefix sharing (`sharing`: off, on); speculative decoding per sample
    (`speculation`); and `others_share`: other programs' share of the CPUs while each of them
    ran ("run", "batching", "sharing", "speculation"; None: not measured)."""

    run: ServingRun | None = None
    label: str = ""
    batching: tuple[ServingRun, ...] = ()
    sharing: tuple[ServingRun, ...] = ()
    speculation: tuple[SpeculationSample, ...] = ()
    others_share: tuple[tuple[str, float | None], ...] = ()

    def share(self, name: str) -> float | None:
        return dict(self.others_share).get(name)


@dataclass(frozen=True, slots=True, eq=False)
class RemoteResults:
    """The Serving engine page's results: the last load (`run`) and what it was (`label`: "your
    load", "file x.json"); the same load on this app's engine (`local`, with its model and
    weights in `local_name`) and per request whether the greedy tokens agree (`agreement`);
    `local_share`: other programs' share of the CPUs while the local run ran (None: not
    measured)."""

    run: LoadRun | None = None
    label: str = ""
    local: ServingRun | None = None
    local_name: str = ""
    agreement: tuple[Agreement, ...] = ()
    local_share: float | None = None


@dataclass(frozen=True, slots=True, eq=False)
class HeadSweep:
    """Which heads matter: (L, H) KL of the next token with each head off alone (NaN: a layer
    not swept), on `prompt`, zero or mean ablation, in `seconds`."""

    kl: np.ndarray
    prompt: str
    mean: bool
    seconds: float
    complete: bool  # every asked layer was swept (not stopped by the per-click budget)


@dataclass(frozen=True, slots=True, eq=False)
class Patching:
    """An activation-patching sweep with the pieces its chart labels positions with."""

    result: PatchResult
    clean_pieces: tuple[str, ...]
    corrupt_pieces: tuple[str, ...]
    clean_answer: str
    corrupt_answer: str
    complete: bool


@dataclass(frozen=True, slots=True, eq=False)
class WhatIfResults:
    """The What if page's results: the branch tree (`tree[0]` the run branched from, then each
    branch, `parents[i]` the index it branched from, −1 for the run), the last ablation and head
    sweep, and the last patching sweep."""

    tree: tuple[Trace, ...] = ()
    parents: tuple[int, ...] = ()
    ablation: AblationResult | None = None
    sweep: HeadSweep | None = None
    patching: Patching | None = None
