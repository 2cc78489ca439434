"""A scripted OpenAI-compatible model server on 127.0.0.1, for tests, the demo and notebooks.

Reach it through LiteLLM exactly as a real provider, e.g.
`dspy.LM("openai/gpt-4o-mini", api_base=server.url, api_key="local")`. It answers
`POST /v1/chat/completions` with what its `responder` returns, records every request, and
can be told to misbehave (status codes, stalls, broken bodies) for reliability tests.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .._core.values import content_text

__all__ = ["DevServer", "Fault", "Request", "dspy_reply"]


@dataclass(frozen=True)
class Request:
    """One request the server received."""

    path: str
    body: dict[str, Any]
    headers: dict[str, str]
    at: float

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages") or [])

    @property
    def system(self) -> str:
        return "\n".join(_text(m) for m in self.messages if m.get("role") == "system")

    @property
    def user(self) -> str:
        return "\n".join(_text(m) for m in self.messages if m.get("role") == "user")

    @property
    def text(self) -> str:
        """Every message's text, joined: what a model would read."""
        return "\n".join(_text(m) for m in self.messages)


@dataclass
class Fault:
    """A scripted misbehaviour for the next request(s): a status, a stall, a broken body."""

    status: int = 200
    retry_after: float | str | None = None  # a number of seconds, or any text (a date, garbage) sent as it is
    stall: float = 0.0
    close_connection: bool = False
    invalid_json: bool = False
    empty_completion: bool = False
    times: int = 1


@dataclass
class _Reply:
    content: str
    model: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


def _text(message: dict[str, Any]) -> str:
    return content_text(message.get("content"))


def dspy_reply(**fields: Any) -> str:
    """A completion in DSPy's ChatAdapter format, giving each output field its value."""
    parts = [f"[[ ## {name} ## ]]\n{value}" for name, value in fields.items()]
    return "\n\n".join([*parts, "[[ ## completed ## ]]"])


Responder = Callable[[Request], Any]


class _QuietServer(ThreadingHTTPServer):
    """A client that hangs up mid-answer (a cancelled llm() request, a timed-out call) is no error of the server's:
    it is not printed as a traceback on the test's or the notebook's stderr. Its listen queue holds as many
    connections at once as a provider's does: socketserver's default of 5 drops the rest, and a client whose
    connection was dropped tries again a second later (gathered async judge questions open dozens at once)."""

    request_queue_size = 256

    def handle_error(self, request: object, client_address: object) -> None:
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


class DevServer:
    """The loopback server. Use as a context manager, or start() / stop().

    `responder(request)` returns the completion text (str), or a dict with `content` and
    optionally `model`, `prompt_tokens`, `completion_tokens`. `model_name` is the model the
    server reports (LiteLLM prices a known name such as "gpt-4o-mini"); `delay` seconds are
    added before every answer. `max_concurrent=N` answers 429 (with `retry_after`, if given) to a request
    that arrives while N are being answered, as a provider's concurrency limit does (`rate_limited` counts
    them); `rate_limit_every=N` answers 429 (with `retry_after`) to every Nth request, a sporadic provider
    limit; `fault_for(request)` returns a Fault for the requests it picks (e.g. always a 503 for some input), or
    None; `usage=False` leaves the `usage` block out of replies, as some providers do. A request's `max_tokens`
    is honoured as a provider does: the reply is cut to that many tokens (one word a token), finish_reason "length".
    `requests` records every request, with the time it arrived (`Request.at`).
    """

    def __init__(
        self,
        responder: Responder | None = None,
        *,
        model_name: str | None = None,
        delay: float = 0.0,
        port: int = 0,
        max_concurrent: int | None = None,
        retry_after: float | str | None = None,
        usage: bool = True,
        rate_limit_every: int | None = None,
        fault_for: Callable[[Request], Fault | None] | None = None,
    ):
        self.responder: Responder = responder or (lambda request: "ok")
        self.model_name = model_name
        self.delay = delay
        self.max_concurrent = max_concurrent
        self.retry_after = retry_after
        self.usage = usage
        self.rate_limit_every = rate_limit_every
        self.fault_for = fault_for
        self.rate_limited = 0  # requests answered 429 because max_concurrent were in progress
        self.in_progress = 0
        self.most_in_progress = 0  # the most requests ever answered at once
        self.requests: list[Request] = []
        self._faults: deque[Fault] = deque()
        self._lock = threading.Lock()
        self._httpd = _QuietServer(("127.0.0.1", port), _handler_for(self))
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        """The OpenAI-compatible base URL, to pass as `api_base`."""
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> DevServer:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="skynet-devserver", daemon=True
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> DevServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def fail_next(self, fault: Fault | None = None, **settings: Any) -> None:
        """Queue a misbehaviour for the next request(s), e.g. fail_next(status=429, retry_after=1)."""
        with self._lock:
            self._faults.append(fault or Fault(**settings))

    def clear(self) -> None:
        """Forget the recorded requests and queued faults."""
        with self._lock:
            self.requests.clear()
            self._faults.clear()

    def _record(self, request: Request) -> Fault | None:
        with self._lock:
            self.requests.append(request)
            if not self._faults:
                return None
            fault = self._faults[0]
            fault.times -= 1
            if fault.times <= 0:
                self._faults.popleft()
            return fault

    def _answer(self, request: Request) -> _Reply:
        reply = self.responder(request)
        if isinstance(reply, _Reply):
            return reply
        if isinstance(reply, dict):
            return _Reply(**reply)
        return _Reply(str(reply))


def _handler_for(server: DevServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # else each reply waits ~40 ms on a delayed ACK

        def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
            pass

        def do_GET(self) -> None:
            if self.path.rstrip("/").endswith("/models"):
                self._send(200, {"object": "list", "data": [{"id": server.model_name or "dev", "object": "model"}]})
            else:
                self._send(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw or b"{}")
            except json.JSONDecodeError:
                self._send(400, {"error": {"message": "request body is not JSON"}})
                return
            request = Request(self.path, body, dict(self.headers.items()), time.time())
            self._counted = True
            with server._lock:
                server.in_progress += 1
                server.most_in_progress = max(server.most_in_progress, server.in_progress)
                over = server.max_concurrent is not None and server.in_progress > server.max_concurrent
                every = server.rate_limit_every
                over = over or (every is not None and (len(server.requests) + 1) % every == 0)
                if over:
                    server.rate_limited += 1
            try:
                if over:
                    server._record(request)
                    self._send(429, {"error": {"message": "too many requests", "type": "rate_limit",
                                               "code": 429}}, _retry_after(server.retry_after))
                    return
                self._post(request)
            finally:
                self._answered()

        def _answered(self) -> None:
            """The request no longer counts as in progress: before its reply is written (a client that has its
            reply may send the next request at once, which must not find this one still counted)."""
            if getattr(self, "_counted", False):
                self._counted = False
                with server._lock:
                    server.in_progress -= 1

        def _post(self, request: Request) -> None:
            fault = server._record(request)
            if fault is None and server.fault_for is not None:
                fault = server.fault_for(request)
            if fault is not None and fault.stall:
                time.sleep(fault.stall)
            if server.delay:
                time.sleep(server.delay)
            if fault is not None and fault.close_connection:
                self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n{\"id\": ")
                self.wfile.flush()
                self.close_connection = True
                return
            if fault is not None and fault.status != 200:
                headers = _retry_after(fault.retry_after)
                message = {401: "invalid api key", 403: "forbidden", 429: "rate limited"}.get(fault.status, "error")
                self._send(fault.status, {"error": {"message": message, "type": "scripted", "code": fault.status}},
                           headers)
                return
            if fault is not None and fault.invalid_json:
                self._send_raw(200, b"{not json", "application/json")
                return
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._send(404, {"error": {"message": f"no route {self.path}"}})
                return
            try:
                reply = _Reply("") if fault is not None and fault.empty_completion else server._answer(request)
            except Exception as exc:
                self._send(500, {"error": {"message": f"responder raised {type(exc).__name__}: {exc}"}})
                return
            completion = _completion(request, reply, server.model_name)
            if not server.usage:
                del completion["usage"]
            self._send(200, completion)

        def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
            self._send_raw(status, json.dumps(payload).encode(), "application/json", headers)

        def _send_raw(self, status: int, data: bytes, kind: str, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self._answered()
            self.wfile.write(data)

    return Handler


_counter = iter(range(1, 1 << 62))


def _retry_after(value: float | str | None) -> dict[str, str]:
    if value is None:
        return {}
    return {"Retry-After": value if isinstance(value, str) else f"{value:g}"}


def _completion(request: Request, reply: _Reply, model_name: str | None) -> dict[str, Any]:
    prompt_tokens = reply.prompt_tokens if reply.prompt_tokens is not None else max(1, len(request.text.split()))
    completion_tokens = (
        reply.completion_tokens if reply.completion_tokens is not None else max(1, len(reply.content.split()))
    )
    model = reply.model or model_name or str(request.body.get("model") or "dev")
    content, finish = reply.content, "stop"
    limit = request.body.get("max_tokens") or request.body.get("max_completion_tokens")
    if isinstance(limit, int) and completion_tokens > limit:  # a provider stops at max_tokens
        content, completion_tokens, finish = " ".join(content.split()[:limit]), limit, "length"
    return {
        "id": f"chatcmpl-dev-{next(_counter)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish}
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }
