"""rubric.py as an async metric: the same questions, asked at once with asyncio.gather and skynet.allm."""

import asyncio

from skynet import allm

CRITERIA = ("names the right capital", "is a single word", "does not hedge")


async def score(input, output, expected=None):
    question = f"Question: {input['question']}\nAnswer: {output}"
    verdicts = await asyncio.gather(*(allm(f"Criterion: {criterion}. Reply YES or NO, then one sentence.",
                                           input=question) for criterion in CRITERIA))
    met = [verdict.strip().upper().startswith("YES") for verdict in verdicts]
    missed = "".join(f" {verdict}" for verdict, ok in zip(verdicts, met, strict=True) if not ok)
    return sum(met) / len(CRITERIA), {
        "feedback": f"{sum(met)} of {len(CRITERIA)} criteria met.{missed}",
        "scores": {criterion: float(ok) for criterion, ok in zip(CRITERIA, met, strict=True)},
    }
