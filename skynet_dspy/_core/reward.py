"""reward(): accuracy combined with measured speed and cost, by the formulas docs/contract.md#reward pins."""

from __future__ import annotations

import math
from typing import Any

from .errors import RewardSpecError
from .types import Observation
from .values import as_number, shorten, usd

COMPONENTS = ("accuracy", "speed", "cost")


def validate_spec(spec: Any) -> dict[str, float]:
    """Check a REWARD_SPEC and return its weights rescaled to sum to 1."""
    _checked("REWARD_SPEC", spec, ("weights", *COMPONENTS))
    if "weights" not in spec:
        raise RewardSpecError("REWARD_SPEC['weights'] is missing; give {'accuracy': w, 'speed': w, 'cost': w}")
    weights = _checked("REWARD_SPEC['weights']", spec["weights"], COMPONENTS, " {'accuracy': w, 'speed': w, 'cost': w}")
    numbers = {name: _weight(name, weights) for name in COMPONENTS}
    total = sum(numbers.values())
    if total <= 0:
        raise RewardSpecError("REWARD_SPEC['weights'] are all 0; at least one weight must be positive")
    for name in COMPONENTS:
        section = _checked(f"REWARD_SPEC['{name}']", spec.get(name, {}), ("reference",))
        if name != "accuracy" and "reference" not in section:
            raise RewardSpecError(f"REWARD_SPEC['{name}']['reference'] is missing; give a positive number")
        reference = as_number(section.get("reference", 1.0))
        if reference is None or not (0 < reference < math.inf):
            raise RewardSpecError(
                f"REWARD_SPEC['{name}']['reference'] must be a positive number, got {shorten(section['reference'])}"
            )
    return {name: value / total for name, value in numbers.items()}


def _checked(where: str, value: Any, allowed: tuple[str, ...], shape: str = "") -> dict[str, Any]:
    """`value` when it is a dict with no key but `allowed`; else a RewardSpecError naming `where`."""
    if not isinstance(value, dict):
        raise RewardSpecError(f"{where} must be a dict{shape}, got {shorten(value)}")
    unknown = sorted(set(map(str, value)) - set(allowed))
    if unknown:
        raise RewardSpecError(f"{where} has unknown key(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}")
    return value


def _weight(name: str, weights: dict[str, Any]) -> float:
    if name not in weights:
        raise RewardSpecError(f"REWARD_SPEC['weights']['{name}'] is missing; give every weight "
                              f"(set '{name}': 0 to leave it out)")
    value = as_number(weights[name])
    if value is None or not math.isfinite(value):
        raise RewardSpecError(f"REWARD_SPEC['weights']['{name}'] must be a number, got {shorten(weights[name])}")
    if value < 0:
        raise RewardSpecError(f"REWARD_SPEC['weights']['{name}'] is negative ({value:g}); weights must be >= 0")
    return value


def falloff(reference: float, value: float) -> float:
    """1 at zero, 1/2 at the reference, toward 0 beyond: reference / (reference + value)."""
    return reference / (reference + max(0.0, value))


def compute(
    spec: dict[str, Any],
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
    if observation is not None and observation.unmeasured_reason:
        unmeasured_reason = observation.unmeasured_reason
    pairs = (_accuracy_part(spec, accuracy_value), _speed_part(spec, observation, unmeasured_reason),
             _cost_part(spec, observation, unmeasured_reason))
    parts = {name: part for name, (part, _) in zip(COMPONENTS, pairs, strict=True)}
    total = sum(weights[name] * parts[name] for name in COMPONENTS)
    text = "\n".join([feedback] * bool(feedback) + [line for _, line in pairs])
    return total, {"feedback": text, "scores": parts}


def _accuracy_part(spec: dict[str, Any], value: float) -> tuple[float, str]:
    reference = spec.get("accuracy", {}).get("reference")
    if reference is None:
        part = min(1.0, max(0.0, value))
        return part, f"accuracy {part:.2f}"
    part = falloff(float(reference), value)
    return part, f"accuracy {part:.2f} (error {value:g} vs reference {reference:g})"


def _speed_part(spec: dict[str, Any], observation: Observation | None, unmeasured: str | None) -> tuple[float, str]:
    reference = float(spec["speed"]["reference"])
    run_ms = observation.run_ms if observation is not None else None
    if run_ms is None:
        return 0.0, f"speed 0.00 (speed not measured: {unmeasured or 'no run time was recorded'})"
    part = falloff(reference, run_ms)
    return part, f"speed {part:.2f} ({run_ms:.0f} ms vs reference {reference:g} ms)"


def _cost_part(spec: dict[str, Any], observation: Observation | None, unmeasured: str | None) -> tuple[float, str]:
    reference = float(spec["cost"]["reference"])
    cost = observation.cost_usd if observation is not None else None
    if cost is None:
        why = (observation.cost_unknown_reason if observation is not None else None) or unmeasured
        return 0.0, f"cost 0.00 (cost not measured: {why or 'no model cost was recorded'})"
    part = falloff(reference, cost)
    return part, f"cost {part:.2f} ({usd(cost)} vs reference {usd(reference)})"
