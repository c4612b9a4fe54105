"""An OpenAI-compatible server, from the client's side: its models, its /metrics, and one streamed
greedy completion timed chunk by chunk.

Requests go only to the base URL's one canonical spelling (`normalize_base_url`, which the shared
server's guard checks too: what is checked is what is connected to) and never follow a redirect
(a redirect is an answer like any other non-200: one line, nothing sent further).

Every failure a user can cause or meet — a URL that does not answer, a model the server does not
serve, a server that is not OpenAI-compatible, a stream cut short — becomes one RemoteError
sentence; a stream cut short keeps the chunks that arrived.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

import requests
import urllib3

from i18n import _

from ..errors import EngineError

MAX_METRICS_BYTES = 8 << 20
MAX_EVENT_BYTES = 1 << 20
MAX_BODY_BYTES = 1 << 20  # a model list or an error answer
MAX_ID = 1 << 31  # token ids and counts beyond any vocabulary or context


# What reading a body straight from the socket can raise when the server misbehaves
READ_ERRORS = (requests.RequestException, urllib3.exceptions.HTTPError, http.client.HTTPException,
               OSError)


class RemoteError(EngineError):
    """A serving engine could not be used: one line saying why."""


# What a base URL may hold, so that every parser reads it alike: a scheme, a host (a DNS name of
# letters, digits and hyphens, an IPv4 address, or a bracketed IPv6 address without a zone), an
# optional port of digits, and a path of plain characters. No user info, query, fragment,
# percent-escape, backslash, space or non-ASCII character: each is a place where urllib's reading
# and urllib3's (what `requests` connects with) have differed — `http://127.0.0.1:8623\@127.0.0.1:
# 8011/v1` is 127.0.0.1:8011 to one and 127.0.0.1:8623 to the other.
_BASE_URL = re.compile(
    r"(?P<scheme>https?)://"
    r"(?P<host>[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]{2,45}\])"
    r"(?::(?P<port>[0-9]{1,5}))?"
    r"(?P<path>(?:/[A-Za-z0-9._~-]*)*)", re.ASCII | re.IGNORECASE)


def normalize_base_url(url: str) -> str:
    """`http://host:port` → `http://host:port/v1` (OpenAI clients' base URL): the one spelling
    this app checks and connects to. Only http(s) URLs of the plain shape above, which urllib and
    urllib3 read as the same scheme, host, port and path (checked); anything else is refused
    in one line, before any request."""
    text = url.strip()
    refused = RemoteError(_("{url} is not a plain http(s) URL such as http://127.0.0.1:8011/v1 "
                            "(no user name, query, escapes or backslashes)").format(
        url=repr(text[:120])))
    found = _BASE_URL.fullmatch(text)
    if found is None:
        raise refused
    scheme, host = found["scheme"].lower(), found["host"].lower()
    port = int(found["port"]) if found["port"] else None
    path = found["path"].rstrip("/") or "/v1"
    if (port is not None and not 1 <= port <= 65535) or ".." in path.split("/"):
        raise refused
    labels = host.split(".")
    try:
        if host.startswith("["):
            ipaddress.IPv6Address(host[1:-1])
        elif labels[-1].isdigit() or any(label.startswith("0x") for label in labels):
            ipaddress.IPv4Address(host)  # four plain decimals: never 127.1, 0x7f.1 or 0177.0.0.1
    except ValueError:
        raise refused from None
    netloc = host if port is None else f"{host}:{port}"
    canonical = f"{scheme}://{netloc}{path}"
    try:  # both parsers read the canonical spelling as the same address
        ours, theirs = urlsplit(canonical), urllib3.util.parse_url(canonical)
        same = ((ours.scheme, (ours.hostname or "").lower(), ours.port, ours.path)
                == (theirs.scheme, (theirs.host or "").lower().strip("[]"), theirs.port,
                    theirs.path) and ours.username is None and theirs.auth is None)
    except ValueError:
        same = False
    if not same:
        raise refused
    return canonical


def metrics_url(base_url: str) -> str:
    """Prometheus /metrics sits at the server's root, beside /v1."""
    parts = urlsplit(base_url)
    return urlunsplit((parts.scheme, parts.netloc, "/metrics", "", ""))


def _explain(error: Exception, url: str) -> str:
    if isinstance(error, requests.ConnectTimeout):
        return _("no answer from {url} (connection timed out)").format(url=url)
    if isinstance(error, requests.ConnectionError) and not isinstance(
            error, requests.exceptions.ChunkedEncodingError):
        return _("cannot reach {url}: nothing answers there (is the server running?)").format(url=url)
    if isinstance(error, requests.Timeout):
        return _("{url} stopped answering (read timed out)").format(url=url)
    return _("{url} broke off its answer ({error})").format(url=url, error=type(error).__name__)


def _read_capped(response: requests.Response, limit: int, deadline_s: float) -> bytes:
    """At most `limit` + 1 bytes of a streamed body, within `deadline_s` overall (a server that
    trickles a byte at a time cannot hold the client): RemoteError past the deadline."""
    deadline = time.perf_counter() + deadline_s
    body = bytearray()
    while len(body) <= limit:
        if time.perf_counter() > deadline:
            raise RemoteError(_("{url} took more than {seconds:g} s to answer").format(
                url=response.url, seconds=deadline_s))
        piece = response.raw.read1(min(65536, limit + 1 - len(body)), decode_content=True) \
            if hasattr(response.raw, "read1") else response.raw.read(65536, decode_content=True)
        if not piece:
            break
        body += piece
    return bytes(body)


def _body(response: requests.Response, limit: int = MAX_BODY_BYTES) -> bytes | None:
    """The body, read up to `limit` within 10 s; None if longer, slower or cut."""
    try:
        body = _read_capped(response, limit, 10.0)
    except (RemoteError, *READ_ERRORS):
        return None
    return body if len(body) <= limit else None


def _json(body: bytes | None) -> object:
    if body is None:
        return None
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return None


def _kind(response: requests.Response) -> str:
    kind = response.headers.get("content-type")
    return _("no content type") if kind is None else kind.split(";")[0].strip()[:60]


def _error_message(response: requests.Response) -> str:
    """The server's own words for an HTTP error: OpenAI's {"error": {"message": ...}}, or
    {"error": "..."} (vLLM with an API key, TGI), or {"message": ...}; else its status, kind and
    the start of its text with any markup taken out."""
    raw = _body(response)
    body = _json(raw)
    message = None
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            message = error["message"]
        elif isinstance(error, str):
            message = error
        elif isinstance(body.get("message"), str):
            message = body["message"]
    if message is None:
        text = " ".join(re.sub(r"<[^>]*>", " ", (raw or b"").decode("utf-8", "replace")).split())
        return f"HTTP {response.status_code} ({_kind(response)})" + (
            f": {text[:120]}" if text else "")
    return f"HTTP {response.status_code}: {' '.join(message.split())[:300]}"


def list_models(base_url: str, timeout: float = 5.0) -> list[str]:
    """The model ids the server serves (GET /v1/models)."""
    url = f"{base_url}/models"
    try:
        with requests.get(url, timeout=timeout, stream=True, allow_redirects=False) as response:
            if response.status_code != 200:
                if "json" not in _kind(response):
                    raise RemoteError(_("{url} does not look like an OpenAI-compatible server "
                                        "(GET /models answered HTTP {status} {kind})").format(
                        url=base_url, status=response.status_code, kind=_kind(response)))
                raise RemoteError(_("{url} is not an OpenAI-compatible model list "
                                    "({error})").format(url=url, error=_error_message(response)))
            body = _json(_body(response))
            kind = _kind(response)
    except READ_ERRORS as error:
        raise RemoteError(_explain(error, base_url)) from None
    try:
        return [str(m["id"])[:200] for m in body["data"]][:1000]  # type: ignore[index]
    except (KeyError, TypeError, IndexError):
        raise RemoteError(_("{url} does not look like an OpenAI-compatible server (GET /models "
                            "answered {kind}, not a model list)").format(url=base_url, kind=kind)
                          ) from None


def fetch_metrics_text(base_url: str, timeout: float = 2.0) -> str:
    """The body of /metrics (RemoteError if absent, larger than MAX_METRICS_BYTES or slower
    than `timeout` overall)."""
    url = metrics_url(base_url)
    try:
        with requests.get(url, timeout=timeout, stream=True, allow_redirects=False) as response:
            if response.status_code != 200:
                raise RemoteError(f"{url}: {_error_message(response)}")
            body = _read_capped(response, MAX_METRICS_BYTES, timeout)
    except READ_ERRORS as error:
        raise RemoteError(_explain(error, url)) from None
    if len(body) > MAX_METRICS_BYTES:
        raise RemoteError(_("{url} sent more than {mb} MB").format(url=url,
                                                                   mb=MAX_METRICS_BYTES >> 20))
    return body.decode("utf-8", errors="replace")


def _lines(response: requests.Response, should_stop: Callable[[], bool]) -> Iterator[bytes]:
    """The body's lines as they arrive, chunked or not (a body ended by closing the connection is
    read as it comes, not to its end); OversizedEvent once a line passes MAX_EVENT_BYTES."""
    pending = bytearray()
    while not should_stop():
        piece = response.raw.read1(65536, decode_content=True)
        if not piece:
            break
        pending += piece
        while (end := pending.find(b"\n")) >= 0:
            if end > MAX_EVENT_BYTES:
                raise OversizedEvent
            yield bytes(pending[:end]).rstrip(b"\r")
            del pending[:end + 1]
        if len(pending) > MAX_EVENT_BYTES:
            raise OversizedEvent
    if pending and not should_stop():
        yield bytes(pending)


class OversizedEvent(Exception):
    """A streamed line longer than MAX_EVENT_BYTES."""


@dataclass
class StreamResult:
    """One streamed completion as it arrives (filled in place, read by the load test's snapshots).
    `chunk_s` are perf_counter seconds."""

    sent_s: float | None = None
    chunk_s: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    prompt_tokens: int | None = None
    prompt_token_ids: list[int] = field(default_factory=list)
    finish: str = "running"
    error: str | None = None


def stream_completion(base_url: str, model: str, prompt: str, max_tokens: int,
                      result: StreamResult, should_stop: Callable[[], bool],
                      timeout: float = 120.0) -> None:
    """POST /v1/completions with stream=True, temperature 0, filling `result` chunk by chunk.
    Asks for token ids (vLLM's `return_token_ids`; other servers ignore it). Never raises for the
    server's faults: they end up in `result.error`, with the chunks that came before."""
    url = f"{base_url}/completions"
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True}
    result.sent_s = time.perf_counter()
    try:
        with requests.post(url, json=body, stream=True, timeout=(5.0, timeout),
                           allow_redirects=False) as response:
            if response.status_code != 200:
                result.finish, result.error = "error", _error_message(response)
                return
            if "text/event-stream" not in _kind(response):
                result.finish = "error"
                result.error = _("not an OpenAI-compatible stream: POST /completions answered "
                                 "{kind}").format(kind=_kind(response))
                return
            for line in _lines(response, should_stop):
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                if not _take_event(data, result, max_tokens):
                    return
            if should_stop() and result.finish == "running":
                result.finish = "stopped"
                return
    except OversizedEvent:
        result.finish, result.error = "error", _("the server sent an oversized event")
        return
    except READ_ERRORS as error:
        result.finish = "error"
        result.error = (_explain(error, base_url) if isinstance(error, requests.RequestException)
                        and not result.chunk_s and not isinstance(
                            error, requests.exceptions.ChunkedEncodingError)
                        else _("the server closed the stream after {n} tokens").format(
                            n=sum(result.chunk_tokens)))
        return
    if result.finish == "running":
        result.finish = "error"
        result.error = _("the stream ended without a finish reason after {n} tokens").format(
            n=sum(result.chunk_tokens))


def _ids(value: object) -> list[int] | None:
    """A list of token ids, or None if it is not one (ids must lie in 0..2³¹)."""
    if not isinstance(value, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < MAX_ID for i in value):
        return None
    return list(value)


def _take_event(data: bytes, result: StreamResult, max_tokens: int) -> bool:
    """Apply one SSE event to `result`; False (with result.error set) if the stream must end.
    What a hostile server could send that no record may hold (more tokens than asked for, ids
    beyond any vocabulary) ends the request with an error; the tokens before it are kept."""
    now = time.perf_counter()

    def fail(why: str) -> bool:
        result.finish, result.error = "error", why
        return False

    try:
        event = json.loads(data)
    except (ValueError, RecursionError):
        return fail(_("the server sent something that is not an OpenAI stream event"))
    if not isinstance(event, dict):
        return fail(_("the server sent an event that is not a JSON object"))
    if "error" in event:
        error = event["error"]
        message = error.get("message") if isinstance(error, dict) else error
        return fail(_("the server reported: {message}").format(
            message=" ".join(str(message).split())[:300]))
    usage = event.get("usage")
    if isinstance(usage, dict):
        prompt_tokens = usage.get("prompt_tokens")
        if isinstance(prompt_tokens, int) and not isinstance(prompt_tokens, bool) \
                and 0 <= prompt_tokens < MAX_ID:
            result.prompt_tokens = prompt_tokens
    choices = event.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return True
    choice = choices[0]
    prompt_ids = _ids(choice.get("prompt_token_ids"))
    if prompt_ids and not result.prompt_token_ids:
        result.prompt_token_ids = prompt_ids[:MAX_ID]
    text = choice.get("text")
    text = text if isinstance(text, str) else ""
    raw_ids = choice.get("token_ids")
    ids = _ids(raw_ids)
    if raw_ids is not None and ids is None:
        return fail(_("the server sent token ids that are not ids"))
    tokens = len(ids) if ids is not None else (1 if text else 0)
    if sum(result.chunk_tokens) + tokens > max_tokens:
        return fail(_("the server sent more than the {n} tokens asked for").format(n=max_tokens))
    if tokens:
        result.token_ids.extend(ids or ())
        result.chunk_tokens.append(tokens)  # before the time: a snapshot reads counts first
        result.chunk_s.append(now)
    result.text.append(text)
    reason = choice.get("finish_reason")
    if reason in ("length", "stop"):
        result.finish = reason
    elif isinstance(reason, str):
        result.finish = "stop"
    return True
