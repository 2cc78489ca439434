"""reward(): accuracy combined with measured speed and cost, by the formulas docs/contract.md#reward pins."""

from __future__ import annotations

from typing import Any

from .errors import RewardSpecError
from .types import Observation
from .values import as_number, shorten, usd

COMPONENTS = ("accuracy", "speed", "cost")


def validate_spec(spec: Any) -> dict[str, float]:
    """Check a REWARD_SPEC and return its weights rescaled to sum to 1."""
    if not isinstance(spec, dict):
        raise RewardSpecError(f"REWARD_SPEC must be a dict, got {shorten(spec)}")
    unknown = sorted(set(map(str, spec)) - {"weights", *COMPONENTS})
    if unknown:
        raise RewardSpecError(
            f"REWARD_SPEC has unknown key(s) {', '.join(unknown)}; allowed: weights, accuracy, speed, cost"
        )
    if "weights" not in spec:
        raise RewardSpecError("REWARD_SPEC['weights'] is missing; give {'accuracy': w, 'speed': w, 'cost': w}")
    weights = spec["weights"]
    if not isinstance(weights, dict):
        raise RewardSpecError(
            f"REWARD_SPEC['weights'] must be a dict {{'accuracy': w, 'speed': w, 'cost': w}}, got {shorten(weights)}"
        )
    extra = sorted(set(map(str, weights)) - set(COMPONENTS))
    if extra:
        raise RewardSpecError(f"REWARD_SPEC['weights'] has unknown key(s) {', '.join(extra)}")
    numbers: dict[str, float] = {}
    for name in COMPONENTS:
        if name not in weights:
            raise RewardSpecError(f"REWARD_SPEC['weights']['{name}'] is missing; give every weight "
                                  f"(set '{name}': 0 to leave it out)")
        value = as_number(weights[name])
        if value is None or value != value or value in (float("inf"), float("-inf")):
            raise RewardSpecError(f"REWARD_SPEC['weights']['{name}'] must be a number, got {shorten(weights[name])}")
        if value < 0:
            raise RewardSpecError(f"REWARD_SPEC['weights']['{name}'] is negative ({value:g}); weights must be >= 0")
        numbers[name] = value
    total = sum(numbers.values())
    if total <= 0:
        raise RewardSpecError("REWARD_SPEC['weights'] are all 0; at least one weight must be positive")
    for name in COMPONENTS:
        section = spec.get(name, {})
        if not isinstance(section, dict):
            raise RewardSpecError(f"REWARD_SPEC['{name}'] must be a dict, got {shorten(section)}")
        unknown_fields = sorted(set(map(str, section)) - {"reference"})
        if unknown_fields:
            raise RewardSpecError(f"REWARD_SPEC['{name}'] has unknown key(s) {', '.join(unknown_fields)}")
        if name in ("speed", "cost") and "reference" not in section:
            raise RewardSpecError(f"REWARD_SPEC['{name}']['reference'] is missing; give a positive number")
        if "reference" in section:
            reference = as_number(section["reference"])
            if reference is None or not (0 < reference < float("inf")):
                raise RewardSpecError(
                    f"REWARD_SPEC['{name}']['reference'] must be a positive number, got {shorten(section['reference'])}"
                )
    return {name: value / total for name, value in numbers.items()}


def falloff(reference: float, value: float) -> float:
    """1 at zero, 1/2 at the reference, toward 0 beyond: reference / (reference + value)."""
    return reference / (reference + max(0.0, value))


def compute(
    spec: dict,
    accuracy: float,
    feedback: str,
    observation: Observation | None,
    unmeasured_reason: str | None = None,
) -> tuple[float, dict[str, Any]]:
    """The reward return value for `accuracy` and the measured run `observation`."""
    weights = validate_spec(spec)
    accuracy_value = as_number(accuracy)
    if accuracy_value is None or accuracy_value != accuracy_value:
        raise TypeError(f"reward(): accuracy must be a number, got {shorten(accuracy)}")
    if not isinstance(feedback, str):
        raise TypeError(f"reward(): feedback must be a str, got {shorten(feedback)}")

    lines = []
    accuracy_reference = spec.get("accuracy", {}).get("reference")
    if accuracy_reference is None:
        accuracy_part = min(1.0, max(0.0, accuracy_value))
        lines.append(f"accuracy {accuracy_part:.2f}")
    else:
        accuracy_part = falloff(float(accuracy_reference), accuracy_value)
        lines.append(f"accuracy {accuracy_part:.2f} (error {accuracy_value:g} vs reference {accuracy_reference:g})")

    if observation is not None and observation.unmeasured_reason:
        unmeasured_reason = observation.unmeasured_reason
    speed_reference = float(spec["speed"]["reference"])
    run_ms = observation.run_ms if observation is not None else None
    if run_ms is None:
        speed_part = 0.0
        lines.append(f"speed 0.00 (speed not measured: {unmeasured_reason or 'no run time was recorded'})")
    else:
        speed_part = falloff(speed_reference, run_ms)
        lines.append(f"speed {speed_part:.2f} ({run_ms:.0f} ms vs reference {speed_reference:g} ms)")

    cost_reference = float(spec["cost"]["reference"])
    cost = observation.cost_usd if observation is not None else None
    if cost is None:
        cost_part = 0.0
        why = (observation.cost_unknown_reason if observation is not None else None) or unmeasured_reason
        lines.append(f"cost 0.00 (cost not measured: {why or 'no model cost was recorded'})")
    else:
        cost_part = falloff(cost_reference, cost)
        lines.append(f"cost {cost_part:.2f} ({usd(cost)} vs reference {usd(cost_reference)})")

    parts = {"accuracy": accuracy_part, "speed": speed_part, "cost": cost_part}
    total = sum(weights[name] * parts[name] for name in COMPONENTS)
    text = "\n".join([feedback, *lines]) if feedback else "\n".join(lines)
    return total, {"feedback": text, "scores": parts}
