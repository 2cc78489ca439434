"""A CPU-bound metric: about 20 ms of pure-Python work per call (on the 2-core benchmark machine), then exact match.

The loop holds the GIL all along, as a metric that parses, diffs or simulates in Python does: in
threads such calls take turns on one core; in worker processes they use every core.
"""

WORK = 550_000  # loop iterations per call: about 20 ms on an AMD EPYC core of the benchmark machine


def busy(seed: int, rounds: int = WORK) -> int:
    total = seed
    for i in range(rounds):
        total = (total * 31 + i) % 1_000_003
    return total


def score(input, output, expected=None):
    busy(len(input["question"]))
    want = expected["answer"]
    if output == want:
        return 1.0, {"feedback": "Correct."}
    return 0.0, {"feedback": f"Expected {want!r}, got {output!r}."}
