"""Visitors without a browser: Streamlit's own websocket protocol, spoken by a small client.

A class's browsers run on the students' machines, not on the server's cores; thirty Chromium
pages on the bench machine would spend most of its two cores drawing (measured: 72 % of the CPU
with ten pages) and time the browser, not the server. A `Visitor` does what the Generate page's
browser does on the wire: it opens the websocket (`/_stcore/stream`, subprotocol "streamlit",
its own X-Forwarded-For as a Space's proxy writes it), asks for the page (a rerun with the query
string), finds the Prompt box and the form's Generate button among the elements the server
sends, then sends the rerun a Ctrl+Enter sends: the prompt's text and the button's trigger.
Its clock (`time.monotonic`) marks the first generated token's chip (the chips' HTML holding a
generated token) and the finished run (the summary line, then the script's end).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
from websockets.asyncio.client import connect

GENERATED = "ie-gen"  # the class of a generated token's chip (charts/tokens.py)
DONE = "stopped because"  # the run's summary line
LIMIT = "model time per click"  # in it when the per-click budget stopped the run


@dataclass
class Visitor:
    """One visitor's session; times in seconds of `time.monotonic()`."""

    url: str  # http://host:port
    client: str  # its X-Forwarded-For address
    query: str = ""  # the page's query string (without "?")
    page_hash: str = ""
    prompt_id: str | None = None
    button_id: str | None = None
    loaded: asyncio.Event = field(default_factory=asyncio.Event)
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    pressed: float | None = None
    first: float | None = None
    done: float | None = None
    summary_seen: bool = False
    cut: bool = False  # the per-click budget stopped the run
    errors: list[str] = field(default_factory=list)

    def _rerun(self, widgets: list | None = None) -> bytes:
        msg = BackMsg()
        state = msg.rerun_script
        state.query_string = self.query
        state.page_script_hash = self.page_hash
        for widget in widgets or []:
            state.widget_states.widgets.append(widget)
        return msg.SerializeToString()

    def _read(self, data: bytes) -> None:
        msg = ForwardMsg()
        msg.ParseFromString(data)
        kind = msg.WhichOneof("type")
        if kind == "navigation" and msg.navigation.page_script_hash:
            self.page_hash = msg.navigation.page_script_hash
        elif kind == "page_info_changed":
            pass
        elif kind == "delta":
            self._element(msg.delta)
        elif kind == "script_finished":
            if self.prompt_id and self.button_id:
                self.ready.set()
            if self.pressed is not None and self.summary_seen and self.done is None:
                self.done = time.monotonic()
                self.finished.set()

    def _element(self, delta) -> None:
        if delta.WhichOneof("type") != "new_element":
            return
        element = delta.new_element
        kind = element.WhichOneof("type")
        if kind == "text_area" and element.text_area.label == "Prompt":
            self.prompt_id = element.text_area.id
        elif kind == "button" and element.button.is_form_submitter \
                and element.button.label.startswith("Generate"):
            self.button_id = element.button.id
        elif kind == "markdown" and self.pressed is not None:
            body = element.markdown.body
            if self.first is None and GENERATED in body:
                self.first = time.monotonic()
            if DONE in body:
                self.summary_seen = True
                self.cut = LIMIT in body
        elif kind == "exception":
            self.errors.append(element.exception.message[:200])
        elif kind == "alert" and element.alert.format == 1:  # ERROR
            self.errors.append(element.alert.body[:200])
        if kind == "text" and "Loaded" in element.text.body:
            self.loaded.set()

    async def run(self, prompt: str, start: asyncio.Event, timeout_s: float) -> None:
        """Open the page, wait for `start`, press Generate, read until the run has finished."""
        ws_url = self.url.replace("http", "ws", 1) + "/_stcore/stream"
        async with connect(ws_url, subprotocols=["streamlit"], max_size=None,
                           additional_headers={"X-Forwarded-For": self.client}) as ws:
            reader = asyncio.create_task(self._reader(ws))
            await ws.send(self._rerun())
            try:
                await asyncio.wait_for(self.ready.wait(), 300)
                await start.wait()
                from streamlit.proto.WidgetStates_pb2 import WidgetState

                text = WidgetState(id=self.prompt_id, string_value=prompt)
                button = WidgetState(id=self.button_id, trigger_value=True)
                self.pressed = time.monotonic()
                await ws.send(self._rerun([text, button]))
                await asyncio.wait_for(self.finished.wait(), timeout_s)
            except asyncio.TimeoutError:
                self.errors.append("timed out")
            finally:
                reader.cancel()

    async def _reader(self, ws) -> None:
        async for data in ws:
            if isinstance(data, bytes):
                self._read(data)


async def class_at_once(url: str, visitors: int, prompt: str, query: str,
                        timeout_s: float) -> list[Visitor]:
    """`visitors` sessions open the page; once all are ready, all press Generate at once."""
    start = asyncio.Event()
    crowd = [Visitor(url, f"10.39.{i // 250}.{i % 250 + 1}", query) for i in range(visitors)]
    tasks = [asyncio.create_task(v.run(prompt, start, timeout_s)) for v in crowd]
    deadline = time.monotonic() + 600
    while not all(v.ready.is_set() for v in crowd):
        if time.monotonic() > deadline or any(t.done() for t in tasks):
            break
        await asyncio.sleep(0.2)
    start.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    for v, t in zip(crowd, tasks):
        if t.done() and t.exception() is not None:
            v.errors.append(repr(t.exception())[:200])
    return crowd
