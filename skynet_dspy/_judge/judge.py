"""The judge behind llm(): the metric model, falling back to the reflection model, through LiteLLM.

The rules: docs/contract.md#llm.

A Judge holds where a metric's llm() calls go, retries transient failures (retry.py), pays for an
identical request once (cache.py, with concurrent identical requests sent once) and counts what the
judge used. LiteLLM is imported when a model is set, so `import skynet_dspy` stays fast.
"""

from __future__ import annotations

import inspect
import threading
import time
from typing import Any

from .._core import context, secrets
from .._core.errors import NO_JUDGE_MODEL
from .._core.logs import logger
from .._core.types import JudgeUsage
from .._core.values import (
    COMPLETION_TOKENS,
    PROMPT_TOKENS,
    check_llm_arguments,
    clip_words,
    content_text,
    seconds,
    token_count,
    unknown_option,
    whole_number,
)
from ..errors import LLMCallError, ModelNotConfigured
from . import retry
from .cache import AnswerCache, make_cache
from .endpoints import Endpoint, endpoint
from .entries import request_key
from .litellm_private import response_cost
from .spend import SpendCap

DEFAULT_REQUEST_TIMEOUT = 60.0  # seconds per HTTP request to the judge model
DEFAULT_MAX_RETRIES = 4  # retries after the first attempt, on 408 / 429 / 5xx / connection errors
DEFAULT_RETRY_BASE_DELAY = 1.0  # seconds; doubled on every retry

_sleep = time.sleep  # tests replace this to record the backoff without waiting

NOT_CONFIGURED = NO_JUDGE_MODEL  # what llm() says with no model to call


def response_usage(response: Any) -> tuple[int, int, float | None]:
    """(prompt tokens, completion tokens, USD cost or None when unpriced) of one LiteLLM response."""
    usage = getattr(response, "usage", None)
    return token_count(usage, PROMPT_TOKENS), token_count(usage, COMPLETION_TOKENS), response_cost(response)


class Judge:
    """Where a metric's llm() calls go: `metric_lm`, else `reflection_lm`, else configure_llm()'s, via LiteLLM.

    `cache` is True (in memory, this object's lifetime), a folder path (on disk, shared across runs
    and processes), a redis:// URL (shared across machines) or False. Retries cover 408, 429, 5xx and
    connection errors with exponential backoff; a refused (401/403) or missing key fails at once.
    `max_cost_usd` caps the measured dollars sent to the model (SpendCapReached once reached).
    """

    def __init__(
        self,
        metric_lm: Any = None,
        reflection_lm: Any = None,
        cache: Any = True,
        *,
        cache_size: int | None = None,
        timeout: float = DEFAULT_REQUEST_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        retry_base_delay: float = DEFAULT_RETRY_BASE_DELAY,
        max_cost_usd: float | None = None,
    ):
        self.max_retries = whole_number("max_retries", max_retries)
        self.timeout = seconds("timeout", timeout)
        if retry_base_delay != 0:
            seconds("retry_base_delay", retry_base_delay)
        self.retry_base_delay = float(retry_base_delay)
        self.metric_lm = metric_lm
        self.reflection_lm = reflection_lm
        self.cache: AnswerCache | None = make_cache(cache, cache_size)
        # max_judge_cost_usd=: once the measured spend reaches it, requests are refused (cache hits still answer)
        self.spend_cap = SpendCap("max_judge_cost_usd", max_cost_usd, "the judge") if max_cost_usd is not None else None
        self._lock = threading.Lock()
        self._inflight: dict[str, threading.Event] = {}
        self._calls = self._hits = self._errors = self._prompt_tokens = self._completion_tokens = 0
        self._cost = 0.0
        self._cost_known = True
        self._seconds = 0.0

    # -- configuration --------------------------------------------------------------------

    @property
    def metric_lm(self) -> Endpoint | None:
        """The model llm() calls first (its repr shows the model and base URL, never the key)."""
        return self._metric

    @metric_lm.setter
    def metric_lm(self, spec: Any) -> None:
        self._metric = endpoint(spec, "metric model")
        if self._metric is not None:
            _import_litellm()

    @property
    def reflection_lm(self) -> Endpoint | None:
        """The model llm() calls when no metric model is set."""
        return self._reflection

    @reflection_lm.setter
    def reflection_lm(self, spec: Any) -> None:
        self._reflection = endpoint(spec, "reflection model")
        if self._reflection is not None:
            _import_litellm()

    @property
    def configured(self) -> bool:
        """Whether llm() has a model to call (its own, or the one configure_llm() set)."""
        return self._route(raise_missing=False) is not None

    def _route(self, raise_missing: bool = True) -> Endpoint | None:
        found = self._metric or self._reflection
        if found is None:
            default = _default
            if default is not None and default is not self:
                found = default._metric or default._reflection
        if found is None and raise_missing:
            raise ModelNotConfigured(NOT_CONFIGURED)
        return found

    # -- the call -------------------------------------------------------------------------

    def __call__(self, instructions: str, input: str | None, settings: dict[str, Any]) -> str:
        """llm()'s handler: the text for (instructions, input, settings)."""
        return self.complete(instructions, input, **settings)

    def complete(self, instructions: str, input: str | None = None, **overrides: Any) -> str:
        """Send `instructions` (system message) and `input` (user message) to the routed model; return its text.

        Without `input`, `instructions` is the only (user) message. `overrides` are LiteLLM settings
        for this call. Identical requests are answered from the cache, and sent once when made at once.
        """
        check_llm_arguments(instructions, input, overrides)
        target = self._route()
        assert target is not None
        if input is None:
            messages = [{"role": "user", "content": instructions}]
        else:
            messages = [{"role": "system", "content": instructions}, {"role": "user", "content": input}]
        settings = {key: value for key, value in overrides.items() if value is not None}
        request = {**target.litellm_kwargs(), "messages": messages, **settings}
        if self.cache is None:
            return self._send(target, request)
        key = request_key(request)
        while True:
            text, leader = self._lookup_or_lead(key)
            if text is not None:
                with self._lock:
                    self._hits += 1
                return text
            if leader is None:
                continue  # another thread sent the same request; it may have failed, so look again
            shared = getattr(self.cache.store, "lead_or_wait", None)  # a store shared by processes (Redis)
            try:
                text = shared(key, self.timeout) if shared is not None else None
                if text is not None:  # another process fetched it meanwhile
                    self.cache.memory.put(key, text)
                    with self._lock:
                        self._hits += 1
                    return text
                text = self._send(target, request)
                self.cache.put(key, text, request)  # (_send never returns an empty answer: it retries it)
                return text
            finally:
                if shared is not None:
                    self.cache.store.release(key)  # type: ignore[union-attr]
                with self._lock:
                    del self._inflight[key]
                leader.set()

    def _lookup_or_lead(self, key: str) -> tuple[str | None, threading.Event | None]:
        """(cached text, None); (None, event) when this thread is to send the request; or (None, None) after
        waiting for another thread that sent the same request."""
        assert self.cache is not None
        text = self.cache.get(key)
        if text is not None:
            return text, None
        with self._lock:
            text = self.cache.memory.get(key)
            if text is not None:
                return text, None
            running = self._inflight.get(key)
            if running is None:
                event = self._inflight[key] = threading.Event()
                return None, event
        running.wait()
        return None, None

    def _send(self, target: Endpoint, request: dict[str, Any]) -> str:
        """Call LiteLLM with bounded retries; count usage; return the answer text."""
        litellm = _import_litellm()
        request = {**request, "num_retries": 0, "max_retries": 0}
        request.setdefault("timeout", self.timeout)
        started = time.perf_counter()
        attempts = self.max_retries + 1
        try:
            for attempt in range(1, attempts + 1):
                if self.spend_cap is not None:
                    self.spend_cap.check()  # refused at once, before anything is sent, once the cap is reached
                with self._lock:
                    self._calls += 1
                try:
                    with context.judging():
                        response = litellm.completion(**request)
                    self._account(response)
                    text = _answer_text(response)
                    if not text.strip():
                        raise retry.EmptyCompletion(
                            f"the model returned an empty completion (finish_reason={_finish_reason(response)})"
                        )
                    return text
                except Exception as exc:
                    with self._lock:
                        self._errors += 1
                    _sleep(self._retry_delay(target, exc, attempt, attempts))
        finally:
            with self._lock:
                self._seconds += time.perf_counter() - started
        raise AssertionError("unreachable")  # pragma: no cover - the last attempt returns or raises

    def _retry_delay(self, target: Endpoint, exc: Exception, attempt: int, attempts: int) -> float:
        """The wait before retrying after `exc`; raises LLMCallError when retrying cannot help or no attempt is left."""
        status = retry.status_of(exc)
        where = f"the {target.role} {target.describe()}"
        if retry.is_refused(exc):
            refused = f"refused the request with HTTP {status}" if status in (401, 403) else "has no API key"
            raise LLMCallError(
                f"skynet.llm(): {where} {refused} ({_error_text(exc)}). Check the API key given for the "
                f"{target.role} (api_key=, or the provider's environment variable such as OPENAI_API_KEY) and its "
                "access to this model.",
                status,
                refused=True,
            ) from None
        if not retry.is_retryable(exc):
            raise LLMCallError(f"skynet.llm(): {where} failed: {_error_text(exc)}", status) from None
        if attempt == attempts:
            raise LLMCallError(
                f"skynet.llm(): {where} failed {attempts} time(s) in a row; last error: {_error_text(exc)}", status
            ) from None
        delay = retry.backoff(attempt, self.retry_base_delay, retry.retry_after(exc))
        logger.info(
            "skynet-dspy llm(): %s: %s; retrying in %.2f s (attempt %d of %d)",
            where, _error_text(exc), delay, attempt + 1, attempts,
        )
        return delay

    def _account(self, response: Any) -> None:
        prompt, completion, cost = response_usage(response)
        if self.spend_cap is not None:
            self.spend_cap.charge(cost, f"no price known for model {getattr(response, 'model', None) or 'unknown'}")
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
        cache = self.cache.describe() if self.cache is not None else "off"
        return secrets.redact(
            f"Judge(metric_lm={self._metric!r}, reflection_lm={self._reflection!r}, cache={cache!r})"
        )


def _import_litellm() -> Any:
    """Import LiteLLM (seconds, once per process) when a model is set, so the first llm() call does not pay
    for it inside the metric's timeout."""
    import litellm

    return litellm


def _finish_reason(response: Any) -> str:
    try:
        return str(response.choices[0].finish_reason)
    except (AttributeError, IndexError, TypeError):
        return "unknown"


def _error_text(exc: BaseException) -> str:
    message = secrets.redact(" ".join(str(exc).split()))  # redacted before it is cut, so no half key is left
    message = clip_words(message, 500)
    if type(exc).__name__ not in message:
        message = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return secrets.redact(message)


def _answer_text(response: Any) -> str:
    try:
        content = response.choices[0].message.content
    except (AttributeError, IndexError, TypeError):
        return ""
    return content_text(content)


_default: Judge | None = None
_default_lock = threading.Lock()



def configure_llm(metric_lm: Any = None, reflection_lm: Any = None, cache: Any = True, **options: Any) -> Judge:
    """Set the models skynet.llm() uses outside a metric run (e.g. trying a metric in a notebook).

    Metrics loaded without metric_lm / reflection_lm fall back to these too. Calling it with no
    model clears them. Returns the new process-default Judge (read `.usage` on it).
    """
    global _default
    known = list(inspect.signature(Judge).parameters)
    for name in options:
        if name not in known:
            raise unknown_option("configure_llm()", name, known)
    judge = Judge(metric_lm=metric_lm, reflection_lm=reflection_lm, cache=cache, **options)
    with _default_lock:
        _default = judge if judge.metric_lm or judge.reflection_lm else None
    context.set_default_llm(judge if _default is not None else None)
    return judge
