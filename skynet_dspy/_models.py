"""Model routing for llm(): the metric model, falling back to the reflection model, via LiteLLM (SPEC §5).

A `Models` holds where a metric's llm() calls go, retries transient failures, caches identical
requests (memory by default, a sqlite file on request) and counts the judge's usage. LiteLLM is
imported on the first call only, so `import skynet_dspy` stays fast.
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import logging
import os
import random
import re
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from . import _measure, _secrets

logger = logging.getLogger("skynet_dspy")

DEFAULT_REQUEST_TIMEOUT = 60.0  # seconds per HTTP request to the judge model
DEFAULT_MAX_RETRIES = 4  # retries after the first attempt, on 408 / 429 / 5xx / connection errors
DEFAULT_RETRY_BASE_DELAY = 1.0  # seconds; doubled on every retry
MAX_RETRY_DELAY = 30.0  # no backoff sleep is longer; a larger Retry-After is not honoured
MEMORY_CACHE_SIZE = 10_000
DISK_CACHE_FILE = "skynet-judge-cache.sqlite3"

_RETRY_STATUSES = frozenset({408, 409, 429})
_AUTH_STATUSES = frozenset({401, 403})
# dspy.LM settings that are DSPy's own or that this module sets itself: never sent to LiteLLM.
_NOT_SENT = frozenset({"rollout_id", "prompt_cache", "num_retries", "max_retries", "cache", "callbacks"})
# Settings that do not change the answer, left out of the cache key (and so never written to disk).
_NOT_KEYED = frozenset({"api_key", "timeout", "request_timeout", "extra_headers", "headers"})
_REFUSED_OVERRIDES = frozenset({"messages", "stream"})
# LiteLLM reports a missing key as a 500 before sending anything; retrying cannot help.
_MISSING_KEY = re.compile(r"missing credentials|api_key client option must be set|no api key", re.IGNORECASE)

_sleep = time.sleep  # tests replace this to record the backoff without waiting


class ModelNotConfigured(RuntimeError):
    """llm() was called with neither a metric model nor a reflection model set."""


class LLMCallError(RuntimeError):
    """The judge model could not answer: a refused key, a bad request, or retries used up.

    `status` is the HTTP status when there was one; the message never holds an API key.
    """

    def __init__(self, message: str, status: int | None = None):
        super().__init__(_secrets.redact(message))
        self.status = status


@dataclass(frozen=True, slots=True)
class JudgeUsage:
    """What a metric's llm() calls used: requests sent, cache hits, tokens, USD cost and time.

    `calls` counts every request sent (retried attempts included; `errors` of them failed).
    `cost_usd` is None when the price of any answered request is unknown. `seconds` is the wall
    time spent on requests, backoff waits included. Cache hits cost nothing and take no time here.
    """

    calls: int = 0
    cache_hits: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = 0.0
    seconds: float = 0.0
    errors: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class _Endpoint:
    """One model to call: a LiteLLM model string and the settings sent with it (key included)."""

    __slots__ = ("model", "settings", "role")

    def __init__(self, model: str, settings: Mapping[str, Any], role: str):
        self.model = model
        self.settings = MappingProxyType(dict(settings))
        self.role = role

    @property
    def api_base(self) -> str | None:
        return self.settings.get("api_base")

    def describe(self) -> str:
        where = f" at {self.api_base}" if self.api_base else ""
        return _secrets.redact(f"{self.model}{where}")

    def __repr__(self) -> str:
        return repr(self.describe())


def split_model(spec: str | Mapping[str, Any], role: str) -> tuple[str, dict[str, Any]]:
    """(model, settings) of a model given as a LiteLLM string or a settings dict; base_url is read as api_base."""
    if isinstance(spec, str):
        if not spec.strip():
            raise ValueError(f"{role} is an empty string; give a LiteLLM model such as 'openai/gpt-4o-mini'")
        return spec.strip(), {}
    settings = dict(spec)
    model = settings.pop("model", None)
    if not isinstance(model, str) or not model.strip():
        raise ValueError(
            f"{role} as a dict needs a 'model' string, e.g. {{'model': 'openai/gpt-4o-mini', "
            f"'api_base': ..., 'api_key': ...}}; got keys {sorted(map(str, spec))}"
        )
    return model.strip(), _with_api_base(settings)


def is_lm(spec: Any) -> bool:
    """Whether `spec` is a dspy.LM, or anything shaped like one (a `model` string and a `kwargs` mapping)."""
    return isinstance(getattr(spec, "model", None), str) and isinstance(getattr(spec, "kwargs", None), Mapping)


def _endpoint(spec: Any, role: str) -> _Endpoint | None:
    """Normalise a model given as a LiteLLM string, a settings dict or a dspy.LM; None stays None."""
    if spec is None:
        return None
    if isinstance(spec, _Endpoint):
        return _Endpoint(spec.model, spec.settings, role)
    if isinstance(spec, (str, Mapping)):
        model, settings = split_model(spec, role)
        return _Endpoint(model, _clean_settings(settings), role)
    if is_lm(spec):
        if not isinstance(getattr(spec, "_engine_spec", "auto"), str):
            raise TypeError(
                f"{role} is a dspy.LM with a custom engine, which LiteLLM cannot call; give the model as a "
                "LiteLLM string or a dict {'model': ..., 'api_base': ..., 'api_key': ...} instead"
            )
        return _Endpoint(spec.model, _clean_settings(dict(spec.kwargs)), role)
    raise TypeError(
        f"{role} must be a LiteLLM model string ('openai/gpt-4o-mini'), a dict {{'model': ..., 'api_base': ..., "
        f"'api_key': ...}} or a dspy.LM; got {type(spec).__name__}"
    )


def _with_api_base(settings: dict[str, Any]) -> dict[str, Any]:
    """`settings` with LiteLLM's base_url alias renamed api_base (an api_base given as well wins)."""
    if "base_url" in settings:
        settings.setdefault("api_base", settings.pop("base_url"))
    return settings


def _clean_settings(settings: dict[str, Any]) -> dict[str, Any]:
    settings = _with_api_base(settings)
    cleaned = {key: value for key, value in settings.items() if value is not None and key not in _NOT_SENT}
    _secrets.register(cleaned.get("api_key"))
    return cleaned


class _MemoryCache:
    """A bounded LRU of answer texts, keyed by request digest."""

    def __init__(self, size: int = MEMORY_CACHE_SIZE):
        self._size = size
        self._items: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> str | None:
        with self._lock:
            text = self._items.get(key)
            if text is not None:
                self._items.move_to_end(key)
            return text

    def put(self, key: str, text: str) -> None:
        with self._lock:
            self._items[key] = text
            self._items.move_to_end(key)
            while len(self._items) > self._size:
                self._items.popitem(last=False)


class _DiskCache:
    """Answer texts in a sqlite file in `directory`, shared by processes. Keys are digests; no API key is stored."""

    def __init__(self, directory: str | os.PathLike[str]):
        folder = Path(directory).expanduser()
        if folder.exists() and not folder.is_dir():
            raise ValueError(f"cache={str(directory)!r} is a file; give a directory for the judge's disk cache")
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / DISK_CACHE_FILE
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, timeout=30.0, check_same_thread=False, isolation_level=None)
        with self._lock:
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS answers (key TEXT PRIMARY KEY, model TEXT, text TEXT NOT NULL, at REAL)"
            )

    def get(self, key: str) -> str | None:
        try:
            with self._lock:
                row = self._db.execute("SELECT text FROM answers WHERE key = ?", (key,)).fetchone()
        except sqlite3.Error as exc:
            self._warn(exc)
            return None
        return row[0] if row else None

    def put(self, key: str, text: str, model: str) -> None:
        """Store an answer; a disk problem is logged and skipped, never losing the answer already paid for."""
        try:
            with self._lock:
                self._db.execute(
                    "INSERT OR REPLACE INTO answers (key, model, text, at) VALUES (?, ?, ?, ?)",
                    (key, model, text, time.time()),
                )
        except sqlite3.Error as exc:
            self._warn(exc)

    def _warn(self, exc: sqlite3.Error) -> None:
        logger.warning("skynet-dspy judge disk cache %s: %s (going on without it for this call)", self.path, exc)


class Models:
    """Where a metric's llm() calls go: `metric_lm`, else `reflection_lm`, through LiteLLM.

    Each model is a LiteLLM model string, a dict {"model", "api_base", "api_key", sampling
    settings...} or a dspy.LM. `cache` is True (in memory, this object's lifetime), a directory
    path (a sqlite file there, shared across runs) or False. Retries cover 408, 429, 5xx and
    connection errors with exponential backoff; 401/403 fail at once.
    """

    def __init__(
        self,
        metric_lm: Any = None,
        reflection_lm: Any = None,
        cache: Any = True,
        *,
        timeout: float = DEFAULT_REQUEST_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        retry_base_delay: float = DEFAULT_RETRY_BASE_DELAY,
    ):
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries must be a whole number >= 0, got {max_retries!r}")
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if not isinstance(retry_base_delay, (int, float)) or isinstance(retry_base_delay, bool) or retry_base_delay < 0:
            raise ValueError(f"retry_base_delay must be a number of seconds >= 0, got {retry_base_delay!r}")
        _secrets.refresh()
        self.metric_lm = metric_lm
        self.reflection_lm = reflection_lm
        self.timeout = float(timeout)
        self.max_retries = max_retries
        self.retry_base_delay = float(retry_base_delay)
        self.cache = cache
        self._memory: _MemoryCache | None = None
        self._disk: _DiskCache | None = None
        if cache is True:
            self._memory = _MemoryCache()
        elif isinstance(cache, (str, os.PathLike)):
            self._memory = _MemoryCache()
            self._disk = _DiskCache(cache)
        elif cache is not False and cache is not None:
            raise TypeError(f"cache must be True (memory), False, or a directory path for a disk cache; got {cache!r}")
        self._lock = threading.Lock()
        self._inflight: dict[str, threading.Event] = {}
        self._calls = self._hits = self._errors = self._prompt_tokens = self._completion_tokens = 0
        self._cost = 0.0
        self._cost_known = True
        self._seconds = 0.0

    # -- configuration --------------------------------------------------------------------

    @property
    def metric_lm(self) -> _Endpoint | None:
        """The model llm() calls first (normalised; its repr shows the model and base URL, never the key)."""
        return self._metric

    @metric_lm.setter
    def metric_lm(self, spec: Any) -> None:
        self._metric = _endpoint(spec, "metric_lm")
        if self._metric is not None:
            _import_litellm()

    @property
    def reflection_lm(self) -> _Endpoint | None:
        """The model llm() calls when no metric model is set."""
        return self._reflection

    @reflection_lm.setter
    def reflection_lm(self, spec: Any) -> None:
        self._reflection = _endpoint(spec, "reflection_lm")
        if self._reflection is not None:
            _import_litellm()

    def _route(self) -> _Endpoint:
        endpoint = self._metric or self._reflection
        if endpoint is None and _default is not self:
            endpoint = _default._metric or _default._reflection
        if endpoint is None:
            raise ModelNotConfigured(
                "skynet.llm() has no model to call: neither a metric model nor a reflection model is set. "
                "Set one with skynet_dspy.load_metric(..., metric_lm='openai/gpt-4o-mini') (or reflection_lm=...), "
                "or skynet_dspy.gepa(metric, reflection_lm=...); outside a metric run, "
                "skynet_dspy.configure_llm(metric_lm=...). A model is a LiteLLM model string, a dict "
                "{'model': ..., 'api_base': ..., 'api_key': ...} or a dspy.LM."
            )
        return endpoint

    # -- the call -------------------------------------------------------------------------

    def complete(self, instructions: str, input: str | None = None, **overrides: Any) -> str:
        """Send `instructions` (system message) and `input` (user message) to the routed model; return its text.

        Without `input`, `instructions` is the only (user) message. `overrides` are LiteLLM
        settings for this call (temperature, max_tokens, ...). Identical requests are answered
        from the cache.
        """
        if not isinstance(instructions, str):
            raise TypeError(f"llm() instructions must be a str, got {type(instructions).__name__}")
        if input is not None and not isinstance(input, str):
            raise TypeError(
                f"llm() input must be a str or None, got {type(input).__name__}; format it first, e.g. json.dumps(...)"
            )
        refused = sorted(_REFUSED_OVERRIDES & overrides.keys())
        if refused:
            raise TypeError(f"llm() does not take {', '.join(refused)}: it sends one request and returns its text")
        endpoint = self._route()
        if input is None:
            messages = [{"role": "user", "content": instructions}]
        else:
            messages = [{"role": "system", "content": instructions}, {"role": "user", "content": input}]
        settings = {**endpoint.settings, **_clean_settings(dict(overrides))}
        model = settings.pop("model", endpoint.model)
        request = {"model": model, "messages": messages, **settings}
        if self._memory is None:
            return self._send(endpoint, request)
        key = _cache_key(request)
        while True:
            text, leader = self._lookup_or_lead(key)
            if text is not None:
                with self._lock:
                    self._hits += 1
                return text
            if leader is None:
                continue
            try:
                text = self._send(endpoint, request)
                if text:  # an empty answer is not kept: the next identical call asks again
                    self._memory.put(key, text)
                    if self._disk is not None:
                        self._disk.put(key, text, str(model))
                return text
            finally:
                with self._lock:
                    del self._inflight[key]
                leader.set()

    def _lookup_or_lead(self, key: str) -> tuple[str | None, threading.Event | None]:
        """(cached text, None), or (None, event) when this thread is to send the request, or (None, None) after
        waiting for another thread sending the same request (look again: it may have failed)."""
        assert self._memory is not None
        text = self._memory.get(key)
        if text is None and self._disk is not None:
            text = self._disk.get(key)
            if text is not None:
                self._memory.put(key, text)
        if text is not None:
            return text, None
        with self._lock:
            text = self._memory.get(key)
            if text is not None:
                return text, None
            running = self._inflight.get(key)
            if running is None:
                event = self._inflight[key] = threading.Event()
                return None, event
        running.wait()
        return None, None

    def _send(self, endpoint: _Endpoint, request: dict[str, Any]) -> str:
        """Call LiteLLM with bounded retries; count usage; return the answer text."""
        litellm = _import_litellm()
        request = {**request, "num_retries": 0, "max_retries": 0}
        request.setdefault("timeout", self.timeout)
        started = time.perf_counter()
        attempts = self.max_retries + 1
        try:
            for attempt in range(1, attempts + 1):
                with self._lock:
                    self._calls += 1
                try:
                    with _measure.not_measured():
                        response = litellm.completion(**request)
                    self._account(response)
                    text = _text_of(response)
                    if not text.strip():
                        raise _EmptyCompletion(
                            f"the model returned an empty completion (finish_reason={_finish_reason(response)})"
                        )
                    return text
                except Exception as exc:
                    with self._lock:
                        self._errors += 1
                    _sleep(self._retry_delay(endpoint, str(request["model"]), exc, attempt, attempts))
        finally:
            with self._lock:
                self._seconds += time.perf_counter() - started
        raise AssertionError("unreachable")  # pragma: no cover - the last attempt returns or raises

    def _retry_delay(self, endpoint: _Endpoint, model: str, exc: Exception, attempt: int, attempts: int) -> float:
        """The wait before retrying after `exc`; raises LLMCallError when retrying cannot help or no attempt is left."""
        status = _status_of(exc)
        where = f"the {endpoint.role} {_secrets.redact(model)}"
        if endpoint.api_base:
            where += f" at {_secrets.redact(str(endpoint.api_base))}"
        if status in _AUTH_STATUSES or _MISSING_KEY.search(str(exc)):
            status = status if status in _AUTH_STATUSES else None
            refused = f"refused the request with HTTP {status}" if status else "has no API key"
            raise LLMCallError(
                f"skynet.llm(): {where} {refused} ({_error_text(exc)}). Check the API key given for "
                f"{endpoint.role} (api_key=, or the provider's environment variable such as "
                "OPENAI_API_KEY) and its access to this model.",
                status,
            ) from None
        if not _retryable(exc, status):
            raise LLMCallError(f"skynet.llm(): {where} failed: {_error_text(exc)}", status) from None
        if attempt == attempts:
            raise LLMCallError(
                f"skynet.llm(): {where} failed {attempts} time(s) in a row; last error: {_error_text(exc)}", status
            ) from None
        delay = self._backoff(attempt, _retry_after(exc))
        logger.info(
            "skynet-dspy llm(): %s: %s; retrying in %.2f s (attempt %d of %d)",
            where, _error_text(exc), delay, attempt + 1, attempts,
        )
        return delay

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        """The wait before retry `attempt`: the server's Retry-After when it is short, else jittered doubling."""
        if retry_after is not None and 0 <= retry_after <= MAX_RETRY_DELAY:
            return retry_after
        delay = min(self.retry_base_delay * 2 ** (attempt - 1), MAX_RETRY_DELAY)
        return delay * random.uniform(0.5, 1.0)

    def _account(self, response: Any) -> None:
        prompt, completion, cost = _measure.response_usage(response)
        with self._lock:
            self._prompt_tokens += prompt
            self._completion_tokens += completion
            if cost is None:
                self._cost_known = False
            else:
                self._cost += cost

    # -- what the user reads ----------------------------------------------------------------

    @property
    def usage(self) -> JudgeUsage:
        """A snapshot of the judge's usage through this object so far."""
        with self._lock:
            return JudgeUsage(
                calls=self._calls,
                cache_hits=self._hits,
                prompt_tokens=self._prompt_tokens,
                completion_tokens=self._completion_tokens,
                cost_usd=self._cost if self._cost_known else None,
                seconds=self._seconds,
                errors=self._errors,
            )

    def __repr__(self) -> str:
        cache = str(self._disk.path.parent) if self._disk else "memory" if self._memory else "off"
        return _secrets.redact(
            f"Models(metric_lm={self._metric!r}, reflection_lm={self._reflection!r}, cache={cache!r})"
        )


def _import_litellm() -> Any:
    """Import LiteLLM (seconds, once per process) when a model is set, so the first llm() call does not pay
    for it inside the metric's timeout."""
    import litellm

    return litellm


def _cache_key(request: dict[str, Any]) -> str:
    keyed = {key: value for key, value in request.items() if key not in _NOT_KEYED}
    blob = json.dumps(keyed, sort_keys=True, default=repr, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


def _status_of(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and not isinstance(status, bool):
        return status
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) and not isinstance(status, bool) else None


class _EmptyCompletion(Exception):
    """The model answered, but with no text: retried like a transient error."""


def _finish_reason(response: Any) -> str:
    try:
        return str(response.choices[0].finish_reason)
    except (AttributeError, IndexError, TypeError):
        return "unknown"


def _retryable(exc: BaseException, status: int | None) -> bool:
    if isinstance(exc, _EmptyCompletion):
        return True
    if status is not None and (status in _RETRY_STATUSES or status >= 500):
        return True
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    try:
        import openai

        return isinstance(exc, (openai.APIConnectionError, openai.APITimeoutError))
    except ImportError:  # pragma: no cover - openai comes with litellm
        return False


def _headers_of(exc: BaseException) -> Any:
    headers = getattr(exc, "litellm_response_headers", None)
    if headers is None:
        try:
            headers = getattr(getattr(exc, "response", None), "headers", None)
        except Exception:
            headers = None
    return headers


def _retry_after(exc: BaseException) -> float | None:
    """Seconds the server asked to wait (Retry-After / retry-after-ms), or None."""
    headers = _headers_of(exc)
    if headers is None:
        return None
    try:
        millis = headers.get("retry-after-ms") or headers.get("Retry-After-Ms")
        if millis is not None:
            return float(millis) / 1000.0
        value = headers.get("retry-after") or headers.get("Retry-After")
    except Exception:
        return None
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        pass
    try:
        when = email.utils.parsedate_to_datetime(str(value))
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _error_text(exc: BaseException) -> str:
    message = " ".join(str(exc).split())
    if len(message) > 500:
        message = message[:497] + "..."
    if type(exc).__name__ not in message:
        message = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return _secrets.redact(message)


def _text_of(response: Any) -> str:
    try:
        content = response.choices[0].message.content
    except (AttributeError, IndexError, TypeError):
        return ""
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content or ""


_default = Models()
_default_lock = threading.Lock()


def default_models() -> Models:
    """The routing llm() uses outside a metric call run by skynet-dspy (set by configure_llm)."""
    return _default


def configure_llm(metric_lm: Any = None, reflection_lm: Any = None, cache: Any = True, **options: Any) -> Models:
    """Set the models skynet.llm() uses outside a metric run (e.g. trying a metric in a notebook).

    Metrics loaded without metric_lm / reflection_lm fall back to these too. Calling it with no
    model clears them. Returns the new process-default Models (read `.usage` on it).
    """
    global _default
    models = Models(metric_lm=metric_lm, reflection_lm=reflection_lm, cache=cache, **options)
    with _default_lock:
        _default = models
    return models

