"""The judge behind llm() (docs/contract.md#llm): where a metric's llm() calls go, through LiteLLM, with retries
(retry.py), a cache (cache.py), limits (limits.py) and usage counts. A request belongs to its metric call: once the
call ends (context.CallScope) or the judge is closed, it is never sent or retried."""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any, Unpack

from .._core import context, secrets
from .._core.errors import NO_JUDGE_MODEL
from .._core.logs import logger
from .._core.options import JudgeCache, JudgeOptions, ModelSpec, check_names
from .._core.types import JudgeUsage
from .._core.values import (
    COMPLETION_TOKENS,
    PROMPT_TOKENS,
    check_llm_arguments,
    clip_words,
    content_text,
    seconds,
    token_count,
    whole_number,
)
from ..errors import LLMCallError, ModelNotConfigured, SpendCapReached
from . import limits, retry
from .cache import AnswerCache, make_cache, request_key
from .endpoints import Endpoint, endpoint
from .litellm_private import no_banner, response_cost
from .spend import SpendCap

DEFAULT_REQUEST_TIMEOUT = 60.0  # seconds per HTTP request to the judge model
DEFAULT_MAX_RETRIES = 4  # retries after the first attempt, on 408 / 429 / 5xx / connection errors
DEFAULT_RETRY_BASE_DELAY = 1.0  # seconds; doubled on every retry
CAPPED_MAX_TOKENS = 4096  # under a cap, the max_tokens sent when the metric set none (or the model's own, if lower)
_sleep = limits.wait  # the backoff before a retry (tests replace it to record it)


def response_usage(response: Any) -> tuple[int, int, float | None]:
    """(prompt tokens, completion tokens, USD cost or None when unpriced) of one LiteLLM response."""
    usage = getattr(response, "usage", None)
    return token_count(usage, PROMPT_TOKENS), token_count(usage, COMPLETION_TOKENS), response_cost(response)


class Judge:
    """Where a metric's llm() calls go: `metric_lm`, else `reflection_lm`, else configure_llm()'s, via LiteLLM.

    Returned by configure_llm() and `metric.models`. Retries cover 408, 429, 5xx and connection errors with
    exponential backoff; a refused (401/403) or missing key fails at once.

    Args:
        metric_lm: The model llm() calls: a LiteLLM model string, a dict of LiteLLM settings or a dspy.LM.
        reflection_lm: The model llm() calls when no metric_lm is given.
        cache: True (in memory, this object's lifetime), a folder path (on disk, shared across runs and
            processes), a redis:// URL (shared across machines) or False.
        cache_size: The most bytes a disk cache keeps (None: 1 GiB).
        timeout: Seconds one request may take.
        max_retries: Retries of a request that failed with 408, 429, 5xx or a connection error.
        retry_base_delay: Seconds before the first retry (doubling after each).
        max_cost_usd: Caps the measured dollars sent to the model (SpendCapReached once reached).
        max_concurrency: At most N requests in flight at once (None: no limit).
        rpm: At most R requests started a minute, spread evenly (None: no limit).
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
        max_concurrency: int | None = None,
        rpm: int | None = None,
    ):
        self._in_flight = limits.InFlight(limits.checked_limit("judge_max_concurrency", max_concurrency))
        self._per_minute = limits.PerMinute(limits.checked_limit("judge_rpm", rpm))
        self._open = context.CallScope()  # the requests in progress, ended by close()
        self.max_retries = whole_number("max_retries", max_retries)
        self.timeout = seconds("timeout", timeout)
        self.retry_base_delay = float(seconds("retry_base_delay", retry_base_delay) if retry_base_delay else 0)
        self.metric_lm = metric_lm
        self.reflection_lm = reflection_lm
        self.cache: AnswerCache | None = make_cache(cache, cache_size)
        # max_judge_cost_usd=: once the measured spend reaches it, requests are refused (cache hits still answer)
        self.spend_cap = SpendCap("max_judge_cost_usd", max_cost_usd, "the judge") if max_cost_usd is not None else None
        self._lock = threading.Lock()
        self._usage = JudgeUsage()  # its seconds: wall-clock time with at least one of the _active requests running
        self._active, self._busy_since = 0, 0.0

    @property
    def metric_lm(self) -> Endpoint | None:
        """The model llm() calls first (its repr shows the model and base URL, never the key)."""
        return self._metric

    @metric_lm.setter
    def metric_lm(self, spec: Any) -> None:
        self._metric = endpoint(spec, "metric model")
        if self._metric is not None:
            _import_litellm()  # seconds, once per process: paid when a model is set, not in a metric's first call

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
        return self._route() is not None

    def _route(self) -> Endpoint | None:
        return self._metric or self._reflection or (_default._metric or _default._reflection if _default else None)

    def __call__(self, instructions: str, input: str | None, settings: dict[str, Any]) -> str:
        """llm()'s handler: the text for (instructions, input, settings)."""
        return self.complete(instructions, input, **settings)

    def complete(self, instructions: str, input: str | None = None, **overrides: Any) -> str:
        """Send `instructions` (system message) and `input` (user message) to the routed model; return its text.

        Without `input`, `instructions` is the only (user) message. `overrides` are LiteLLM settings
        for this call. Identical requests are answered from the cache, and sent once when made at once.
        """
        check_llm_arguments(instructions, input, overrides)
        cancelled = threading.Event()
        scopes = (context.current_scope() or context.CallScope(), self._open)
        for scope in scopes:
            scope.watch(cancelled)
        try:
            return self._complete(instructions, input, overrides, cancelled)
        except limits.Cancelled:
            raise LLMCallError("skynet.llm(): the request was not sent: its metric call had ended (scored, timed out "
                               "or stopped) or the metric was closed") from None
        finally:
            for scope in scopes:
                scope.unwatch(cancelled)

    def close(self) -> None:
        """Cancel the requests in progress: none of them is sent or retried from now on (later requests are)."""
        closing, self._open = self._open, context.CallScope()
        closing.end()

    def _complete(
        self, instructions: str, input: str | None, overrides: dict[str, Any], cancelled: threading.Event
    ) -> str:
        target = self._route()
        if target is None:
            raise ModelNotConfigured(NO_JUDGE_MODEL)
        messages = [{"role": "user", "content": instructions}] if input is None else [
            {"role": "system", "content": instructions}, {"role": "user", "content": input}]
        settings = {key: value for key, value in overrides.items() if value is not None}
        request = {**target.litellm_kwargs(), "messages": messages, **settings}
        if self.cache is None or context.wants_fresh_answers():  # the check's repeats: ask the model again
            return self._send(target, request, cancelled)
        key = request_key(request)
        text = self.cache.lead_or_wait(key, self.timeout, cancelled)  # None: this thread sends it
        if text is not None:
            with self._lock:
                self._usage += JudgeUsage(cache_hits=1)
            return text
        try:
            text = self._send(target, request, cancelled)
            self.cache.put(key, text, request)  # (_send never returns an empty answer: it retries it)
            return text
        finally:
            self.cache.release(key)

    def _send(self, target: Endpoint, request: dict[str, Any], cancelled: threading.Event) -> str:
        """Call LiteLLM with bounded retries, within the limits; count usage; return the answer text."""
        litellm = _import_litellm()
        request = {"timeout": self.timeout, **request, "num_retries": 0, "max_retries": 0}
        if self.spend_cap is not None and not (request.get("max_tokens") or request.get("max_completion_tokens")):
            known = (_litellm("get_model_info", model=request["model"]) or {}).get("max_output_tokens")
            # so its reservation is its largest cost: CAPPED_MAX_TOKENS, or the model's own limit if lower
            request["max_tokens"] = min(CAPPED_MAX_TOKENS, known) if isinstance(known, int) and known > 0 else (
                CAPPED_MAX_TOKENS)
        state = limits.endpoint_state(target.model, target.api_base)
        with self._busy():
            try:
                for attempt in itertools.count(1):
                    try:
                        return self._attempt(litellm, target, request, state, cancelled, attempt)
                    except (limits.Cancelled, SpendCapReached, LLMCallError):
                        raise
                    except Exception as exc:  # noqa: BLE001 - _retry_delay decides: retry, or an LLMCallError
                        _sleep(self._retry_delay(target, exc, attempt, state), cancelled)
            except LLMCallError:
                with self._lock:
                    self._usage += JudgeUsage(failed=1)
                raise
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    @contextlib.contextmanager
    def _busy(self) -> Iterator[None]:
        """Count the wall-clock time during which at least one request is in progress (usage.seconds)."""
        with self._lock:
            self._busy_since = self._busy_since if self._active else time.perf_counter()
            self._active += 1
        try:
            yield
        finally:
            with self._lock:
                self._active -= 1
                if not self._active:
                    self._usage += JudgeUsage(seconds=time.perf_counter() - self._busy_since)

    def _attempt(self, litellm: Any, target: Endpoint, request: dict[str, Any], state: limits.EndpointState,
                 cancelled: threading.Event, attempt: int) -> str:
        """One request: wait out the endpoint's pause (or fail on its breaker) and a turn, reserve, send, settle."""
        while True:
            breaker = state.before_send(cancelled)
            if breaker is not None:
                raise LLMCallError(f"skynet.llm(): the {target.role} {target.describe()} cannot be reached: {breaker}",
                                   unreachable=True)
            self._per_minute.acquire(cancelled)
            self._in_flight.acquire(cancelled)
            if not state.paused():
                break
            self._in_flight.release()  # a 429 paused the endpoint while this request waited for its turn
        reserved = response = None
        try:
            reserved = self._reserve(request, cancelled)
            if cancelled.is_set():
                raise limits.Cancelled
            with self._lock:
                self._usage += JudgeUsage(calls=1, retries=int(attempt > 1))
            with context.judging(), no_banner(litellm):
                response = litellm.completion(**request)
        finally:
            self._in_flight.release()
            text = self._settle(reserved, response, request)
        state.answered()
        if not text.strip():
            raise retry.EmptyCompletion("the model returned an empty completion (finish_reason="
                                        f"{_choice(response, 'finish_reason', 'unknown')})")
        return text

    def _reserve(self, request: dict[str, Any], cancelled: threading.Event) -> float:
        """Under a cap, reserve the request's largest cost (prompt and max_tokens), or SpendCapReached; else 0."""
        if self.spend_cap is None:
            return 0.0
        completion = request.get("max_tokens") or request.get("max_completion_tokens")
        if not isinstance(completion, int) or isinstance(completion, bool) or completion < 1:
            completion = CAPPED_MAX_TOKENS
        prompt = _litellm("token_counter", model=request["model"], messages=request["messages"])
        estimate = _price(request["model"], prompt, completion)
        return self.spend_cap.reserve(estimate, f"no price known for model {request['model']}", cancelled)

    def _settle(self, reserved: float | None, response: Any, request: dict[str, Any]) -> str:
        """Count a request's usage (a failed one costs nothing), give back its reservation; return the answer text."""
        text, model = content_text(_choice(response, "message", None)), request["model"]
        prompt, completion, cost = response_usage(response) if response is not None else (0, 0, 0.0)
        if response is not None and prompt == completion == 0:  # no usage in the reply: count, never price it $0
            counted = (_litellm("token_counter", model=model, messages=request["messages"]),
                       _litellm("token_counter", model=model, text=text))
            prompt, completion = counted[0] or 0, counted[1] or 0
            cost = None if None in counted else _price(model, prompt, completion)
        if self.spend_cap is not None and reserved is not None:
            self.spend_cap.charge(cost, f"no price known for model {model}", reserved)
        with self._lock:
            self._usage += JudgeUsage(prompt_tokens=prompt, completion_tokens=completion, cost_usd=cost)
        return text

    def _retry_delay(self, target: Endpoint, exc: Exception, attempt: int, state: limits.EndpointState) -> float:
        """The wait before retrying after `exc`, or LLMCallError when retrying cannot help or no attempt is left."""
        status, where, error = retry.status_of(exc), f"the {target.role} {target.describe()}", _error_text(exc)
        if retry.is_unreachable(exc):
            state.unreachable(error)
            raise LLMCallError(f"skynet.llm(): {where} cannot be reached: {error}", status, unreachable=True) from None
        if retry.is_refused(exc):
            refused = f"refused the request with HTTP {status}" if status in (401, 403) else "has no API key"
            raise LLMCallError(f"skynet.llm(): {where} {refused} ({error}). Check the API key given for the "
                               f"{target.role} (api_key=, or the provider's environment variable such as "
                               "OPENAI_API_KEY) and its access to this model.", status, refused=True) from None
        if not retry.is_retryable(exc):
            raise LLMCallError(f"skynet.llm(): {where} failed: {error}", status) from None
        delay = retry.backoff(attempt, self.retry_base_delay, retry.retry_after(exc))
        if status == 429:
            state.rate_limited(delay)
        if attempt > self.max_retries:
            raise LLMCallError(f"skynet.llm(): {where} failed {attempt} time(s) in a row; last error: {error}", status,
                               unreachable=True) from None
        logger.info("skynet-dspy llm(): %s: %s; retrying in %.2f s (attempt %d of %d)", where, error, delay,
                    attempt + 1, self.max_retries + 1)
        return delay

    @property
    def usage(self) -> JudgeUsage:
        """A snapshot of the judge's usage through this object so far."""
        with self._lock:
            running = time.perf_counter() - self._busy_since if self._active else 0.0
            return replace(self._usage, seconds=self._usage.seconds + running)

    def __repr__(self) -> str:
        cache = self.cache.where if self.cache is not None else "off"
        return secrets.redact(f"Judge(metric_lm={self._metric!r}, reflection_lm={self._reflection!r}, "
                              f"cache={cache!r})")


def _import_litellm() -> Any:
    import litellm

    return litellm


def _litellm(name: str, **kwargs: Any) -> Any:
    """litellm.<name>(**kwargs), or None when LiteLLM raises (a model it does not know or price, odd content)."""
    try:
        return getattr(_import_litellm(), name)(**kwargs)
    except Exception:  # noqa: BLE001 - unknown, never 0
        return None


def _price(model: str, prompt: int | None, completion: int) -> float | None:
    """USD for `prompt` + `completion` tokens of `model` at LiteLLM's prices, or None when it has none."""
    costs = _litellm("cost_per_token", model=model, prompt_tokens=prompt, completion_tokens=completion)
    return float(sum(costs)) if costs is not None and prompt is not None else None


def _error_text(exc: BaseException) -> str:
    message = clip_words(secrets.redact(" ".join(str(exc).split())), 500)  # redacted before it is cut
    if type(exc).__name__ not in message:
        message = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return secrets.redact(message)


def _choice(response: Any, field: str, missing: Any) -> Any:
    """`field` of a response's first choice (message.content for "message"), or `missing`."""
    try:
        value = getattr(response.choices[0], field)
        return value.content if field == "message" else str(value)
    except (AttributeError, IndexError, TypeError):
        return missing


_default: Judge | None = None


def configure_llm(
    metric_lm: ModelSpec = None, reflection_lm: ModelSpec = None, cache: JudgeCache = True,
    **options: Unpack[JudgeOptions],
) -> Judge:
    """Set the models skynet.llm() uses outside a metric run (e.g. trying a metric in a notebook).

    Metrics loaded without metric_lm / reflection_lm fall back to these too. Calling it with no model clears them.

    Args:
        metric_lm: The model llm() calls (a LiteLLM model string, a dict of LiteLLM settings or a dspy.LM).
        reflection_lm: The model llm() calls when no metric_lm is given.
        cache: True (in memory), a folder (on disk), a redis:// URL, or False.
        **options: `JudgeOptions` (timeout, max_retries, max_concurrency, rpm, ...).

    Returns:
        The new process-default Judge (read `.usage` on it).
    """
    global _default
    check_names("configure_llm()", options, JudgeOptions)
    judge = Judge(metric_lm=metric_lm, reflection_lm=reflection_lm, cache=cache, **options)
    _default = judge if judge.metric_lm or judge.reflection_lm else None
    context.set_default_llm(_default)
    return judge
