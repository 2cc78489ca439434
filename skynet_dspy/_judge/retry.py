"""Whether and when to retry a failed judge request. LiteLLM's own retries (turned off) retry any openai.APIError, a
refused key included, with no wait."""

from __future__ import annotations

import email.utils
import errno
import math
import random
import re
import socket
import time

MAX_RETRY_DELAY = 30.0  # no backoff or pause is longer; a larger Retry-After waits this long

# LiteLLM reports a missing key as a 500 before sending anything; retrying cannot help.
_MISSING_KEY = re.compile(r"missing credentials|api_key client option must be set|no api key", re.IGNORECASE)
_UNREACHABLE = re.compile(
    r"connection refused|name or service not known|nodename nor servname|temporary failure in name resolution|"
    r"no address associated|getaddrinfo failed|failed to resolve|network is unreachable|no route to host",
    re.IGNORECASE,
)
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_SCALE = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


class EmptyCompletion(Exception):
    """The model answered, but with no text: retried like a transient error."""


def status_of(exc: BaseException) -> int | None:
    """The HTTP status of a failed request, when the error carries one."""
    for status in (getattr(exc, "status_code", None), getattr(getattr(exc, "response", None), "status_code", None)):
        if isinstance(status, int) and not isinstance(status, bool):
            return status
    return None


def is_refused(exc: BaseException) -> bool:
    """A refused (401/403) or missing key: fail at once, retrying cannot help."""
    return status_of(exc) in (401, 403) or bool(_MISSING_KEY.search(str(exc)))


def is_retryable(exc: BaseException) -> bool:
    """A transient failure: 408/409/429, a 5xx, a dropped connection, a timeout, an empty answer."""
    import openai  # with LiteLLM: imported when a request fails, not with the package

    status = status_of(exc)
    return (status in (408, 409, 429) or (status or 0) >= 500 or isinstance(exc, (
        EmptyCompletion, ConnectionError, TimeoutError, openai.APIConnectionError, openai.APITimeoutError)))


def is_unreachable(exc: BaseException) -> bool:
    """A connection that could not be made (refused, an unknown name, no route), read from the exception's chain
    (LiteLLM keeps httpx's ConnectError and the OSError under it)."""
    seen: BaseException | None = exc
    for _ in range(10):  # a bounded walk: a chain may loop
        if isinstance(seen, (ConnectionRefusedError, socket.gaierror)) or (isinstance(seen, OSError) and seen.errno in (
                errno.ECONNREFUSED, errno.ENETUNREACH, errno.EHOSTUNREACH)) or (
                type(seen).__name__ == "ConnectError" and _UNREACHABLE.search(str(seen))):
            return True
        seen = seen and (seen.__cause__ or seen.__context__)
    return False


def _duration(value: str) -> float | None:
    """Seconds in a rate-limit reset header: "1.5", "20ms", "6m0s", "1h2m3.5s"."""
    with_units = _DURATION.findall(value)
    if "".join(number + unit for number, unit in with_units) == value.replace(" ", "") != "":
        return sum(float(number) * _SCALE[unit] for number, unit in with_units)
    try:
        return float(value)
    except ValueError:
        return None


def _asked(exc: BaseException) -> float | None:
    """Seconds the server asked to wait: retry-after-ms, Retry-After (seconds or a date), or on a 429 when the
    exhausted x-ratelimit-reset-* limit resets (else the soonest reset)."""
    headers = getattr(exc, "litellm_response_headers", None) or getattr(getattr(exc, "response", None), "headers", None)
    headers = {str(name).lower(): str(value) for name, value in (headers or {}).items()}
    if "retry-after-ms" in headers:
        return float(headers["retry-after-ms"]) / 1000.0
    if "retry-after" in headers:
        value = headers["retry-after"]
        seconds = _duration(value)
        return seconds if seconds is not None else email.utils.parsedate_to_datetime(value).timestamp() - time.time()
    if status_of(exc) != 429:
        return None
    resets = {name[18:]: _duration(value) for name, value in headers.items() if name.startswith("x-ratelimit-reset-")}
    known = {what: seconds for what, seconds in resets.items() if seconds is not None}
    exhausted = [seconds for what, seconds in known.items() if headers.get(f"x-ratelimit-remaining-{what}") == "0"]
    return max(exhausted) if exhausted else min(known.values(), default=None)


def retry_after(exc: BaseException) -> float | None:
    """What the server asked to wait, bounded to [0, MAX_RETRY_DELAY]; None when unreadable. Never raises."""
    try:
        asked = _asked(exc)
    except Exception:  # noqa: BLE001 - a header of any shape (a date in year 99999999999: OverflowError)
        return None
    return min(max(asked, 0.0), MAX_RETRY_DELAY) if asked is not None and math.isfinite(asked) else None


def backoff(attempt: int, base_delay: float, server_asked: float | None) -> float:
    """The wait before retry `attempt`: what the server asked (already bounded), else jittered doubling."""
    if server_asked is not None:
        return server_asked
    return float(min(base_delay * 2.0 ** (attempt - 1), MAX_RETRY_DELAY) * random.uniform(0.5, 1.0))
