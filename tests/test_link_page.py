"""ui/link_page.py: the app's HTML, answered to a link that opens a recorded run, imports the
chart code at once; every other answer is Streamlit's own, byte for byte. Driven through
Streamlit's real static-file handler (the one the server mounts) over ASGI messages."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from streamlit.web.server.starlette import starlette_static_routes as routes

from ui.link_page import early_imports, install, opens_a_run, with_early_imports

PAGE = b"<!DOCTYPE html><html><head><title>app</title></head><body></body></html>"
FILES = ("PlotlyChart.abc123.js",)


def get(app, path: str, query: bytes = b"", method: str = "GET") -> tuple[dict, bytes]:
    """One request through an ASGI app: (the response's start message, its whole body)."""
    sent: list[dict] = []
    asked: list[bool] = []

    async def receive():  # the request once, then a client that stays connected
        if asked:
            await asyncio.Event().wait()
        asked.append(True)
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(),
             "query_string": query, "headers": [], "root_path": "", "scheme": "http",
             "server": ("127.0.0.1", 8501), "http_version": "1.1",
             "extensions": {"http.response.pathsend": {}}}
    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(Path(m["path"]).read_bytes() if m["type"] == "http.response.pathsend"
                    else m.get("body", b"") for m in sent if m["type"] != "http.response.start")
    return start, body


@pytest.fixture
def static(tmp_path: Path):
    (tmp_path / "index.html").write_bytes(PAGE)
    (tmp_path / "static").mkdir()
    (tmp_path / "static" / "x.js").write_bytes(b"export const x = 1;")
    plain = routes.create_streamlit_static_handler(str(tmp_path), None)
    return plain, with_early_imports(plain, FILES)


def length(start: dict) -> int:
    return int(dict(start["headers"])[b"content-length"])


def test_a_run_link_gets_the_import_with_a_true_length(static):
    _, wrapped = static
    for path, query in (("/", b"view=A1b2"), ("/attention", b"example=qa&layer=3"),
                        ("/generate", b"s=tok&view=A1b2")):
        start, body = get(wrapped, path, query)
        assert start["status"] == 200 and length(start) == len(body)
        assert body == PAGE.replace(b"</head>", early_imports(FILES) + b"</head>")
    assert b'import("./static/js/PlotlyChart.abc123.js")' in early_imports(FILES)


def test_everything_else_is_streamlits_answer_unchanged(static):
    plain, wrapped = static
    for path, query, method in (("/", b"", "GET"), ("/attention", b"layer=3&s=tok", "GET"),
                                ("/", b"view=A1b2", "HEAD"), ("/static/x.js", b"view=A1b2", "GET"),
                                ("/generate", b"viewer=1", "GET")):
        assert get(wrapped, path, query, method) == get(plain, path, query, method)
    assert not opens_a_run(b"prompt=view%3D1&s=x") and not opens_a_run(b"view=")


def test_install_wraps_streamlits_handler_once(monkeypatch):
    monkeypatch.setattr(routes, "create_streamlit_static_handler",
                        routes.create_streamlit_static_handler)
    install()
    made = routes.create_streamlit_static_handler
    install()  # a second call changes nothing
    assert routes.create_streamlit_static_handler is made and made.early_imports
    monkeypatch.delattr(routes, "create_streamlit_static_handler")
    with pytest.raises(RuntimeError, match="moved"):
        install()
