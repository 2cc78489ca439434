"""Whether and when to retry a failed judge request: one function per decision.

LiteLLM's own retries (num_retries) retry any openai.APIError, a refused key included, with no wait;
the judge turns them off and asks these instead.
"""

from __future__ import annotations

import email.utils
import random
import re
import time
from typing import Any

MAX_RETRY_DELAY = 30.0  # no backoff sleep is longer; a larger Retry-After is not honoured

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


def retry_after(exc: BaseException) -> float | None:
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


def backoff(attempt: int, base_delay: float, server_asked: float | None) -> float:
    """The wait before retry `attempt`: the server's Retry-After when it is short, else jittered doubling."""
    if server_asked is not None and 0 <= server_asked <= MAX_RETRY_DELAY:
        return server_asked
    delay = min(base_delay * 2 ** (attempt - 1), MAX_RETRY_DELAY)
    return delay * random.uniform(0.5, 1.0)


def _headers_of(exc: BaseException) -> Any:
    headers = getattr(exc, "litellm_response_headers", None)
    if headers is None:
        try:
            headers = getattr(getattr(exc, "response", None), "headers", None)
        except Exception:
            headers = None
    return headers
