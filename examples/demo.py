"""The main job (`make demo`): the contract check on the bundled example metric and cases."""

from __future__ import annotations

import sys
from pathlib import Path

from skynet_dspy._cli import main

HERE = Path(__file__).parent

if __name__ == "__main__":
    sys.exit(main(["check", str(HERE / "metric.py"), "--data", str(HERE / "cases.jsonl")]))
