"""The command line's progress bar (tqdm): drawn on a terminal after a delay, moving while a call runs, cleared at
the end, a widget in Jupyter, nothing in a pipe."""

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
        for done in range(1, 5):
            progress.update(done)
        shown = _wait_for(stream, "4/10")
    assert "skynet-dspy score:  40%|####" in shown and "cases/s" in shown
    assert stream.getvalue().endswith("\r")  # the last write blanks the line and returns to its start


def test_the_clock_moves_while_one_slow_call_runs():
    stream = Terminal()
    with Progress("skynet-dspy check", unit="calls", stream=stream, delay=0, interval=0.01) as progress:
        progress.update(0, 3)  # check_contract's progress(done, planned)
        _wait_for(stream, "0/3")
        drawn = stream.getvalue().count("\r")
        time.sleep(0.2)
        assert stream.getvalue().count("\r") > drawn  # redrawn with no step done


def test_nothing_is_drawn_off_a_terminal_or_before_the_delay():
    piped = io.StringIO()
    with Progress("x", 5, stream=piped, delay=0, interval=0.01) as progress:
        progress.update(5)
        time.sleep(0.05)
    assert piped.getvalue() == ""
    terminal = Terminal()
    with Progress("x", 5, stream=terminal, delay=60, interval=0.01) as progress:
        progress.update(5)
        time.sleep(0.05)
    assert terminal.getvalue() == ""


def test_a_label_is_shown_as_text_never_as_control_sequences():
    stream = Terminal()
    with Progress("evil\x1b]0;title\x07", 2, stream=stream, delay=0, interval=0.01) as progress:
        progress.update(1)
        shown = _wait_for(stream, "1/2")
    assert "\x1b" not in shown and "\x07" not in shown


def test_in_a_jupyter_kernel_the_bar_is_a_widget():
    import nbformat
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    notebook = nbformat.v4.new_notebook()
    notebook.cells.append(nbformat.v4.new_code_cell(
        "from tqdm.notebook import tqdm as widget\n"
        "from skynet_dspy._results.progress import Progress\n"
        "with Progress('skynet-dspy check', 3, unit='calls', delay=0) as progress:\n"
        "    progress.update(3)\n"
        "    print(isinstance(progress.bar, widget), progress.bar.disable)\n"
    ))
    NotebookClient(notebook, km=KernelManager(kernel_name="python3"), timeout=120).execute()
    outputs = notebook.cells[0].outputs
    printed = "".join(output.get("text", "") for output in outputs)
    assert printed.strip() == "True False"
    assert any("application/vnd.jupyter.widget-view+json" in output.get("data", {}) for output in outputs)
