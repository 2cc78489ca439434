"""The package's logger, "skynet_dspy": every record is redacted, and its control characters shown as escapes,
before any handler sees it."""

from __future__ import annotations

import contextlib
import logging
import traceback

from . import safe_text, secrets

LOGGER_NAME = "skynet_dspy"


class RedactingFilter(logging.Filter):
    """Formats a record's message once, redacted and terminal-safe, and keeps it without its args."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a record whose args do not fit its format: leave it to the handler's own error
            return True
        record.msg, record.args = safe_text.for_terminal(secrets.redact(message)), None
        if record.exc_info and not record.exc_text:
            with contextlib.suppress(Exception):
                record.exc_text = safe_text.for_terminal(
                    secrets.redact("".join(traceback.format_exception(*record.exc_info)).rstrip("\n")))
        if record.stack_info:
            record.stack_info = secrets.redact(record.stack_info)
        return True


def get_logger() -> logging.Logger:
    """The "skynet_dspy" logger, with the redacting filter installed (once)."""
    found = logging.getLogger(LOGGER_NAME)
    if not any(isinstance(existing, RedactingFilter) for existing in found.filters):
        found.addFilter(RedactingFilter())
    return found


logger = get_logger()
