"""A rubric judge asking one question per criterion, one after another (rubric_async.py asks them at once)."""

from skynet import llm

CRITERIA = ("names the right capital", "is a single word", "does not hedge")


def score(input, output, expected=None):
    question = f"Question: {input['question']}\nAnswer: {output}"
    verdicts = [llm(f"Criterion: {criterion}. Reply YES or NO, then one sentence.", input=question)
                for criterion in CRITERIA]
    met = [verdict.strip().upper().startswith("YES") for verdict in verdicts]
    missed = "".join(f" {verdict}" for verdict, ok in zip(verdicts, met, strict=True) if not ok)
    return sum(met) / len(CRITERIA), {
        "feedback": f"{sum(met)} of {len(CRITERIA)} criteria met.{missed}",
        "scores": {criterion: float(ok) for criterion, ok in zip(CRITERIA, met, strict=True)},
    }
