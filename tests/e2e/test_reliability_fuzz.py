"""Fuzzed metric returns (issue 9): arbitrary values never crash the validator or the adapter.

Every value a `score` might return is either accepted per docs/contract.md#return-value or rejected with a message,
and the adapter always hands DSPy a finite score and a str feedback within the cap. Values are
generated with a verdict: GOOD (the contract says valid), BAD (it says invalid) or MAYBE (the
contract is silent, e.g. a Decimal score, or the value is hostile: its methods raise). MAYBE values
may go either way, but never crash.

Hostile objects raise from __eq__/__str__/__repr__/__bool__/__float__/__len__/... only while
`armed()` is on, so Hypothesis can still print a failing example after the test body.

The adapter is fuzzed twice: in this process (isolation="thread"), where the hostile objects and the
module-level `_box` the metric returns from live, and in worker processes (the default isolation), where
the value travels to the worker inside the input and the answer comes back as plain data.
"""

from __future__ import annotations

import functools
import math
import sys
import textwrap
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from types import MappingProxyType
from typing import Any

import cloudpickle
import dspy
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import skynet_dspy
from skynet_dspy import ContractViolation, Result, validate_return

GOOD, MAYBE, BAD = 0, 1, 2  # max() of parts gives the verdict of the whole
LIMITS = (100, 1_000, 20_000)
FAILURE_SCORE = -7.25

FUZZ = settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)

# -- hostile objects ---------------------------------------------------------------------------

_ARMED = threading.Event()


@contextmanager
def armed() -> Iterator[None]:
    """While on, every hostile object's dunder methods raise."""
    _ARMED.set()
    try:
        yield
    finally:
        _ARMED.clear()


def _boom(obj: object, method: str) -> None:
    if _ARMED.is_set():
        raise RuntimeError(f"{type(obj).__name__}.{method} raised on purpose")


class Evil:
    """An object whose every protocol method raises: eq, str, repr, bool, float, len, getattr..."""

    def __eq__(self, other):
        _boom(self, "__eq__")
        return self is other

    def __ne__(self, other):
        _boom(self, "__ne__")
        return self is not other

    __hash__ = object.__hash__

    def __str__(self):
        _boom(self, "__str__")
        return "Evil"

    def __repr__(self):
        _boom(self, "__repr__")
        return "Evil()"

    def __format__(self, spec):
        _boom(self, "__format__")
        return "Evil"

    def __bool__(self):
        _boom(self, "__bool__")
        return True

    def __float__(self):
        _boom(self, "__float__")
        return 0.5

    def __int__(self):
        _boom(self, "__int__")
        return 1

    def __index__(self):
        _boom(self, "__index__")
        return 1

    def __len__(self):
        _boom(self, "__len__")
        return 2

    def __iter__(self):
        _boom(self, "__iter__")
        return iter(())

    def __getattr__(self, name):
        _boom(self, f"__getattr__({name!r})")
        raise AttributeError(name)


def _trapped(base: type, names: tuple[str, ...]) -> dict[str, Any]:
    """Methods of `base` that raise while armed, and behave as `base`'s otherwise."""

    def make(name: str):
        original = getattr(base, name)

        def method(self, *args, **kwargs):
            _boom(self, name)
            return original(self, *args, **kwargs)

        method.__name__ = name
        return method

    return {name: make(name) for name in names if hasattr(base, name)}


_NUMBER_TRAPS = ("__float__", "__int__", "__index__", "__repr__", "__str__", "__format__", "__eq__", "__ne__",
                 "__lt__", "__le__", "__gt__", "__ge__", "__bool__", "__abs__", "__neg__", "__round__")
EvilFloat = type("EvilFloat", (float,), {**_trapped(float, _NUMBER_TRAPS), "__hash__": float.__hash__})
EvilInt = type("EvilInt", (int,), {**_trapped(int, _NUMBER_TRAPS), "__hash__": int.__hash__})
EvilStr = type("EvilStr", (str,), {
    **_trapped(str, ("__len__", "__eq__", "__ne__", "__contains__", "__getitem__", "__iter__", "__str__",
                     "__repr__", "__format__", "__add__", "__mod__", "__mul__", "replace", "encode", "strip",
                     "split", "splitlines", "startswith", "endswith", "lower", "upper", "join", "find")),
    "__hash__": str.__hash__,
})
EvilDict = type("EvilDict", (dict,), _trapped(dict, (
    "__contains__", "__getitem__", "get", "items", "keys", "values", "__iter__", "__len__", "__eq__",
    "__ne__", "__repr__", "copy", "pop", "setdefault", "__or__")))
EvilTuple = type("EvilTuple", (tuple,), {
    **_trapped(tuple, ("__len__", "__iter__", "__getitem__", "__repr__", "__eq__", "__ne__", "__contains__")),
    "__hash__": tuple.__hash__,
})
EvilList = type("EvilList", (list,), _trapped(list, (
    "__len__", "__iter__", "__getitem__", "__repr__", "__eq__", "__ne__", "__contains__", "copy")))


class Colliding:
    """A dict key hashing like `target` (e.g. "feedback") whose __eq__ raises: a lookup of `target` hits it."""

    def __init__(self, target: str):
        self.target = target

    def __hash__(self):
        return hash(self.target)

    def __eq__(self, other):
        _boom(self, "__eq__")
        return self is other

    def __repr__(self):
        _boom(self, "__repr__")
        return f"Colliding({self.target!r})"


class MyFloat(float):
    pass


class MyInt(int):
    pass


class MyStr(str):
    pass


class MyDict(dict):
    pass


class MyTuple(tuple):
    pass


class MyList(list):
    pass


# -- strategies: (value, verdict, expected) -----------------------------------------------------
# Each builder takes `hostile`: with False it makes only well-behaved values (so the docs/contract.md#return-value
# verdicts are checked on their own), with True it mixes in the hostile objects above.

_NP_INTS = (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)
_NAN_INF = st.sampled_from([math.nan, math.inf, -math.inf])


def _np_int(kind):
    info = np.iinfo(kind)
    return st.integers(int(info.min), int(info.max)).map(lambda v: (kind(v), GOOD, float(v)))


def _np_float(kind, width):
    floats = st.floats(width=width, allow_nan=False, allow_infinity=False)
    return floats.map(lambda v: (kind(v), GOOD, float(kind(v))))


def _huge_text():
    return st.tuples(st.characters(codec="utf-8"), st.integers(1_000, 300_000)).map(lambda t: t[0] * t[1])


GOOD_NUMBERS = st.one_of(
    st.integers(-(10**15), 10**15).map(lambda v: (v, GOOD, float(v))),
    st.integers(-(2**1000), 2**1000).map(lambda v: (v, GOOD, float(v))),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda v: (v, GOOD, v)),
    st.booleans().map(lambda v: (v, GOOD, float(v))),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda v: (MyFloat(v), GOOD, v)),
    st.integers(-100, 100).map(lambda v: (MyInt(v), GOOD, float(v))),
    st.booleans().map(lambda v: (np.bool_(v), GOOD, float(v))),
    *[_np_int(kind) for kind in _NP_INTS],
    _np_float(np.float16, 16),
    _np_float(np.float32, 32),
    _np_float(np.float64, 64),
    st.floats(-1e300, 1e300).map(lambda v: (np.longdouble(v), GOOD, float(np.longdouble(v)))),
)


@functools.cache
def tagged_numbers(hostile: bool):
    """(number-ish value, verdict as a score, its float when GOOD)."""
    # docs/contract.md#return-value lists int, float, bool and NumPy reals; these it does not decide.
    maybe = [
        st.fractions(max_denominator=10**6).map(lambda v: (v, MAYBE, float(v))),
        st.decimals(allow_nan=False, allow_infinity=False, places=6).map(lambda v: (v, MAYBE, float(v))),
        st.floats(allow_nan=False, allow_infinity=False).map(lambda v: (np.array(v), MAYBE, v)),
        st.integers(2**1024, 2**1100).map(lambda v: (v, MAYBE, None)),  # a real number, but no finite float
        st.integers(-100, 100).map(lambda v: (np.timedelta64(v, "s"), MAYBE, None)),  # NumPy calls it an integer
    ]
    bad = [
        _NAN_INF.map(lambda v: (v, BAD, None)),
        st.tuples(st.sampled_from([np.float16, np.float32, np.float64, np.longdouble]), _NAN_INF).map(
            lambda t: (t[0](t[1]), BAD, None)
        ),
        _NAN_INF.map(lambda v: (np.array(v), BAD, None)),
        _NAN_INF.map(lambda v: (MyFloat(v), BAD, None)),
        st.sampled_from(["NaN", "sNaN", "Infinity", "-Infinity"]).map(lambda v: (Decimal(v), BAD, None)),
        st.complex_numbers().map(lambda v: (v, BAD, None)),
        st.complex_numbers(allow_nan=False, allow_infinity=False).map(lambda v: (np.complex128(v), BAD, None)),
        st.sampled_from(["0.8", "1", "nan", "", "high"]).map(lambda v: (v, BAD, None)),
        st.text(max_size=20).map(lambda v: (v, BAD, None)),
        st.text(max_size=5).map(lambda v: (np.str_(v), BAD, None)),
        st.binary(max_size=10).map(lambda v: (v, BAD, None)),
        st.none().map(lambda v: (v, BAD, None)),
        st.lists(st.floats(0, 1), max_size=3).map(lambda v: (v, BAD, None)),
        st.lists(st.floats(0, 1), min_size=2, max_size=3).map(lambda v: (np.array(v), BAD, None)),
        st.just(0).map(lambda _: ({"score": 0.5}, BAD, None)),
        st.just(0).map(lambda _: (np.datetime64("2024-01-01"), BAD, None)),
        st.just(0).map(lambda _: ((x for x in [0.5]), BAD, None)),
        st.builds(object).map(lambda v: (v, BAD, None)),
    ]
    if hostile:
        maybe += [
            st.floats(-1e6, 1e6).map(lambda v: (EvilFloat(v), MAYBE, v)),
            st.integers(-100, 100).map(lambda v: (EvilInt(v), MAYBE, float(v))),
        ]
        bad.append(st.builds(Evil).map(lambda v: (v, BAD, None)))
    return st.one_of(GOOD_NUMBERS, GOOD_NUMBERS, *maybe, *bad)


@functools.cache
def tagged_feedback(hostile: bool):
    """(feedback value, verdict, the text when GOOD)."""
    options = [
        st.text(max_size=200).map(lambda v: (v, GOOD, v)),
        _huge_text().map(lambda v: (v, GOOD, v)),
        st.text(max_size=50).map(lambda v: (MyStr(v), GOOD, v)),
        st.text(max_size=50).map(lambda v: (np.str_(v), GOOD, v)),
        st.binary(max_size=20).map(lambda v: (v, BAD, None)),
        st.integers().map(lambda v: (v, BAD, None)),
        st.none().map(lambda v: (v, BAD, None)),
        st.lists(st.text(max_size=5), max_size=3).map(lambda v: (v, BAD, None)),
        st.just((ABSENT, BAD, None)),
    ]
    if hostile:
        options += [
            st.text(max_size=50).map(lambda v: (EvilStr(v), MAYBE, v)),
            _huge_text().map(lambda v: (EvilStr(v), MAYBE, v)),
            st.builds(Evil).map(lambda v: (v, BAD, None)),
        ]
    return st.one_of(*options)


_PLAIN_KEYS = st.one_of(
    st.text(max_size=12), st.integers(), st.none(), st.booleans(), st.floats(),
    st.tuples(st.integers(), st.text(max_size=3)), st.frozensets(st.integers(), max_size=3), st.binary(max_size=5),
)


@functools.cache
def anything(hostile: bool):
    """Arbitrary nested Python values: containers, numbers of every type, huge strings (hostile objects)."""
    leaves = [
        st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=30), st.binary(max_size=10),
        st.complex_numbers(), st.decimals(), st.fractions(), _huge_text(),
        tagged_numbers(hostile).map(lambda t: t[0]),
    ]
    if hostile:
        leaves += [st.builds(Evil), st.builds(EvilStr, st.text(max_size=5)), st.builds(EvilFloat, st.floats())]

    def containers(children):
        options = [
            st.lists(children, max_size=4),
            st.tuples(children, children),
            st.dictionaries(_PLAIN_KEYS, children, max_size=4),
            st.sets(_PLAIN_KEYS.filter(lambda k: k == k), max_size=3),
            st.lists(children, max_size=3).map(MyList),
            st.dictionaries(st.text(max_size=5), children, max_size=3).map(MyDict),
        ]
        if hostile:
            options += [
                st.dictionaries(st.builds(Evil), children, max_size=2),
                st.lists(children, max_size=3).map(EvilList),
                st.dictionaries(st.text(max_size=5), children, max_size=3).map(EvilDict),
            ]
        return st.one_of(*options)

    return st.recursive(st.one_of(*leaves), containers, max_leaves=12)


@functools.cache
def _name_keys(hostile: bool):
    options = [
        st.text(max_size=12).map(lambda v: (v, GOOD)),
        st.text(max_size=8).map(lambda v: (MyStr(v), GOOD)),
        st.integers().map(lambda v: (v, BAD)),
        st.none().map(lambda v: (v, BAD)),
        st.tuples(st.text(max_size=3)).map(lambda v: (v, BAD)),
    ]
    if hostile:
        options += [st.text(max_size=8).map(lambda v: (EvilStr(v), MAYBE)), st.builds(Evil).map(lambda v: (v, BAD))]
    return st.one_of(*options)


class _Absent:
    def __repr__(self):
        return "ABSENT"


ABSENT = _Absent()


@functools.cache
def named_scores(hostile: bool):
    return _named_scores(hostile)


@functools.cache
def side_information(hostile: bool):
    return _side_information(hostile)


@functools.cache
def returns(hostile: bool):
    return _returns(hostile)


@st.composite
def _named_scores(draw, hostile: bool) -> tuple[Any, int, dict | None]:
    """The "scores" entry: (value, verdict, expected dict of floats); value ABSENT when left out."""
    kind = draw(st.sampled_from(["absent", "absent", "dict", "dict", "none", "not_dict"]))
    if kind == "absent":
        return ABSENT, GOOD, None
    if kind == "none":
        return None, MAYBE, None
    if kind == "not_dict":
        value = draw(st.one_of(st.lists(st.floats(), max_size=2), st.text(max_size=5), st.floats(), st.builds(object)))
        return value, BAD, None
    entries = draw(st.lists(st.tuples(_name_keys(hostile), tagged_numbers(hostile)), max_size=4))
    scores: dict[Any, Any] = {}
    verdicts = [GOOD]
    expected: dict[str, float] = {}
    for (key, key_verdict), (number, number_verdict, as_float) in entries:
        if key in scores:
            continue
        scores[key] = number
        verdicts += [key_verdict, number_verdict]
        if isinstance(key, str) and as_float is not None:
            expected[str.__str__(key)] = as_float
    verdict = max(verdicts)
    if hostile and draw(st.integers(0, 9)) == 0:
        scores = EvilDict(scores)
        verdict = max(verdict, MAYBE)
    return scores, verdict, expected if verdict == GOOD else None


@st.composite
def _side_information(draw, hostile: bool) -> tuple[Any, int, dict | None]:
    """The second item: (value, verdict, expected {feedback, scores, extra}) for GOOD values."""
    feedback, fb_verdict, fb_expected = draw(tagged_feedback(hostile))
    scores, sc_verdict, sc_expected = draw(named_scores(hostile))
    extras = draw(st.lists(st.tuples(_PLAIN_KEYS, anything(hostile)), max_size=4))
    info: dict[Any, Any] = {}
    verdicts = [fb_verdict, sc_verdict]
    for key, value in extras:
        if isinstance(key, str) and key in ("feedback", "scores"):
            continue
        info[key] = value
    if hostile and draw(st.integers(0, 7)) == 0:
        info[Evil()] = draw(anything(hostile))  # a key that cannot even be compared
        verdicts.append(MAYBE)
    if hostile and draw(st.integers(0, 9)) == 0:
        info[Colliding(draw(st.sampled_from(["feedback", "scores"])))] = draw(anything(hostile))
        verdicts.append(MAYBE)
    if feedback is not ABSENT:
        info["feedback"] = feedback
    if scores is not ABSENT:
        info["scores"] = scores
    extra_keys = [key for key in info if not (isinstance(key, str) and key in ("feedback", "scores"))]
    expected = {"feedback": fb_expected, "scores": sc_expected, "extra": {id(k): info[k] for k in extra_keys}}

    wrappers = ["dict"] * 6 + ["mydict", "ordered", "proxy", "pairs", "str", "none"] + (["evildict"] if hostile else [])
    wrapper = draw(st.sampled_from(wrappers))
    if wrapper == "mydict":
        info = MyDict(info)
    elif wrapper == "ordered":
        info = OrderedDict(info)
    elif wrapper == "evildict":
        info, verdicts = EvilDict(info), [*verdicts, MAYBE]
    elif wrapper == "proxy":
        info, verdicts = MappingProxyType(info), [*verdicts, MAYBE]  # a mapping, not a dict
    elif wrapper == "pairs":
        info, verdicts = list(info.items()), [*verdicts, BAD]
    elif wrapper == "str":
        info, verdicts = "Close.", [*verdicts, BAD]
    elif wrapper == "none":
        info, verdicts = None, [*verdicts, BAD]
    verdict = max(verdicts)
    return info, verdict, expected if verdict == GOOD else None


@st.composite
def _returns(draw, hostile: bool) -> tuple[Any, int | None, dict | None]:
    """A metric's return value: (value, verdict or None when unknown, expected Result fields when GOOD)."""
    shape = draw(st.sampled_from(["pair"] * 8 + ["anything", "anything_pair"]))
    if shape == "anything":
        value = draw(anything(hostile))
        return value, (None if isinstance(value, (tuple, list)) else BAD), None
    if shape == "anything_pair":
        return (draw(anything(hostile)), draw(anything(hostile))), None, None
    score, score_verdict, as_float = draw(tagged_numbers(hostile))
    info, info_verdict, info_expected = draw(side_information(hostile))
    containers = ["tuple"] * 4 + ["list"] * 2 + ["mytuple", "mylist", "triple", "single", "gen", "dict"]
    container = draw(st.sampled_from(containers + (["eviltuple", "evillist"] if hostile else [])))
    items = (score, info)
    verdict = max(score_verdict, info_verdict)
    if container == "tuple":
        value = items
    elif container == "list":
        value = list(items)
    elif container == "mytuple":
        value = MyTuple(items)
    elif container == "mylist":
        value = MyList(items)
    elif container == "eviltuple":
        value, verdict = EvilTuple(items), max(verdict, MAYBE)
    elif container == "evillist":
        value, verdict = EvilList(items), max(verdict, MAYBE)
    elif container == "triple":
        value, verdict = (score, info, draw(anything(hostile))), BAD
    elif container == "single":
        value, verdict = (score,), BAD
    elif container == "gen":
        value, verdict = (item for item in items), BAD
    else:
        value, verdict = {"score": score, "side": info}, BAD
    expected = None
    if verdict == GOOD:
        expected = {**info_expected, "score": as_float}
    return value, verdict, expected


# -- checks -------------------------------------------------------------------------------------


def _usable_text(text: Any, limit: int) -> None:
    """`text` is a str that works as one (even while hostile objects are armed) and fits the cap."""
    assert isinstance(text, str), f"feedback is a {type(text).__name__}, not a str"
    assert len(text) <= limit, f"feedback of {len(text)} characters is over the cap of {limit}"
    # what DSPy and GEPA do with feedback text (compare, slice, format, search) must all work
    assert text == text[:] and f"{text}" == str(text)
    assert isinstance(repr(text), str) and text.find("\x00") >= -1


def _check_named(scores: Any) -> None:
    if scores is None:
        return
    assert isinstance(scores, dict)
    for name, number in scores.items():
        assert isinstance(name, str)
        _usable_text(name, 10**9)
        assert isinstance(number, float) and math.isfinite(number), f"named score {number!r}"


def _check_cut(feedback: str, given: str, limit: int) -> None:
    if len(given) <= limit:
        assert feedback == given
    else:
        assert len(feedback) <= limit
        assert feedback.startswith(given[: limit // 3]), "the cut feedback keeps the start of the text"
        assert "cut" in feedback[limit // 3:].lower() or "truncat" in feedback[limit // 3:].lower(), (
            "a cut feedback carries a note saying so"
        )


def _check_accepted(result: Result, expected: dict, limit: int, same_objects: bool = True) -> None:
    assert result.score == expected["score"]
    _check_cut(result.feedback, expected["feedback"], limit)
    if expected["scores"]:
        assert result.scores == expected["scores"]
    else:
        assert not result.scores
    if not same_objects:  # from a worker process: every extra key arrives, as plain data
        assert len(result.extra) == len(expected["extra"])
        return
    assert {id(key) for key in result.extra} == set(expected["extra"])
    for key, value in result.extra.items():
        assert value is expected["extra"][id(key)], "extra side information is kept as given"


def _validate(value: Any, limit: int) -> Result | ContractViolation:
    """validate_return's answer: a Result, or the ContractViolation it raised (anything else fails the test)."""
    try:
        return validate_return(value, feedback_limit=limit)
    except ContractViolation as exc:
        return exc


@pytest.mark.parametrize("hostile", [False, True], ids=["plain", "hostile"])
@given(data=st.data(), limit=st.sampled_from(LIMITS))
@FUZZ
def test_validate_return_accepts_or_rejects_every_value(hostile, data, limit):
    value, verdict, expected = data.draw(returns(hostile), label="return value, verdict, expected")
    with armed():
        outcome = _validate(value, limit)
        if isinstance(outcome, ContractViolation):
            message = str(outcome)
            assert isinstance(message, str) and message.strip(), "a rejection says why"
            assert verdict != GOOD, f"a valid return value was rejected: {message}"
        else:
            assert isinstance(outcome, Result)
            assert verdict != BAD, "an invalid return value was accepted"
            assert isinstance(outcome.score, float) and math.isfinite(outcome.score)
            assert isinstance(outcome.feedback, str) and len(outcome.feedback) <= limit
            _check_named(outcome.scores)
            if verdict == GOOD:
                _check_accepted(outcome, expected, limit)


# -- the adapter ------------------------------------------------------------------------------

_box: dict[str, Any] = {}


def _returns_the_box(input, output, expected=None):
    return _box["value"]


@pytest.fixture(scope="module")
def fuzz_metrics() -> dict[int, skynet_dspy.Metric]:
    """In this process: score returns what the test put in `_box` (hostile objects stay armed here)."""
    return {
        limit: skynet_dspy.load_metric(
            _returns_the_box, timeout=10, failure_score=FAILURE_SCORE, feedback_limit=limit, measure=False,
            isolation="thread",
        )
        for limit in LIMITS
    }


@pytest.fixture(scope="module")
def worker_metrics(tmp_path_factory) -> Iterator[dict[int, skynet_dspy.Metric]]:
    """In worker processes: score returns input["value"], which the test sends along with the input."""
    path = tmp_path_factory.mktemp("fuzz") / "returns_the_value.py"
    path.write_text(textwrap.dedent("""
        def score(input, output, expected=None):
            return input["value"]
    """), encoding="utf-8")
    # this module's classes (MyFloat, MyDict...) travel by value: a worker need not import this test module
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    metrics = {
        limit: skynet_dspy.load_metric(path, timeout=10, failure_score=FAILURE_SCORE, feedback_limit=limit)
        for limit in LIMITS
    }
    yield metrics
    for metric in metrics.values():
        metric.close()
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def _sendable(value: Any) -> bool:
    """Whether `value` can be sent to a worker process (a generator cannot)."""
    try:
        cloudpickle.dumps(value)
    except Exception:
        return False
    return True


def _check_not_sent(result: Result) -> None:
    assert result.failure == "exception" and result.score == FAILURE_SCORE
    assert "cannot be sent to the metric's worker process" in result.detail and "isolation='thread'" in result.detail


def _check_adapter_result(result: Any, limit: int) -> None:
    assert isinstance(result, Result)
    assert isinstance(result.score, float) and math.isfinite(result.score)
    _usable_text(result.feedback, limit)
    if result.failure is None:
        _check_named(result.scores)
    else:
        assert result.score == FAILURE_SCORE
        assert result.feedback.strip(), "a failure's feedback says what went wrong"


def _check_score_object(returned: Any, limit: int) -> tuple[float, str]:
    assert isinstance(returned, dspy.Prediction)
    number = float(returned)
    assert math.isfinite(number)
    assert returned.score == number
    _usable_text(returned.feedback, limit)
    if number == 0 or returned.result.failure is not None:
        assert not returned, "a zero score or a failed call is never a success (BootstrapFewShot)"
    if "objective_scores" in returned:
        _check_named(returned.objective_scores)
    return number, returned.feedback


def _example_and_prediction() -> tuple[dspy.Example, dspy.Prediction]:
    return dspy.Example(question="2+2?", answer="4").with_inputs("question"), dspy.Prediction(answer="4")


@pytest.mark.parametrize("hostile", [False, True], ids=["plain", "hostile"])
@given(data=st.data(), limit=st.sampled_from(LIMITS))
@FUZZ
def test_adapter_always_gives_a_finite_score_and_bounded_feedback(fuzz_metrics, hostile, data, limit):
    value, verdict, expected = data.draw(returns(hostile), label="return value, verdict, expected")
    metric = fuzz_metrics[limit]
    _box["value"] = value
    before = metric.stats
    with armed():
        result = metric.score({"question": "2+2?"}, "4", {"answer": "4"})
        _check_adapter_result(result, limit)
        gold, pred = _example_and_prediction()
        number, feedback = _check_score_object(metric(gold, pred), limit)
        gold, pred = _example_and_prediction()
        gepa_number, gepa_feedback = _check_score_object(metric(gold, pred, [], "predict", []), limit)
    after = metric.stats
    assert (number, feedback) == (result.score, result.feedback) == (gepa_number, gepa_feedback), (
        "the same return value gives the same score and feedback on every path"
    )
    assert after["calls"] - before["calls"] == 3
    failures = sum(after[kind] - before[kind] for kind in after if kind not in ("calls", "memo_hits"))
    if result.failure is None:
        assert verdict != BAD, "an invalid return value was accepted"
        assert failures == 0
        if verdict == GOOD:
            _check_accepted(result, expected, limit)
    else:
        assert verdict != GOOD, f"a valid return value was rejected: {result.feedback}"
        assert result.failure == "invalid", "a bad return value is reported as a broken contract"
        assert failures == 3 and after["invalid"] - before["invalid"] == 3


@given(data=st.data(), limit=st.sampled_from(LIMITS))
@FUZZ
def test_adapter_in_worker_processes_gives_a_finite_score_and_bounded_feedback(worker_metrics, data, limit):
    value, verdict, expected = data.draw(returns(False), label="return value, verdict, expected")
    metric = worker_metrics[limit]
    before = metric.stats
    result = metric.score({"question": "2+2?", "value": value}, "4", {"answer": "4"})
    _check_adapter_result(result, limit)
    gold = dspy.Example(question="2+2?", value=value, answer="4").with_inputs("question", "value")
    number, feedback = _check_score_object(metric(gold, dspy.Prediction(answer="4")), limit)
    gold = dspy.Example(question="2+2?", value=value, answer="4").with_inputs("question", "value")
    gepa_number, gepa_feedback = _check_score_object(metric(gold, dspy.Prediction(answer="4"), [], "predict", []),
                                                     limit)
    after = metric.stats
    assert (number, feedback) == (result.score, result.feedback) == (gepa_number, gepa_feedback), (
        "the same return value gives the same score and feedback on every path"
    )
    assert after["calls"] - before["calls"] == 3
    failures = sum(after[kind] - before[kind] for kind in after if kind not in ("calls", "memo_hits"))
    if not _sendable(value):
        _check_not_sent(result)
        assert failures == 3 and after["exception"] - before["exception"] == 3
    elif result.failure is None:
        assert verdict != BAD, "an invalid return value was accepted"
        assert failures == 0
        if verdict == GOOD:
            _check_accepted(result, expected, limit, same_objects=False)
    else:
        assert verdict != GOOD, f"a valid return value was rejected: {result.detail}"
        assert result.failure == "invalid", f"a bad return value is reported as a broken contract: {result.detail}"
        assert failures == 3 and after["invalid"] - before["invalid"] == 3


# -- named cases: each hostile shape on its own, so a failure names it -------------------------

HOSTILE = {
    "score_getattr_raises": (Evil(), {"feedback": "x"}),
    "score_float_subclass_float_raises": (EvilFloat(0.5), {"feedback": "x"}),
    "score_int_subclass_raises": (EvilInt(1), {"feedback": "x"}),
    "feedback_str_subclass_raises": (0.5, {"feedback": EvilStr("fine")}),
    "feedback_huge_str_subclass_raises": (0.5, {"feedback": EvilStr("y" * 50_000)}),
    "score_name_str_subclass_raises": (0.5, {"feedback": "x", "scores": {EvilStr("a"): 1.0}}),
    "score_name_str_subclass_bad_value": (0.5, {"feedback": "x", "scores": {EvilStr("a"): "high"}}),
    "side_info_dict_subclass_raises": (0.5, EvilDict(feedback="x")),
    "scores_dict_subclass_raises": (0.5, {"feedback": "x", "scores": EvilDict(a=1.0)}),
    "key_colliding_with_feedback": (0.5, {Colliding("feedback"): "x"}),
    "key_colliding_with_scores": (0.5, {"feedback": "x", Colliding("scores"): 1}),
    "extra_key_eq_raises": (0.5, {"feedback": "x", Evil(): "extra"}),
    "pair_tuple_subclass_raises": EvilTuple((0.5, {"feedback": "x"})),
    "pair_list_subclass_raises": EvilList([0.5, {"feedback": "x"}]),
    "bare_hostile_object": Evil(),
    "huge_int_score": (10**400, {"feedback": "x"}),
    "huge_int_named_score": (0.5, {"feedback": "x", "scores": {"a": 10**5000}}),
    "decimal_snan_score": (Decimal("sNaN"), {"feedback": "x"}),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_validate_return_survives_hostile_value(name):
    with armed():
        outcome = _validate(HOSTILE[name], 1_000)
        if isinstance(outcome, Result):
            assert isinstance(outcome.score, float) and math.isfinite(outcome.score)
            assert isinstance(outcome.feedback, str) and len(outcome.feedback) <= 1_000
            _check_named(outcome.scores)
        else:
            assert str(outcome).strip()


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_adapter_survives_hostile_value(fuzz_metrics, name):
    metric = fuzz_metrics[1_000]
    _box["value"] = HOSTILE[name]
    with armed():
        result = metric.score({"question": "2+2?"}, "4", {"answer": "4"})
        _check_adapter_result(result, 1_000)
        gold, pred = _example_and_prediction()
        _check_score_object(metric(gold, pred, None, "predict", None), 1_000)


SPEC_TABLE = [
    ((0.8, {"feedback": "Close. Missing the date."}), True),
    ([1.0, {"feedback": "OK", "scores": {"format": 1.0}}], True),
    (0.8, False),
    ((0.8, "Close."), False),
    ((0.8, {}), False),
    (("0.8", {"feedback": "OK"}), False),
    ((0.8, {"feedback": "OK", "scores": {"a": "high"}}), False),
]


@pytest.mark.parametrize("isolation", ["process", "thread"])
@pytest.mark.parametrize(("value", "valid"), SPEC_TABLE)
def test_spec_table_verdicts_hold_through_the_adapter(fuzz_metrics, worker_metrics, isolation, value, valid):
    if isolation == "thread":
        _box["value"] = value
        result = fuzz_metrics[20_000].score({"question": "q"}, "a", {"answer": "a"})
    else:
        result = worker_metrics[20_000].score({"question": "q", "value": value}, "a", {"answer": "a"})
    assert result.ok is valid, result.detail
    if not valid:
        assert result.score == FAILURE_SCORE and "contract" in result.feedback
        assert result.failure == "invalid" and "score returned" in result.detail


@given(anything(False), anything(False), st.one_of(st.none(), st.dictionaries(_PLAIN_KEYS, anything(False))))
@settings(FUZZ, max_examples=100)
def test_adapter_survives_arbitrary_arguments(fuzz_metrics, input_extra, output, expected):
    """Whatever the metric is given (input, output, expected), the adapter answers with a Result."""
    metric = fuzz_metrics[1_000]
    _box["value"] = (1.0, {"feedback": "seen"})
    inputs = {"question": "q", "extra": input_extra}
    result = metric.score(inputs, output, expected)
    _check_adapter_result(result, 1_000)
    assert result.ok and result.feedback == "seen"


@given(anything(False), anything(False), st.one_of(st.none(), st.dictionaries(_PLAIN_KEYS, anything(False))))
@settings(FUZZ, max_examples=100)
def test_worker_processes_survive_arbitrary_arguments(worker_metrics, input_extra, output, expected):
    """Whatever the metric is given, it reaches the worker process, or the call fails saying why."""
    metric = worker_metrics[1_000]
    inputs = {"question": "q", "extra": input_extra, "value": (1.0, {"feedback": "seen"})}
    result = metric.score(inputs, output, expected)
    _check_adapter_result(result, 1_000)
    if _sendable((input_extra, output, expected)):
        assert result.ok and result.feedback == "seen", result.detail
    else:
        _check_not_sent(result)
