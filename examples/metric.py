"""The bundled example's metric: did the router pick the right team, how fast, and at what cost?

The dataset's labels hold `label` (the right team), `cue` (the words that point to it) and
`gold_id` (the record's id). The feedback says what is wrong and what right looks like; the
gold id goes only into an extra key, which stays with you and never reaches the optimizer.
"""

from skynet import observation, reward

REWARD_SPEC = {
    "weights": {"accuracy": 0.8, "speed": 0.1, "cost": 0.1},
    "accuracy": {},
    "speed": {"reference": 2000},  # milliseconds per ticket
    "cost": {"reference": 0.001},  # US dollars per ticket
}


def score(input, output, expected=None):
    want, cue = expected["label"], expected["cue"]
    got = str(output).strip().strip("'\".").lower()
    why = f"The ticket mentions '{cue}', which points to {want}."
    if got == want:
        feedback = f"Correct: '{want}'. {why}"
    else:
        feedback = f"Expected '{want}', got '{got}'. {why}"
    total, info = reward(REWARD_SPEC, 1.0 if got == want else 0.0, feedback)
    run = observation()
    # Extra keys are kept for you (in results) and never shown to the optimizer.
    info["run_ms"] = run.run_ms
    info["cost_usd"] = run.cost_usd
    info["gold_id"] = expected["gold_id"]
    return total, info
