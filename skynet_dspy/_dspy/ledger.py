"""Where finished program runs are filed, so the metric call that scores a prediction finds the run that made it.

A run is filed under the object its program returned (held weakly when it can be), and as the last run of its
thread/task, where the metric call that follows the program (dspy.Evaluate) finds it first.
"""

from __future__ import annotations

import threading
import weakref
from contextvars import ContextVar
from typing import Any

from .._core.lru import LRU
from .._core.types import Observation

# The run that last finished in this thread/task, with the objects it returned: the metric call
# that follows the program (dspy.Evaluate) finds it here first.
_last: ContextVar[tuple[tuple[Any, ...], Observation] | None] = ContextVar("skynet_last_run", default=None)


class _Ledger:
    """Finished runs by the object their program returned, matched by identity, never by id alone.

    Objects that take weak references (dspy.Prediction) are held weakly, so entries die with their
    predictions; others (tuples, strings) are held strongly, the most recent few only.
    """

    def __init__(self, strong_limit: int = 1024):
        self._lock = threading.Lock()
        self._weak: dict[int, tuple[weakref.ref[Any], Observation]] = {}
        self._strong: LRU[int, tuple[Any, Observation]] = LRU(strong_limit)
        self._sweep_at = 512

    def put(self, obj: Any, observation: Observation) -> None:
        key = id(obj)
        try:
            ref = weakref.ref(obj)
        except TypeError:
            self._strong.put(key, (obj, observation))
            return
        with self._lock:
            self._weak[key] = (ref, observation)
            if len(self._weak) >= self._sweep_at:
                self._weak = {k: entry for k, entry in self._weak.items() if entry[0]() is not None}
                self._sweep_at = max(512, 2 * len(self._weak))

    def get(self, obj: Any) -> Observation | None:
        key = id(obj)
        with self._lock:
            weak = self._weak.get(key)
        if weak is not None and weak[0]() is obj:
            return weak[1]
        strong = self._strong.get(key)
        if strong is not None and strong[0] is obj:
            return strong[1]
        return None


_ledger = _Ledger()


def file(outputs: Any, observation: Observation) -> None:
    """File a finished run under what its program returned."""
    # GEPA's trace capture makes forward return (prediction, trace): the metric gets the prediction.
    # The ledger keeps only the prediction, not the tuple (nor the trace it holds).
    if isinstance(outputs, tuple) and outputs:
        keys: tuple[Any, ...] = (outputs, outputs[0])
        filed = outputs[0]
    else:
        keys, filed = (outputs,), outputs
    if filed is not None:
        _ledger.put(filed, observation)
    _last.set((keys, observation))


NOT_FOUND = (
    "no measured program run returned this prediction: it was made outside a dspy.Module call and outside "
    "dspy.Evaluate (a hand-built prediction, or a program called some other way); call the program as a "
    "dspy.Module or through dspy.Evaluate"
)


def observation_for(prediction: Any) -> tuple[Observation | None, str | None]:
    """The measured run that produced `prediction`, or (None, why it was not measured)."""
    if prediction is None:
        return None, "the program returned no prediction"
    last = _last.get()
    if last is not None and any(key is prediction for key in last[0]):
        return last[1], None
    found = _ledger.get(prediction)
    if found is not None:
        return found, None
    return None, NOT_FOUND
