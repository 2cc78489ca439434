"""Whether and when to retry a failed judge request: one function per decision.

LiteLLM's own retries (num_retries) retry any openai.APIError, a refused key included, with no wait;
the judge turns them off and asks these instead.
"""

from __future__ import annotations

import email.utils
import errno
import math
import random
import re
import socket
import time
from typing import Any

MAX_RETRY_DELAY = 30.0  # no backoff or pause is longer; a larger Retry-After waits this long

_RETRY_STATUSES = frozenset({408, 409, 429})
_AUTH_STATUSES = frozenset({401, 403})
# LiteLLM reports a missing key as a 500 before sending anything; retrying cannot help.
_MISSING_KEY = re.compile(r"missing credentials|api_key client option must be set|no api key", re.IGNORECASE)


class EmptyCompletion(Exception):
    """The model answered, but with no text: retried like a transient error."""


def status_of(exc: BaseException) -> int | None:
    """The HTTP status of a failed request, when the error carries one."""
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and not isinstance(status, bool):
        return status
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) and not isinstance(status, bool) else None


def is_refused(exc: BaseException) -> bool:
    """A refused (401/403) or missing key: fail at once, retrying cannot help."""
    return status_of(exc) in _AUTH_STATUSES or bool(_MISSING_KEY.search(str(exc)))


def is_retryable(exc: BaseException) -> bool:
    """A transient failure: 408/409/429, a 5xx, a dropped connection, a timeout, an empty answer."""
    if isinstance(exc, EmptyCompletion):
        return True
    status = status_of(exc)
    if status is not None and (status in _RETRY_STATUSES or status >= 500):
        return True
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    try:
        import openai
    except ImportError:  # pragma: no cover - openai comes with litellm
        return False
    return isinstance(exc, (openai.APIConnectionError, openai.APITimeoutError))


_UNREACHABLE = re.compile(
    r"connection refused|name or service not known|nodename nor servname|temporary failure in name resolution|"
    r"no address associated|getaddrinfo failed|failed to resolve|network is unreachable|no route to host",
    re.IGNORECASE,
)
_UNREACHABLE_ERRNOS = frozenset({errno.ECONNREFUSED, errno.ENETUNREACH, errno.EHOSTUNREACH})


def is_unreachable(exc: BaseException) -> bool:
    """A connection that could not be made (refused, a name that does not resolve, no route): not a timeout, not a
    dropped connection, not an HTTP status. Read from the exception's chain (LiteLLM keeps httpx's ConnectError and
    the OSError under it). Never retried: it opens the endpoint's circuit breaker at once."""
    seen: BaseException | None = exc
    for _ in range(10):  # a bounded walk: a chain may loop
        if seen is None:
            return False
        if isinstance(seen, (ConnectionRefusedError, socket.gaierror)):
            return True
        if isinstance(seen, OSError) and seen.errno in _UNREACHABLE_ERRNOS:
            return True
        if type(seen).__name__ == "ConnectError" and _UNREACHABLE.search(str(seen)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")


def _duration(value: str) -> float | None:
    """Seconds in a rate-limit reset header: "1.5", "20ms", "6m0s", "1h2m3.5s"."""
    text = value.strip()
    try:
        return float(text)
    except ValueError:
        pass
    parts = _DURATION.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text.replace(" ", ""):
        return None
    scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    return sum(float(number) * scale[unit] for number, unit in parts)


def _ratelimit_reset(headers: dict[str, str]) -> float | None:
    """When an exhausted limit resets (x-ratelimit-reset-requests / -tokens, whose x-ratelimit-remaining-* is 0);
    the sooner of the resets when none says it is exhausted; None without such headers."""
    resets = {name[len("x-ratelimit-reset-"):]: _duration(value) for name, value in headers.items()
              if name.startswith("x-ratelimit-reset-")}
    known = {what: seconds for what, seconds in resets.items() if seconds is not None}
    if not known:
        return None
    exhausted = [seconds for what, seconds in known.items() if headers.get(f"x-ratelimit-remaining-{what}") == "0"]
    return max(exhausted) if exhausted else min(known.values())


def retry_after(exc: BaseException) -> float | None:
    """Seconds the server asked to wait (Retry-After in seconds or as a date, retry-after-ms, or on a 429 the
    x-ratelimit-reset-* headers), between 0 and MAX_RETRY_DELAY; None when it asked nothing readable. Never raises:
    a garbled, huge, negative or far-future value is bounded or ignored."""
    try:
        asked = _asked(exc)
    except Exception:  # noqa: BLE001 - a header of any shape (a date in year 99999999999: OverflowError)
        return None
    if asked is None or not math.isfinite(asked):
        return None
    return min(max(asked, 0.0), MAX_RETRY_DELAY)


def _asked(exc: BaseException) -> float | None:
    headers = _headers_of(exc)
    if headers is None:
        return None
    millis = headers.get("retry-after-ms") or headers.get("Retry-After-Ms")
    if millis is not None:
        return float(millis) / 1000.0
    value = headers.get("retry-after") or headers.get("Retry-After")
    if value is None:
        return _ratelimit_reset({str(k).lower(): str(v) for k, v in headers.items()}) if status_of(exc) == 429 else None
    try:
        return float(value)
    except (TypeError, ValueError):
        return email.utils.parsedate_to_datetime(str(value)).timestamp() - time.time()


def backoff(attempt: int, base_delay: float, server_asked: float | None) -> float:
    """The wait before retry `attempt`: what the server asked (already bounded), else jittered doubling."""
    if server_asked is not None:
        return server_asked
    delay = min(base_delay * 2.0 ** (attempt - 1), MAX_RETRY_DELAY)
    return float(delay * random.uniform(0.5, 1.0))


def _headers_of(exc: BaseException) -> Any:
    headers = getattr(exc, "litellm_response_headers", None)
    if headers is None:
        try:
            headers = getattr(getattr(exc, "response", None), "headers", None)
        except Exception:
            headers = None
    return headers
