"""A link that opens a recorded run asks for the chart code in the page's own HTML.

A published run (`?view=…`) or an example (`?example=…`) is drawn at once, charts included, and
Streamlit's front end loads an element's code only when that element first arrives: for plotly
(ui/preload.py: ~4.7 MB, about a second of the browser's main thread to evaluate) that is after
the app has started, the websocket connected and the page's first elements drawn, and the
browser sits mostly idle while the app's own code downloads at the start. So the app's HTML
(Streamlit's index.html, served to every address of the app) gets one more line for such
links: module imports of plotly's chunk and the code block's, the same files under the same
addresses the front end imports later (it then finds them evaluated). A first visit without a
run keeps the plain page: there the prompt box comes first and the chart code later
(ui/preload.py).

Streamlit has no setting for the page's head, so `install()` wraps the function that makes its
static-file handler (scripts/streamlit_app.py calls it before the server starts); it fails
loudly if a Streamlit upgrade has moved that function.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl

from ui.preload import CHUNKS, chunk_files

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

RUN_PARAMETERS = ("view", "example")  # a link with one of these draws a recorded run at once
EARLY = CHUNKS  # plotly's chunk and the code block's (the share panel's link is a code block)
MAX_PAGE_BYTES = 1 << 20  # the app's HTML is ~10 kB; anything larger passes through untouched


def opens_a_run(query_string: bytes) -> bool:
    names = {name for name, _ in parse_qsl(query_string.decode("latin-1"))}
    return any(name in names for name in RUN_PARAMETERS)


def early_imports(files: tuple[str, ...]) -> bytes:
    lines = "".join(f"import({json.dumps('./static/js/' + name)}).catch(() => {{}});"
                    for name in files)
    return f'<script type="module">{lines}</script>\n'.encode()


def _header(message: Message, name: bytes) -> bytes:
    return next((v for k, v in message.get("headers", []) if k.lower() == name), b"")


def with_early_imports(app: App, files: tuple[str, ...]) -> App:
    """`app` (Streamlit's static files) whose HTML answers to run links import `files` early."""
    script = early_imports(files)

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if (not files or scope["type"] != "http" or scope.get("method") != "GET"
                or not opens_a_run(scope.get("query_string", b""))):
            await app(scope, receive, send)
            return
        extensions = {k: v for k, v in scope.get("extensions", {}).items()
                      if k != "http.response.pathsend"}  # the body must come as messages
        held: list[Message] = []
        body = bytearray()

        async def edit(message: Message) -> None:
            kind = message["type"]
            if kind == "http.response.start":
                html = _header(message, b"content-type").startswith(b"text/html")
                if html and int(_header(message, b"content-length") or 0) <= MAX_PAGE_BYTES:
                    held.append(message)
                    return
            elif kind == "http.response.body" and held:
                body.extend(message.get("body", b""))
                if message.get("more_body", False):
                    return
                page = bytes(body).replace(b"</head>", script + b"</head>", 1)
                headers = [(k, v) for k, v in held[0].get("headers", [])
                           if k.lower() != b"content-length"]
                headers.append((b"content-length", str(len(page)).encode()))
                await send({**held[0], "headers": headers})
                await send({"type": "http.response.body", "body": page, "more_body": False})
                return
            await send(message)

        await app({**scope, "extensions": extensions}, receive, edit)

    return wrapped


def install() -> None:
    """Make Streamlit's static-file handler answer run links with the early import."""
    from streamlit.web.server.starlette import starlette_static_routes as routes

    make = getattr(routes, "create_streamlit_static_handler", None)
    if make is None or getattr(make, "early_imports", False):
        if make is None:
            raise RuntimeError("Streamlit's static-file handler moved: ui/link_page.py needs "
                               "updating for this Streamlit version")
        return
    files = chunk_files(EARLY)

    def make_with_early_imports(directory: str, base_url: str | None) -> Any:
        return with_early_imports(make(directory, base_url), files)

    make_with_early_imports.early_imports = True  # type: ignore[attr-defined]
    routes.create_streamlit_static_handler = make_with_early_imports
