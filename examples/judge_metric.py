"""A second opinion on the bundled example: a model as judge, through skynet.llm().

llm() goes to the metric model, or to the reflection model when no metric model is set.
"""

from skynet import llm


def score(input, output, expected=None):
    verdict = llm(
        "You review how support tickets are routed to teams (billing, bug, how-to, account, other). "
        "Answer PASS or FAIL, then give one sentence of reasons.",
        input=f"Question: {input['ticket']}\nAnswer: {output}",
    )
    passed = str(verdict).strip().upper().startswith("PASS")
    return (1.0 if passed else 0.0), {"feedback": str(verdict)}
