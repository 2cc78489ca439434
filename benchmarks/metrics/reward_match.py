"""The exact-match metric through reward(): it reads the program's measured run, so loading it installs measurement."""

from skynet import reward

REWARD_SPEC = {
    "weights": {"accuracy": 0.8, "speed": 0.1, "cost": 0.1},
    "accuracy": {},
    "speed": {"reference": 2000},  # milliseconds per example
    "cost": {"reference": 0.001},  # US dollars per example
}


def score(input, output, expected=None):
    want = expected["answer"]
    feedback = "Correct." if output == want else f"Expected {want!r}, got {output!r}."
    return reward(REWARD_SPEC, 1.0 if output == want else 0.0, feedback)
