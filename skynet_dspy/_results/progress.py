"""A one-line progress bar for long command-line runs (a check with a judge, scoring thousands of cases).

Shown only on a terminal and only once the run has taken `delay` seconds, so quick runs and piped output
stay clean. A ticker thread redraws it, so the elapsed time moves even while one slow call is running.
`close()` clears the line, so whatever is printed next starts on a clean one.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, TextIO

from .._core.safe_text import for_terminal

_WIDTH = 24  # characters of the bar itself


class Progress:
    """Progress of `total` steps ("cases", "calls") on `stream`; thread-safe; a context manager."""

    def __init__(
        self,
        label: str,
        total: int | None = None,
        *,
        unit: str = "cases",
        stream: TextIO | None = None,
        delay: float = 1.0,
        interval: float = 0.25,
        enabled: bool | None = None,
    ):
        self.label = label
        self.total = total
        self.unit = unit
        self.stream = stream if stream is not None else sys.stderr
        self.delay = delay
        self.interval = interval
        self.enabled = _is_terminal(self.stream) if enabled is None else enabled
        self.done = 0
        self._started = time.monotonic()
        self._lock = threading.Lock()
        self._drawn = 0  # length of the line on screen, 0 when none is
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        if self.enabled:
            self._ticker = threading.Thread(target=self._tick, name="skynet-dspy progress", daemon=True)
            self._ticker.start()

    def advance(self, steps: int = 1) -> None:
        """Count `steps` more steps done."""
        with self._lock:
            self.done += steps

    def update(self, done: int, total: int | None = None) -> None:
        """Set the steps done (and the total, when it changed); the check's progress(done, planned) callback."""
        with self._lock:
            self.done = done
            if total is not None:
                self.total = total

    __call__ = update

    def line(self) -> str:
        """The progress line as it is drawn now."""
        with self._lock:
            done, total = self.done, self.total
        elapsed = time.monotonic() - self._started
        rate = done / elapsed if elapsed > 0 else 0.0
        if total:
            share = min(1.0, done / total)
            filled = int(share * _WIDTH)
            bar = "#" * filled + ("." * (_WIDTH - filled))
            eta = f", about {_duration((total - done) / rate)} left" if rate > 0 and done < total else ""
            return (f"{self.label}: [{bar}] {done}/{total} {self.unit} {share:4.0%} "
                    f"({_duration(elapsed)}, {rate:.1f}/s{eta})")
        return f"{self.label}: {done} {self.unit} ({_duration(elapsed)}, {rate:.1f}/s)"

    def draw(self) -> None:
        """Redraw the line now (when enabled)."""
        if not self.enabled:
            return
        text = for_terminal(self.line())  # a caller's label is shown as text, never as control sequences
        with self._lock:
            pad = " " * max(0, self._drawn - len(text))
            self._drawn = len(text)
        try:
            self.stream.write(f"\r{text}{pad}")
            self.stream.flush()
        except (OSError, ValueError):  # a closed stream: stop drawing
            self.enabled = False

    def _tick(self) -> None:
        while not self._stop.wait(self.interval):
            if time.monotonic() - self._started >= self.delay:
                self.draw()

    def close(self) -> None:
        """Stop redrawing and clear the line."""
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=1.0)
        with self._lock:
            drawn, self._drawn = self._drawn, 0
        if drawn and self.enabled:
            try:
                self.stream.write("\r" + " " * drawn + "\r")
                self.stream.flush()
            except (OSError, ValueError):
                pass

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, rest = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {rest:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"
