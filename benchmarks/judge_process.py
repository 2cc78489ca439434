"""The loopback judge in a process of its own, so its work does not compete with the benchmark for the GIL.

A real provider runs elsewhere; an in-process server would take CPU from the threads being
measured. `python -m benchmarks.judge_process --delay S` prints {"url": ...}; each line "count"
on stdin gets {"requests": N} back; end of input stops it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path


class JudgeProcess:
    """Start the judge in a child process; `.url` to reach it, `.requests()` to count what it received."""

    def __init__(self, delay: float):
        self._child = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.judge_process", "--delay", repr(delay)],
            cwd=Path(__file__).resolve().parent.parent,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self._child.stdout.readline()
        if not line:
            self._child.wait(timeout=10)
            raise RuntimeError(f"the judge process exited at start (code {self._child.returncode})")
        self.url: str = json.loads(line)["url"]

    def requests(self) -> int:
        self._child.stdin.write("count\n")
        self._child.stdin.flush()
        return int(json.loads(self._child.stdout.readline())["requests"])

    def stop(self) -> None:
        if self._child.poll() is None:
            self._child.stdin.close()
            try:
                self._child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._child.kill()
                self._child.wait()
        self._child.stdout.close()

    def __enter__(self) -> JudgeProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    from benchmarks.common import judge_server

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each answer")
    args = parser.parse_args(argv)
    server = judge_server(delay=args.delay)
    try:
        print(json.dumps({"url": server.url}), flush=True)
        for line in sys.stdin:
            if line.strip() == "count":
                print(json.dumps({"requests": len(server.requests)}), flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
