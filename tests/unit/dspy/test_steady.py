"""steady.py: the noise band. Identical work measures the same, a real slow-down shows (narrower than half the
anchor when the kind's first times were steady), a cold first connection is left behind while a kind warms up, an
anchor never moves by a small step (the examples scored before it would look slower than the same work after it),
and garbage collection is no program's time."""

from __future__ import annotations

import gc
import time

from skynet_dspy._dspy.measure import measure
from skynet_dspy._dspy.steady import CALL, OWN, SAMPLED, SPREAD, Anchors, clocks


def _warmed(anchors: Anchors, key: str, *times: float) -> None:
    """A kind's first times, measured one after another."""
    for n in range(SAMPLED):
        anchors.steady(key, times[n % len(times)], started=time.perf_counter())


def test_the_anchor_is_the_first_time_left_only_for_a_clearly_faster_one_then_fixed():
    anchors = Anchors()
    assert anchors.steady("k", 300.0) == 300.0  # a cold first connection
    assert anchors.steady("k", 60.0) == 60.0  # still warming up, and beyond the band below 300 ms: the anchor
    _warmed(anchors, "k", 62.0)
    assert anchors.steady("k", 40.0) == 60.0  # fixed: a faster time is reported as the anchor, which stays
    assert anchors.current("k", 59.0) == 60.0


def test_a_concurrent_warm_up_keeps_the_widest_band():
    """32 identical calls started together (dspy.Evaluate(num_threads=32)) answer in 500 to 531 ms, in that order:
    the first 8 to finish are the fastest of the batch, whose spread (7 ms) understates the noise. Times measured
    at once, or whose start is unknown, keep the band at half the anchor: the slower ones of the same batch, identical
    work, are reported as the anchor."""
    for started in (time.perf_counter(), None):
        anchors = Anchors()
        reported = [anchors.steady("k", 500.0 + n, started=started) for n in range(32)]
        assert reported == [500.0] * 32, [ms for ms in reported if ms != 500.0]
        assert anchors.current("k", 749.0) == 500.0


def test_a_first_time_a_little_slower_than_the_next_stays_the_anchor():
    anchors = Anchors()
    assert [anchors.steady("k", ms) for ms in (60.05, 56.73, 54.76, 56.97, 54.0)] == [60.05] * 5


def test_times_up_to_the_band_above_are_the_anchor_and_beyond_it_as_measured():
    anchors = Anchors()
    _warmed(anchors, "k", 100.0, 120.0, 90.0)  # a noisy provider: 30 ms of spread, so the widest band, 50 ms
    assert [anchors.steady("k", ms) for ms in (104.0, 96.0, 149.0, 20.0)] == [100.0] * 4
    assert anchors.steady("k", 151.0) == 151.0 and anchors.current("k", 151.0) == 151.0  # a real slow-down
    assert anchors.steady("k", 100.0) == 100.0  # and the anchor stayed


def test_a_steady_kind_gets_a_band_of_its_measured_spread_so_a_small_slow_down_shows():
    anchors = Anchors()
    for n in range(SAMPLED - 1):  # while its first times are taken, the band is the widest: half the anchor
        assert anchors.steady("k", 500.0 + n % 3, started=time.perf_counter()) == 500.0
        assert anchors.current("k", 749.0) == 500.0
    assert anchors.steady("k", 501.0, started=time.perf_counter()) == 500.0
    # fixed now, from the spread of its first times (2 ms): the floor
    assert anchors.steady("k", 509.0) == 500.0 and anchors.steady("k", 511.0) == 511.0  # 2% slower: it shows
    anchors = Anchors()
    _warmed(anchors, "k", 500.0, 740.0)  # a busy moment among the first times widens the band to its spread
    assert anchors.current("k", 749.0) == 500.0
    anchors = Anchors()
    _warmed(anchors, "k", 500.0, 508.0)  # 8 ms of spread: a band of SPREAD times it
    assert anchors.current("k", 500.0 + SPREAD * 8.0) == 500.0 and anchors.current("k", 525.0) == 525.0


def test_a_small_drop_after_the_warm_up_never_moves_the_anchor():
    anchors = Anchors()
    _warmed(anchors, "k", 54.8)
    anchors.steady("k", 51.8)  # 5% below: noise, not a faster provider
    assert anchors.current("k", 54.8) == 54.8


def test_the_floor_holds_for_short_times():
    assert CALL.width(4.0) == CALL.width(4.0, spread=0.0) == 10.0  # a 4 ms anchor: anything up to 14 ms is noise
    anchors = Anchors()
    for _ in range(SAMPLED):
        anchors.steady("own", 1.3, OWN)
    assert anchors.steady("own", 20.0, OWN) == 1.3 and anchors.steady("own", 0.2, OWN) == 1.3
    assert anchors.steady("own", 30.0, OWN) == 30.0  # past the 25 ms floor: real work


def test_kinds_keep_anchors_of_their_own_and_replays_are_never_slower_than_the_anchor():
    anchors = Anchors()
    anchors.steady("a", 10.0, CALL)
    anchors.steady("b", 500.0, CALL)
    assert anchors.current("a", 12.0) == 10.0 and anchors.current("b", 520.0) == 500.0
    assert anchors.at_most("a", 80.0) == 10.0 and anchors.at_most("a", 8.0) == 8.0 and anchors.at_most("c", 8.0) == 8.0
    nan = anchors.steady("a", float("nan"))
    assert nan != nan  # NaN passes through


def test_garbage_collection_is_not_a_programs_time():
    heap = [[] for _ in range(2_000_000)]  # a large heap, as in a long-running notebook: a full collection takes long
    clocks.start()
    for _ in range(3):  # the least of three: a busy machine may stop the test itself
        collected = clocks.collected
        _, observation = measure(gc.collect)
        spent_ms = (clocks.collected - collected) * 1000.0
        if (observation.run_ms or 0.0) < spent_ms / 2:
            break
    assert observation.run_ms is not None and observation.run_ms < spent_ms / 2, (spent_ms, observation)
    collected, started = clocks.collected, time.perf_counter()
    gc.collect()
    assert 0 < clocks.collected - collected <= time.perf_counter() - started
    del heap
