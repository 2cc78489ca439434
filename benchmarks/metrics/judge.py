"""A model-as-judge metric: one llm() call per (example, output), PASS or FAIL with reasons.

The hand-written baseline metric in benchmarks/common.py sends the judge the very same
messages (JUDGE_INSTRUCTIONS and judge_input), so both runs pay for identical requests.
"""

from skynet import llm

JUDGE_INSTRUCTIONS = "Answer PASS or FAIL, then give one sentence of reasons."


def judge_input(input, output, expected=None):
    lines = [f"Question: {input['question']}"]
    if expected:
        lines.append(f"Expected: {expected['answer']}")
    lines.append(f"Answer: {output}")
    return "\n".join(lines)


def score(input, output, expected=None):
    verdict = llm(JUDGE_INSTRUCTIONS, input=judge_input(input, output, expected))
    passed = str(verdict).strip().upper().startswith("PASS")
    return (1.0 if passed else 0.0), {"feedback": str(verdict)}
