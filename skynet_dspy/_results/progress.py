"""The progress bar of long runs: tqdm.auto's (a widget in Jupyter, a line on a terminal, nothing in a pipe or
for a quick run). A ticker redraws it, so its clock moves while one slow call runs; `close()` clears it.
"""

from __future__ import annotations

import shutil
import sys
import threading
from typing import Any, TextIO

from tqdm import tqdm as terminal_bar
from tqdm.auto import tqdm as auto_bar

from .._core.safe_text import for_terminal


class Progress:
    """Progress of `total` steps ("cases", "calls") on `stream` (stderr, or Jupyter's widget); thread-safe."""

    def __init__(self, label: str, total: int | None = None, *, unit: str = "cases", stream: TextIO | None = None,
                 delay: float = 1.0, interval: float = 0.25):
        bar = auto_bar if stream is None else terminal_bar  # a given stream: a line on it, never a widget
        notebook = sys.modules.get("tqdm.notebook")
        # a terminal whose size is unknown (0 x 0) gets the usual 80 x 24, not tqdm's "draw nothing"
        size = {} if notebook and issubclass(bar, notebook.tqdm) else dict(
            zip(("ncols", "nrows"), shutil.get_terminal_size(), strict=True))
        self.bar = bar(total=total, desc=for_terminal(label), unit=f" {unit}", file=stream, delay=delay,
                       disable=None, leave=False, **size)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        if not self.bar.disable:
            threading.Thread(target=self._tick, args=(delay, interval), name="skynet-dspy progress",
                             daemon=True).start()

    def update(self, done: int, total: int | None = None) -> None:
        """Set the steps done (and the total, when it changed); the progress(done, planned) callback."""
        with self._lock:
            if total is not None and total != self.bar.total:
                self.bar.total = total
            self.bar.update(done - self.bar.n)

    __call__ = update

    def _tick(self, delay: float, interval: float) -> None:
        if not self._stop.wait(delay):
            while not self._stop.wait(interval):
                with self._lock:
                    self.bar.refresh()

    def close(self) -> None:
        """Stop redrawing and clear the bar."""
        self._stop.set()
        self.bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
