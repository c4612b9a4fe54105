"""The app's typed state: configuration and limits, the process-wide shared objects, and each
session's record (trace, prompt, experiment results), kept server-side so a reload restores it.

Not a page (app.py lists the pages). The shared objects are module globals, created once per
process: unlike `st.cache_resource`, nothing a browser sends (its "clear cache" message clears
every cache of the process) can replace the lock or load a second copy of a model.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from typing import Any

import streamlit as st

from engine import GenerationSettings, LoadedModel, Trace
from engine.experiments import Experiments
from engine.sharing import FairLock, ModelStore, SessionStore
from engine.sharing.models import ModelEntry
from engine.sharing.sessions import new_token

# The sidebar's weights variants (engine/quant/variants.py). Hosted: float32 and q4_0 only —
# the default model's float32 entry with its native decoder is ~1.1 GB and the q4_0 copy with
# its decoder ~0.8 GB, so both stay loaded within HOSTED_MODEL_MB (a third choice would make
# visitors evict each other's model).
LOCAL_WEIGHTS = ("fp32", "fp16", "bf16", "int8", "q4_0", "q4_1")
HOSTED_WEIGHTS = ("fp32", "q4_0")
HOSTED_MODEL_MB = 2048
MAX_PROMPT_CHARS = 20_000  # the prompt box and a share link: far above what the token limit lets through


@dataclass(frozen=True, slots=True)
class Limits:
    """What one click may ask of the shared model; enforced on the server, not only by widgets."""

    prompt_tokens: int
    new_tokens: int
    upload_mb: int  # a trace file, as uploaded
    trace_mb: int  # a trace file, decompressed: what it will hold in memory
    trace_tokens: int  # prompt + output of a trace file the pages will show
    click_s: float | None = None  # model time one click may take (None: no limit)
    kernel_rounds: int = 3  # paired rounds of the decode-kernel comparison

    @property
    def sequence_tokens(self) -> int:
        """The longest token sequence an experiment runs the model on (prompt + answer)."""
        return self.prompt_tokens + self.new_tokens


@dataclass(frozen=True, slots=True)
class AppConfig:
    hosted: bool
    limits: Limits
    model_cache_mb: int  # weights the model store keeps (local: a few dtype/model choices)
    session_mb: int  # session records kept for reloads, all sessions together
    session_ttl_s: float

    @classmethod
    def from_env(cls) -> "AppConfig":
        if os.environ.get("INFERENCE_EXPLORER_HOSTED") == "1":
            return cls(True, Limits(256, 64, 50, 96, 320, click_s=_click_s(), kernel_rounds=2),
                       HOSTED_MODEL_MB, 512, 2 * 3600.0)
        return cls(False, Limits(1024, 256, 50, 512, 8192), 4096, 2048, 12 * 3600.0)

    @property
    def weights_choices(self) -> tuple[str, ...]:
        """The sidebar's weights variants: hosted, the two that fit its cap together."""
        return HOSTED_WEIGHTS if self.hosted else LOCAL_WEIGHTS


def _click_s(default: float = 15.0) -> float:
    """Hosted model time per click: 15 s, or INFERENCE_EXPLORER_CLICK_S (1–600) for a Space on
    other hardware — and for tests that must not turn a busy machine into a failure."""
    try:
        value = float(os.environ.get("INFERENCE_EXPLORER_CLICK_S", default))
    except ValueError:
        return default
    return min(max(value, 1.0), 600.0) if value == value else default


def config() -> AppConfig:
    """Read from the environment on each call (cheap), so tests can switch hosted mode."""
    return AppConfig.from_env()


LOCK = FairLock()
MODELS = ModelStore(config().model_cache_mb << 20,
                    native_tokens=config().limits.sequence_tokens)  # a live run always fits
# Compare runs: run B (a trace of its own, and where it came from) and which run is A (a widget
# key); share links: which shipped example the session's trace is — (name, the trace's
# created_at), so a run of its own made later is not mistaken for it.
_COMPARE_B, _COMPARE_B_LABEL = "compare_b", "compare_b_label"
COMPARE_A = "compare_a"
OPENED_EXAMPLE = "opened_example"
SERVING = "serving"  # the Serving page's runs (ServingResults)
SERVING_ENGINE = "serving_engine"  # the Serving engine page's load (RemoteResults)
KEPT = ("trace", "prompt", "experiments", _COMPARE_B, _COMPARE_B_LABEL, COMPARE_A,
        OPENED_EXAMPLE, SERVING, SERVING_ENGINE)  # what a reload restores


def _size(value: Any) -> int:
    if isinstance(value, Trace):
        arrays = sum(a.nbytes for s in value.steps for a in (s.attention, s.hidden, s.top_ids,
                                                              s.top_probs) if a is not None)
        return arrays + 2048 * len(value.steps) + 100 * len(value.prompt_token_ids)
    if isinstance(value, ServingResults):  # ~100 bytes per token and per block-table row
        runs = [r for r in (value.run, *value.batching, *value.sharing) if r is not None]
        return 4096 + sum(100 * (r.output_tokens + sum(len(s.tables) + 1 for s in r.steps))
                          for r in runs)
    if isinstance(value, RemoteResults):  # ~100 bytes per token, ~1 KB per /metrics sample
        run, local = value.run, value.local
        return 4096 + (0 if run is None else 100 * run.output_tokens + 1024 * len(run.samples)) \
            + (0 if local is None else 100 * (local.output_tokens + len(local.steps)))
    return 4096


SESSIONS = SessionStore(max_entries=64, max_bytes=config().session_mb << 20,
                        ttl_s=config().session_ttl_s, size_of=_size)
_TOKEN = "_session_token"
_TOKEN_SHAPE = re.compile(r"[A-Za-z0-9_-]{8,32}")


def restore_session() -> None:
    """Give this session its token (kept in the URL as ?s=…); a new session that arrives with a
    known token (a reload, a reconnect) gets a copy of that record under a token of its own."""
    token = st.session_state.get(_TOKEN)
    if token is None:
        token = new_token()
        came_with = st.query_params.get("s", "")
        record = SESSIONS.copy(came_with) if _TOKEN_SHAPE.fullmatch(came_with) else None
        for key, value in (record or {}).items():
            if key == "trace" and value.stop_reason == "running":  # the reload cut its run short
                value = replace(value, stop_reason="stopped")
            if key in KEPT:
                st.session_state[key] = value
                SESSIONS.put(token, key, value)
        st.session_state[_TOKEN] = token
    if st.query_params.get("s") != token:
        st.query_params["s"] = token


def keep(key: str, value: Any) -> None:
    """Set a session value that a reload must restore (one of KEPT)."""
    if key not in KEPT:
        raise KeyError(f"{key!r} is not kept across reloads")
    if st.session_state.get(key) != value:  # a widget's own key (the prompt) holds it already
        st.session_state[key] = value
    token = st.session_state.get(_TOKEN)
    if token is not None:
        SESSIONS.put(token, key, value)


@dataclass(frozen=True, slots=True)
class SessionModel:
    """The model this session chose (source and weights variant) and its shared entry."""

    source: str
    weights: str
    entry: ModelEntry

    @property
    def lm(self) -> LoadedModel:
        return self.entry.lm

    @property
    def dtype(self) -> str:
        return self.entry.lm.spec.dtype

    def reference(self) -> ModelEntry:
        """This model's float32 entry: what comparisons of kernels, dtypes and weight variants
        measure from, whichever weights this session decodes with (loaded again if it was
        evicted: call inside the model turn)."""
        return self.entry if self.weights == "fp32" else MODELS.get(self.source, "fp32")

    def reference_native_decoder(self) -> Any:
        """The native decoder of the float32 weights (this session's own when it chose fp32)."""
        return self.native_decoder() if self.weights == "fp32" else self.reference().native()

    def compiled_decoder(self) -> Any:
        """The float32 model's torch.compile decoder, shared by every session of this model (the
        kernel comparison keeps the weights fixed at float32)."""
        from engine.kernels.compiled import CompiledDecoder
        return MODELS.compiled((self.source, "fp32"), CompiledDecoder)

    def native_decoder(self) -> Any:
        """The native C decoder for these weights, shared by every session that chose them
        (built on first use: call it inside the model turn); raises EngineError saying why it
        cannot run."""
        return self.entry.native()

    def native_problem(self) -> str | None:
        """Why the native step cannot run these weights, without building it (the sidebar)."""
        return self.entry.native_problem()

    def run_options(self) -> dict[str, Any]:
        """What a live `Run` needs beyond the model: the shared native decoder for these weights
        (a builder, called once the run holds the model turn, with a spinner the first time),
        and the weights' name for its trace."""

        def native() -> Any:
            if "native" in self.entry.extras:
                return self.native_decoder()
            with st.spinner(f"Preparing the native decode step for the {self.weights} weights "
                            "(packing them; the first time on this machine also compiling the "
                            "C step: a few seconds)…"):
                return self.native_decoder()

        return {"native": native, "weights": self.weights}


_MODEL, _SETTINGS = "session_model", "generation_settings"


def set_session_model(model: SessionModel | None) -> None:
    st.session_state[_MODEL] = model


def session_model() -> SessionModel | None:
    return st.session_state.get(_MODEL)


def loaded_model() -> LoadedModel | None:
    """This session's loaded model, or None (not loaded yet, or failed)."""
    model = session_model()
    return model.lm if model is not None else None


def set_generation_settings(settings: GenerationSettings) -> None:
    st.session_state[_SETTINGS] = settings


def generation_settings() -> GenerationSettings:
    """The sidebar's generation settings (defaults before the sidebar ran)."""
    return st.session_state.get(_SETTINGS) or GenerationSettings()


def current_trace() -> Trace | None:
    return st.session_state.get("trace")


def current_experiments() -> Experiments:
    return st.session_state.get("experiments") or Experiments()


def keep_experiments(**changes: Any) -> None:
    keep("experiments", replace(current_experiments(), **changes))


_PENDING = "pending_run"


def pending_run() -> Trace | None:
    """A run that ended before its first token (its own prompt, no answer): the Generate page
    shows it instead of the previous trace, until the next trace arrives."""
    return st.session_state.get(_PENDING)


def set_pending_run(trace: Trace | None) -> None:
    st.session_state[_PENDING] = trace


def keep_new_trace(trace: Trace, experiments: Experiments | None = None) -> None:
    """A new trace: results computed on the old one (cache variants, kernel comparison) go, the
    machine's own measurements (sweeps, cache on vs off) stay; a file's own results replace all."""
    set_pending_run(None)
    keep("trace", trace)
    if experiments is None:
        experiments = replace(current_experiments(), cache_variants=(), decode_comparison=None,
                              dtype_comparison=None)
    keep("experiments", experiments)


_PATH = re.compile(r"(?<![\w.])/(?:[\w.+-]+/)+[\w.+-]*")


def message(err: BaseException | str) -> str:
    """An error for the page: plain text (see `plain`), and on a hosted demo without filesystem
    paths (a visitor has no use for the server's layout)."""
    text = str(err)
    if config().hosted:
        text = _PATH.sub("…", text)
    return plain(text)


_MARKDOWN = re.compile(r"([\\`*_{}\[\]()#+\-.!|~<>$:=&])")


def plain(text: str) -> str:
    """User text (a file name, a model id, an error echoing them) safe to show in Streamlit
    markdown: every markdown punctuation character escaped, so `~x~` is not strikethrough and
    `a.b` is not a link."""
    return _MARKDOWN.sub(r"\\\1", text)


# Compare runs: run B and which run is A, kept across reloads like the session's trace.

def compare_run() -> tuple[str, Trace] | None:
    """Run B of the Compare page with its label ("example “Short Q&A”", "re-run with the KV cache
    off"), or None."""
    trace = st.session_state.get(_COMPARE_B)
    return None if trace is None else (st.session_state.get(_COMPARE_B_LABEL) or "run B", trace)


def keep_compare_run(label: str, trace: Trace) -> None:
    keep(_COMPARE_B_LABEL, label)
    keep(_COMPARE_B, trace)


def keep_compare_a(choice: str) -> None:
    """The run-A selector's choice, kept for a reload (its widget has set it in this session)."""
    keep(COMPARE_A, choice)


# The Serving page: its stream runs and comparisons, kept across reloads like the trace.

@dataclass(frozen=True, slots=True, eq=False)
class ServingResults:
    """The Serving page's results: the last stream run (`run`, an engine.serving ServingRun) and
    what it was (`label`: "your stream", "file x.json"); static vs continuous batching on one
    stream (`batching`: static, continuous); prefix sharing (`sharing`: off, on); speculative
    decoding per sample (`speculation`: (title, output pieces, SpeculationComparison)); and
    `others_share`: other programs' share of the CPUs while each of them ran ("run", "batching",
    "sharing", "speculation"; None: not measured)."""

    run: Any = None
    label: str = ""
    batching: tuple[Any, ...] = ()
    sharing: tuple[Any, ...] = ()
    speculation: tuple[tuple[str, tuple[str, ...], Any], ...] = ()
    others_share: tuple[tuple[str, float | None], ...] = ()

    def share(self, name: str) -> float | None:
        return dict(self.others_share).get(name)


def serving_results() -> ServingResults:
    return st.session_state.get(SERVING) or ServingResults()


def keep_serving(others: tuple[str, float | None] | None = None, **changes: Any) -> None:
    """Replace some of the Serving page's results (and, with `others`, that run's CPU share)."""
    found = serving_results()
    if "run" in changes and "batching" not in changes:  # its comparison was of the old stream
        changes["batching"] = ()
    if others is not None:
        changes["others_share"] = tuple((k, v) for k, v in found.others_share
                                        if k != others[0]) + (others,)
    keep(SERVING, replace(found, **changes))


def last_serving_run() -> tuple[str, Any] | None:
    """(label, ServingRun) of the session's last stream run, for the KV page's block tables."""
    found = serving_results()
    return None if found.run is None else (found.label, found.run)


# The Serving engine page: its load on a remote serving engine, kept across reloads.

@dataclass(frozen=True, slots=True, eq=False)
class RemoteResults:
    """The Serving engine page's results: the last load (`run`, an engine.remote LoadRun) and
    what it was (`label`: "your load", "file x.json"); the same load on this app's engine
    (`local`, a ServingRun, with its model and weights in `local_name`) and per request whether
    the greedy tokens agree (`agreement`: engine.remote.compare.Agreement); `local_share`: other
    programs' share of the CPUs while the local run ran (None: not measured)."""

    run: Any = None
    label: str = ""
    local: Any = None
    local_name: str = ""
    agreement: tuple[Any, ...] = ()
    local_share: float | None = None


def remote_results() -> RemoteResults:
    return st.session_state.get(SERVING_ENGINE) or RemoteResults()


def keep_remote(**changes: Any) -> None:
    """Replace some of the Serving engine page's results; a new load drops the comparison made
    on the old one."""
    if "run" in changes and "local" not in changes:
        changes.update(local=None, local_name="", agreement=(), local_share=None)
    keep(SERVING_ENGINE, replace(remote_results(), **changes))
