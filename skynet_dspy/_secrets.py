"""Keeping API keys out of every error, log line, feedback text and report."""

from __future__ import annotations

import os
import re

_KEY_ENV = re.compile(r"(API_KEY|_TOKEN|_SECRET)$")
_MIN_LENGTH = 8  # shorter values would mask ordinary words
_registered: set[str] = set()
_known: tuple[str, ...] = ()


def register(secret: str | None) -> None:
    """Remember a key so redact() masks it wherever it would appear."""
    if secret and len(secret) >= _MIN_LENGTH and secret not in _registered:
        _registered.add(secret)
        refresh()


def refresh() -> None:
    """Re-read the keys set in the environment (*_API_KEY, *_TOKEN, *_SECRET)."""
    global _known
    from_env = {value for name, value in os.environ.items() if _KEY_ENV.search(name) and len(value) >= _MIN_LENGTH}
    _known = tuple(sorted(from_env | _registered, key=len, reverse=True))


def redact(text: str) -> str:
    """`text` with every known key replaced by '***'."""
    for secret in _known:
        if secret in text:
            text = text.replace(secret, "***")
    return text


refresh()
