"""The package's logger, "skynet_dspy", whose every record is redacted before any handler sees it.

A filter on the logger masks credentials in the formatted message (and in an exception or stack text,
when a record has one), so no log line the package emits shows a key, whoever configured the handlers.
"""

from __future__ import annotations

import logging
import traceback

from . import secrets

LOGGER_NAME = "skynet_dspy"


class RedactingFilter(logging.Filter):
    """Masks credentials in a record: its message is formatted once, redacted, and kept without its args."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a record whose args do not fit its format: leave it to the handler's own error
            return True
        record.msg, record.args = secrets.redact(message), None
        if record.exc_info and not record.exc_text:
            try:
                record.exc_text = secrets.redact("".join(traceback.format_exception(*record.exc_info)).rstrip("\n"))
            except Exception:
                pass
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
