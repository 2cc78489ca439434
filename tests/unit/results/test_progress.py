"""The command line's progress bar: drawn on a terminal after a delay, moving while a call runs, cleared at the end."""

from __future__ import annotations

import io
import time

from skynet_dspy._results.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _wait_for(stream: io.StringIO, text: str) -> str:
    deadline = time.monotonic() + 10
    while text not in stream.getvalue() and time.monotonic() < deadline:
        time.sleep(0.02)
    return stream.getvalue()


def test_the_bar_shows_steps_done_of_the_total_and_is_cleared_when_closed():
    stream = Terminal()
    with Progress("skynet-dspy score", 10, unit="cases", stream=stream, delay=0, interval=0.01) as progress:
        for _ in range(4):
            progress.advance()
        shown = _wait_for(stream, "4/10 cases")
    assert "skynet-dspy score: [#########" in shown and " 40% " in shown
    assert stream.getvalue().endswith("\r")  # the last write blanks the line and returns to its start


def test_the_clock_moves_while_one_slow_call_runs():
    stream = Terminal()
    with Progress("skynet-dspy check", unit="calls", stream=stream, delay=0, interval=0.01) as progress:
        progress.update(0, 3)  # check_contract's progress(done, planned)
        _wait_for(stream, "0/3 calls")
        drawn = stream.getvalue().count("\r")
        time.sleep(0.2)
        assert stream.getvalue().count("\r") > drawn  # redrawn with no step done


def test_nothing_is_drawn_off_a_terminal_or_before_the_delay():
    piped = io.StringIO()
    with Progress("x", 5, stream=piped, delay=0, interval=0.01) as progress:
        progress.advance(5)
        time.sleep(0.05)
    assert piped.getvalue() == ""
    terminal = Terminal()
    with Progress("x", 5, stream=terminal, delay=60, interval=0.01) as progress:
        progress.advance(5)
        time.sleep(0.05)
    assert terminal.getvalue() == ""


def test_the_line_says_rate_and_time_left():
    progress = Progress("x", 100, enabled=False)
    progress.advance(50)
    line = progress.line()
    assert "50/100 cases" in line and "/s" in line and "left" in line
    progress.close()
