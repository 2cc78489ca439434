"""steady.py: the noise band. Identical work measures the same, a real slow-down shows, a large warm-up is left
behind, and a small drop never moves the anchor (it would make a candidate look faster than its parent)."""

from __future__ import annotations

from skynet_dspy._dspy.steady import CALL, OWN, Anchors, Band


def test_times_within_the_band_are_reported_as_the_anchor_both_ways():
    anchors = Anchors()
    assert anchors.steady("k", 100.0) == 100.0  # the first time seen is the anchor
    assert [anchors.steady("k", ms) for ms in (104.0, 96.0, 140.0, 70.0)] == [100.0] * 4
    assert anchors.current("k", 97.0) == 100.0


def test_a_small_drop_never_moves_the_anchor():
    anchors = Anchors()
    anchors.steady("k", 54.8)
    anchors.steady("k", 51.8)  # 5% below: noise, not a faster provider
    assert anchors.current("k", 54.8) == 54.8


def test_a_real_slow_down_shows_as_measured():
    anchors = Anchors()
    anchors.steady("k", 100.0)
    assert anchors.steady("k", 151.0) == 151.0 and anchors.current("k", 151.0) == 151.0
    assert anchors.steady("k", 100.0) == 100.0  # and the anchor stayed


def test_a_large_warm_up_is_left_behind():
    anchors = Anchors()
    anchors.steady("k", 300.0)  # a first connection
    assert anchors.steady("k", 60.0) == 60.0  # more than a third below: the new anchor
    assert anchors.steady("k", 62.0) == 60.0


def test_the_floor_holds_for_short_times():
    band = Band(0.5, 10.0)
    assert band.above(4.0) == 14.0 and band.below(4.0) == -6.0  # 4 ms anchor: anything up to 14 ms is noise
    anchors = Anchors()
    anchors.steady("own", 1.3, OWN)
    assert anchors.steady("own", 20.0, OWN) == 1.3 and anchors.steady("own", 0.2, OWN) == 1.3
    assert anchors.steady("own", 30.0, OWN) == 30.0  # past the 25 ms floor: real work


def test_kinds_keep_anchors_of_their_own_and_nan_passes_through():
    anchors = Anchors()
    anchors.steady("a", 10.0, CALL)
    anchors.steady("b", 500.0, CALL)
    assert anchors.current("a", 12.0) == 10.0 and anchors.current("b", 520.0) == 500.0
    assert anchors.known("a") and not anchors.known("c")
    assert anchors.steady("a", float("nan")) != anchors.steady("a", float("nan"))  # NaN stays NaN
