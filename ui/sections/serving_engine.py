"""Parts of the Serving engine page (pages/serving_engine.py): the server it talks to (and the
local vLLM it can start), the tokenizer its chat template comes from, and load-test files.

Module globals here live as long as the Streamlit process
(this module is imported once, unlike a page script, which runs afresh on every rerun): the
vLLM server the page started must outlive the rerun that started it, and every session shares it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import streamlit as st

from engine import EngineError
from engine.remote import server as vllm
from engine.remote.client import RemoteError, list_models, normalize_base_url
from engine.remote.record import LoadRun
from i18n import N_, _
from ui.config import config
from ui.files import RecordFiles, files_section
from ui.guard import url_refusal
from ui.memo import memo
from ui.record import keep_remote
from ui.replay import ask_replay
from ui.state import remote_results
from ui.text import message, plain

DEFAULT_URL = f"http://127.0.0.1:{vllm.DEFAULT_PORT}/v1"
FILE_MB = 16  # a load-test file uploaded here (the format allows more; a page needs no more)
START_TIMEOUT_S = 900.0
YOUR_LOAD = N_("your load")  # a label kept with the load (compared, shown translated)
# A real load recorded from vLLM 0.32 (CPU build, this app's default model) with
# `python -m engine loadtest --out`: what a visitor with no server of their own can open.
SAMPLE_LOAD = Path(__file__).resolve().parents[2] / "assets" / "examples" / "vllm-load.json"
SAMPLE_LABEL = N_("the sample load (recorded from vLLM)")


class LocalServer:
    """The vLLM server this app started (one per process): started on a thread so the page can
    show its progress, kept here so it outlives the Streamlit rerun (and session) that asked."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.process: vllm.ServerProcess | None = None
        self.error: str | None = None
        self.started_at = 0.0

    @property
    def starting(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def start(self) -> None:
        """Start it unless it is starting or running already (another session may have)."""
        with self.lock:
            if self.starting or (self.process is not None and self.process.process.poll() is None):
                return
            self.error, self.started_at = None, time.monotonic()
            self.thread = threading.Thread(target=self._run, daemon=True)
            self.thread.start()

    def _run(self) -> None:
        try:
            self.process = vllm.start_server(vllm.DEFAULT_PORT, eager=True,
                                             timeout_s=START_TIMEOUT_S)
        except EngineError as err:
            self.error = str(err)

    @property
    def eager(self) -> bool:
        """Whether the server at DEFAULT_URL is the one started here (always in eager mode)."""
        return self.process is not None and self.process.process.poll() is None


LOCAL = LocalServer()


@dataclass(frozen=True, slots=True)
class Server:
    """The base URL the user chose and the models it serves (empty: nothing usable answers)."""

    url: str
    models: tuple[str, ...]
    problem: str | None = None
    refused: bool = False  # a shared server does not send requests there (ui/guard.py)


def probe(url: str, force: bool = False) -> Server:
    """The server's models at `url` (a base URL as normalize_base_url spells it), asked once per
    URL per session (and again on "List models"): an unreachable address costs no wait on every
    rerun."""

    def ask() -> Server:
        try:
            models = tuple(list_models(url, timeout=3.0))
        except RemoteError as err:
            return Server(url, (), str(err))
        return Server(url, models)  # no models: `problem` None, said where it is shown

    return memo("remote_probe", (url,), ask, fresh=force)


def problem_text(found: Server) -> str:
    """Why nothing usable answers at `found.url`, in the session's language (the memo keeps
    no words of any language; the server's own error is shown as it came)."""
    if found.problem is None:
        return _("{url} serves no model").format(url=found.url)
    return found.problem or _("no answer")


def server_section() -> Server:
    """The base URL, its models, and when nothing answers at the default address: start the
    local vLLM (installed) or how to install it."""
    st.subheader(_("The server"))
    url_col, list_col = st.columns([4, 1], vertical_alignment="bottom")
    url = url_col.text_input(_("OpenAI-compatible base URL"), DEFAULT_URL, key="remote_url",
                             max_chars=300, help=_("vLLM, SGLang, TGI or llama.cpp's server: "
                             "anything that serves /v1/completions with streaming; its "
                             "Prometheus /metrics (at the server's root) is read when present."))
    listed = list_col.button(_("List models"), icon=":material/refresh:", width="stretch",
                             key="remote_list_models")
    refusal = url_refusal(url.strip(), own_urls())
    if refusal is not None:  # before any request: a shared server's visitor picks no address
        st.error(message(refusal), icon=":material/block:")
        return Server(url.strip(), (), refusal, refused=True)
    try:  # the one spelling the guard checked is the one the client connects to
        base = normalize_base_url(url)
    except RemoteError as err:
        found = Server(url.strip(), (), str(err))
    else:
        if LOCAL.starting:
            local_start_progress()
            listed = True
        found = probe(base, force=listed)
    if found.models:
        models = ", ".join(plain(m) for m in found.models)
        st.success((_("{url} serves: {models} — started by this app (eager mode: no "
                      "torch.compile).") if LOCAL.eager and found.url == DEFAULT_URL else
                    _("{url} serves: {models}")).format(url=plain(found.url), models=models),
                   icon=":material/dns:")
        return found
    st.error(_("No usable server: {problem}.").format(problem=message(problem_text(found))),
             icon=":material/cloud_off:")
    if found.url == DEFAULT_URL:
        offer_local_start()
    return found


def own_urls() -> tuple[str, ...]:
    """The base URLs of the vLLM this app starts (and the docs' default local address): the
    only ones a shared server talks to, besides the operator's allowlist."""
    started = LOCAL.process.base_url if LOCAL.process is not None else DEFAULT_URL
    return tuple(dict.fromkeys((DEFAULT_URL, started)))


def offer_local_start() -> None:
    if LOCAL.error:
        st.error(_("The local vLLM did not start: {error}").format(error=message(LOCAL.error)))
    if not vllm.is_installed():
        st.info(_("vLLM is not installed on this machine. Install its CPU build into a venv of "
                  "its own (a few minutes and about 3.5 GB the first time), then start it:\n\n"
                  "```\nmake vllm\nscripts/vllm_start.sh\n```\n\nThe script prints the base "
                  "URL once the server answers ({url}); then press **List models**.").format(
                      url=DEFAULT_URL), icon=":material/download:")
        return
    if st.button(_("Start local vLLM"), icon=":material/play_circle:", type="primary",
                 key="remote_start_vllm",
                 help=_("Starts vLLM's CPU build on port {port} in eager mode (no torch.compile): "
                        "about a minute on two cores. It keeps running for every session until "
                        "the app stops.").format(port=vllm.DEFAULT_PORT)):
        LOCAL.start()
        st.rerun()


def local_start_progress() -> None:
    """Wait for the local vLLM with a progress bar (its start takes about a minute here)."""
    bar = st.progress(0.0, text=_("Starting vLLM…"))
    expected = 60.0
    while LOCAL.starting:
        waited = time.monotonic() - LOCAL.started_at
        bar.progress(min(waited / expected, 0.99), text=_(
            "Starting vLLM (eager mode): {waited:.0f} s so far, usually {expected:.0f} s or less; "
            "its log: {log} in the vLLM folder").format(
                waited=waited, expected=expected, log=f"server-{vllm.DEFAULT_PORT}.log"))
        time.sleep(0.5)
    bar.empty()


_TOKENIZER: list[Any] = []  # the default model's tokenizer, loaded once per process


def default_tokenizer() -> Any:
    """The default model's tokenizer (its chat template wraps the prompts, as the local engine
    does): loaded alone from the converted cache, once per process."""
    if not _TOKENIZER:
        from engine.remote.compare import default_tokenizer as load

        _TOKENIZER.append(load())
    return _TOKENIZER[0]


def cut_short(run: LoadRun) -> LoadRun:
    """A load kept mid-run (Stop, a reload, leaving the page): its requests still waiting or
    streaming are marked stopped, and so is the run."""
    if not any(r.finish in ("running", "waiting") for r in run.requests):
        return run
    requests = tuple(replace(r, finish="stopped") if r.finish in ("running", "waiting") else r
                     for r in run.requests)
    return replace(run, requests=requests, stopped=True)


def load_files() -> RecordFiles:
    from engine.files import read_record
    from engine.remote.loadfile import load_to_bytes

    return RecordFiles(
        _("Load-test files"), "load", "load", _("Download this load"),
        "inference-explorer.loadtest.json",
        _("Every request's chunk times, tokens and text, and every /metrics sample, as JSON (no "
          "pickle): opened again here, it shows without a server."),
        _("Open a load-test file (.json)"),
        "remote_upload", FILE_MB, load_to_bytes, partial(read_record, "load-test"))


def load_files_section() -> None:
    """Download the shown load; open a load-test file (never re-run: its views are drawn from
    the file) and replay it in the live views above."""
    run = remote_results().run
    files_section(load_files(), run, run is not None,
                  lambda opened, label: keep_remote(run=opened, label=label))


def open_sample_load() -> None:
    """Show the shipped sample load as if opened from a file (no server needed) and replay it."""
    from engine.files import read_record

    try:
        run = read_record("load-test", SAMPLE_LOAD)
    except EngineError as err:
        st.error(_("The sample load did not open: {error}").format(error=message(err)))
        return
    keep_remote(run=run, label=SAMPLE_LABEL)
    ask_replay("load")


def sample_load_button() -> None:
    """Offer the sample load (when it ships): a page to look at before any server of one's own."""
    if SAMPLE_LOAD.is_file():
        st.button(_("Open a sample load recorded from vLLM"), icon=":material/science:",
                  on_click=open_sample_load, key="remote_sample_load",
                  help=_("A real load-test file: 8 requests sent at once to vLLM (CPU build, this "
                         "app's default model), with every streamed chunk and the server's "
                         "/metrics, drawn exactly as recorded."))


def hosted() -> bool:
    return config().hosted
