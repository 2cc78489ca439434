"""Where finished program runs are filed, so the metric call that scores a prediction finds the run that made it:
under the object the program returned, and as the last run of its thread/task (which dspy.Evaluate's metric call
that follows the program finds first)."""

from __future__ import annotations

import threading
import weakref
from contextvars import ContextVar
from typing import Any, Generic, TypeVar

from cachetools import LRUCache

from .._core.types import Observation

V = TypeVar("V")


class ById(Generic[V]):
    """Values by the object they describe, matched by identity and held weakly (an entry lives as long as its
    object, and nothing is written into it); put() raises TypeError for an object that takes no weak reference."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_id: dict[int, tuple[weakref.ref[Any], V]] = {}

    def put(self, target: Any, value: V) -> None:
        key = id(target)

        def forget(ref: weakref.ref[Any]) -> None:
            with self._lock:
                if self._by_id.get(key, (None,))[0] is ref:
                    del self._by_id[key]

        ref = weakref.ref(target, forget)
        with self._lock:
            self._by_id[key] = (ref, value)

    def get(self, target: Any) -> V | None:
        entry = self._by_id.get(id(target))
        return entry[1] if entry is not None and entry[0]() is target else None


_last: ContextVar[tuple[tuple[Any, ...], Observation] | None] = ContextVar("skynet_last_run", default=None)
_weak: ById[Observation] = ById()
_strong: LRUCache[int, tuple[Any, Observation]] = LRUCache(1024)  # tuples, strings: the most recent only
_strong_lock = threading.Lock()


def file(outputs: Any, observation: Observation) -> None:
    """File a finished run under what its program returned."""
    # GEPA's trace capture makes forward return (prediction, trace): the metric gets the prediction, which alone
    # is filed (not the trace the tuple holds)
    filed = outputs[0] if isinstance(outputs, tuple) and outputs else outputs
    if filed is not None:
        try:
            _weak.put(filed, observation)
        except TypeError:
            with _strong_lock:
                _strong[id(filed)] = (filed, observation)
    _last.set(((outputs, filed), observation))


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
    found = _weak.get(prediction)
    if found is None:
        with _strong_lock:
            strong = _strong.get(id(prediction))
        found = strong[1] if strong is not None and strong[0] is prediction else None
    return (found, None) if found is not None else (None, NOT_FOUND)
