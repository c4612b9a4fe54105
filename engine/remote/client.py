"""An OpenAI-compatible server, from the client's side: its models, its /metrics, and one streamed
greedy completion timed chunk by chunk.

Every failure a user can cause or meet — a URL that does not answer, a model the server does not
serve, a server that is not OpenAI-compatible, a stream cut short — becomes one RemoteError
sentence; a stream cut short keeps the chunks that arrived.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

import requests

from ..errors import EngineError

MAX_METRICS_BYTES = 8 << 20
MAX_EVENT_BYTES = 1 << 20


class RemoteError(EngineError):
    """A serving engine could not be used: one line saying why."""


def normalize_base_url(url: str) -> str:
    """`http://host:port` → `http://host:port/v1` (OpenAI clients' base URL); only http(s)."""
    url = url.strip()
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RemoteError(f"{url[:120]!r} is not an http(s) URL such as http://127.0.0.1:8011/v1")
    path = parts.path.rstrip("/") or "/v1"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def metrics_url(base_url: str) -> str:
    """Prometheus /metrics sits at the server's root, beside /v1."""
    parts = urlsplit(base_url)
    return urlunsplit((parts.scheme, parts.netloc, "/metrics", "", ""))


def _explain(error: requests.RequestException, url: str) -> str:
    if isinstance(error, requests.ConnectTimeout):
        return f"no answer from {url} (connection timed out)"
    if isinstance(error, requests.ConnectionError) and not isinstance(
            error, requests.exceptions.ChunkedEncodingError):
        return f"cannot reach {url}: nothing answers there (is the server running?)"
    if isinstance(error, requests.Timeout):
        return f"{url} stopped answering (read timed out)"
    return f"{url} failed: {type(error).__name__}"


def _error_message(response: requests.Response) -> str:
    """The server's own words for an HTTP error (OpenAI's {"error": {"message": ...}})."""
    try:
        body = response.json()
        message = body.get("error", {}).get("message") if isinstance(body, dict) else None
        if isinstance(body, dict) and message is None and isinstance(body.get("message"), str):
            message = body["message"]
    except ValueError:
        message = None
    text = message if isinstance(message, str) else response.text[:200]
    return f"HTTP {response.status_code}: {' '.join(text.split())[:300]}"


def list_models(base_url: str, timeout: float = 5.0) -> list[str]:
    """The model ids the server serves (GET /v1/models)."""
    url = f"{base_url}/models"
    try:
        response = requests.get(url, timeout=timeout)
    except requests.RequestException as error:
        raise RemoteError(_explain(error, base_url)) from None
    if response.status_code != 200:
        raise RemoteError(f"{url} is not an OpenAI-compatible model list ({_error_message(response)})")
    try:
        data = response.json()["data"]
        return [str(m["id"]) for m in data]
    except (ValueError, KeyError, TypeError):
        kind = response.headers.get("content-type", "unknown content").split(";")[0]
        raise RemoteError(f"{base_url} does not look like an OpenAI-compatible server "
                          f"(GET /models answered {kind[:60]}, not a model list)") from None


def fetch_metrics_text(base_url: str, timeout: float = 2.0) -> str:
    """The body of /metrics (RemoteError if absent or larger than MAX_METRICS_BYTES)."""
    url = metrics_url(base_url)
    try:
        with requests.get(url, timeout=timeout, stream=True) as response:
            if response.status_code != 200:
                raise RemoteError(f"{url}: {_error_message(response)}")
            body = response.raw.read(MAX_METRICS_BYTES + 1, decode_content=True)
    except requests.RequestException as error:
        raise RemoteError(_explain(error, url)) from None
    if len(body) > MAX_METRICS_BYTES:
        raise RemoteError(f"{url} sent more than {MAX_METRICS_BYTES >> 20} MB")
    return body.decode("utf-8", errors="replace")


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
        with requests.post(url, json=body, stream=True, timeout=(5.0, timeout)) as response:
            if response.status_code != 200:
                result.finish, result.error = "error", _error_message(response)
                return
            kind = response.headers.get("content-type", "")
            if "text/event-stream" not in kind:
                result.finish = "error"
                result.error = (f"not an OpenAI-compatible stream: POST /completions answered "
                                f"{kind.split(';')[0][:60] or 'no content type'}")
                return
            for line in response.iter_lines(chunk_size=None):
                if should_stop():
                    result.finish = "stopped"
                    return
                if len(line) > MAX_EVENT_BYTES:
                    result.finish, result.error = "error", "the server sent an oversized event"
                    return
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                if not _take_event(data, result):
                    return
    except requests.RequestException as error:
        result.finish = "error"
        result.error = (f"the server closed the stream after {sum(result.chunk_tokens)} tokens"
                        if result.chunk_s or isinstance(
                            error, requests.exceptions.ChunkedEncodingError)
                        else _explain(error, base_url))
        return
    if result.finish == "running":
        result.finish = "error"
        result.error = f"the stream ended without a finish reason after {sum(result.chunk_tokens)} tokens"


def _take_event(data: bytes, result: StreamResult) -> bool:
    """Apply one SSE event to `result`; False (with result.error set) if the stream must end."""
    now = time.perf_counter()
    try:
        event = json.loads(data)
    except ValueError:
        result.finish = "error"
        result.error = "the server sent something that is not an OpenAI stream event"
        return False
    if not isinstance(event, dict):
        result.finish, result.error = "error", "the server sent an event that is not a JSON object"
        return False
    if "error" in event:
        error = event["error"]
        message = error.get("message") if isinstance(error, dict) else error
        result.finish, result.error = "error", f"the server reported: {str(message)[:300]}"
        return False
    usage = event.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
        result.prompt_tokens = usage["prompt_tokens"]
    choices = event.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return True
    choice = choices[0]
    prompt_ids = choice.get("prompt_token_ids")
    if isinstance(prompt_ids, list) and not result.prompt_token_ids:
        result.prompt_token_ids = [int(i) for i in prompt_ids if isinstance(i, int)]
    text = choice.get("text") or ""
    ids = choice.get("token_ids")
    ids = [int(i) for i in ids if isinstance(i, int)] if isinstance(ids, list) else None
    tokens = len(ids) if ids is not None else (1 if text else 0)
    if tokens:
        result.chunk_s.append(now)
        result.chunk_tokens.append(tokens)
        result.token_ids.extend(ids or ())
    if isinstance(text, str):
        result.text.append(text)
    reason = choice.get("finish_reason")
    if reason in ("length", "stop"):
        result.finish = reason
    elif isinstance(reason, str):
        result.finish = "stop"
    return True
