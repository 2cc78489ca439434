"""The bundled example's DSPy program and data: a support-ticket router built on dspy.ChainOfThought."""

from __future__ import annotations

import json
from pathlib import Path

import dspy

HERE = Path(__file__).parent
LABELS = ("billing", "bug", "how-to", "account", "other")


class RouteTicket(dspy.Signature):
    """Classify the support ticket into one of these labels: billing, bug, how-to, account, other."""

    ticket: str = dspy.InputField(desc="the customer's message")
    label: str = dspy.OutputField(desc="one of: billing, bug, how-to, account, other")


def make_program() -> dspy.Module:
    """A fresh, unoptimized router: the program GEPA starts from."""
    return dspy.ChainOfThought(RouteTicket)


def load_split(name: str) -> list[dspy.Example]:
    """examples/<name>.jsonl as dspy.Examples: `ticket` is the input; label, cue and gold_id are labels."""
    path = HERE / f"{name}.jsonl"
    with path.open(encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    return [dspy.Example(**row).with_inputs("ticket") for row in rows]
