"""`async def score` with `await skynet.allm(...)`: the async rubric metric (tests/metrics/rubric_async.py) against
its sync form (rubric.py) through every optimizer and isolation, its timeout, and a metric an event loop awaits."""

from __future__ import annotations

import asyncio
import json
import re
import time

import dspy
import pytest
from support import write_metric
from unit.dspy.test_optimize import BETTER, CAPITALS, examples, scripted

import skynet_dspy
from skynet_dspy import Failure
from skynet_dspy._core.types import Item
from skynet_dspy.devserver import dspy_reply

pytestmark = pytest.mark.timeout(300)

FORMS = ("rubric.py", "rubric_async.py")
KEY = "judge-key-0123456789"
# what the program answers (through the scripted model), one per example: right, wordy, hedged
ANSWERS = {"France": "Paris", "Spain": "Madrid, Spain", "Italy": "Rome, I think"}


ALL_CAPITALS = {**CAPITALS, "Japan": "Tokyo", "Peru": "Lima", "Kenya": "Nairobi", "Chile": "Santiago",
                "Egypt": "Cairo"}  # with those of tests/e2e/test_dspy_optimizers.py, for MIPROv2


def rubric_judge(request) -> str | None:
    """The judge of the rubric metrics: YES or NO per criterion, read off the question and the answer."""
    match = re.match(r"Criterion: ([^.]+)\.", request.system)
    if match is None:
        return None
    criterion = match.group(1)
    question, _, answer = request.user.partition("\nAnswer: ")
    capital = next((capital for country, capital in ALL_CAPITALS.items() if country in question), None)
    met = {"names the right capital": capital is not None and capital in answer,
           "is a single word": len(answer.split()) == 1,
           "does not hedge": "think" not in answer.lower()}[criterion]
    return "YES, it does." if met else f"NO: the answer does not meet '{criterion}'."


def world(request) -> str:
    """The rubric judge, GEPA's reflection model and the program (test_optimize's scripted world)."""
    return rubric_judge(request) or scripted(request)


def fixed_answers(request) -> str:
    """The rubric judge, and a program answering ANSWERS whatever its instructions."""
    verdict = rubric_judge(request)
    if verdict is not None:
        return verdict
    country = next(country for country in ANSWERS if country in request.user)
    return dspy_reply(answer=ANSWERS[country])


def judge_of(server) -> dict:
    return {"model": "openai/judge", "api_base": server.url, "api_key": KEY}


def judged(server) -> list:
    return [request for request in server.requests if request.system.startswith("Criterion: ")]


# -- the contract, Evaluate and BootstrapFewShot, in each isolation ---------------------------------------------


@pytest.mark.parametrize("isolation", ["process", "thread", "sandbox"])
def test_the_async_rubric_scores_as_the_sync_one_through_evaluate_and_bootstrap(server, lm, metrics_dir, isolation):
    server.responder = fixed_answers
    where = {"sandbox": True} if isolation == "sandbox" else {"isolation": isolation}
    found = {}
    for form in FORMS:
        with skynet_dspy.load_metric(metrics_dir / form, metric_lm=judge_of(server), success_threshold=1.0,
                                     judge_cache=False, **where) as metric, dspy.context(lm=lm):
            assert metric.info.is_async is (form == "rubric_async.py")
            evaluate = dspy.Evaluate(devset=examples(), metric=metric, num_threads=2, display_progress=False)
            result = evaluate(dspy.Predict("question -> answer"))
            rows = [(float(score), score.feedback, score.result.scores) for _, _, score in result.results]
            compiled = dspy.BootstrapFewShot(metric=metric, max_bootstrapped_demos=3, max_labeled_demos=0,
                                             max_rounds=1).compile(dspy.Predict("question -> answer"),
                                                                   trainset=examples())
            demos = [(demo.question, demo.answer) for demo in compiled.predictors()[0].demos]
            found[form] = (rows, demos, metric.stats["calls"], metric.judge_usage.requests)
    sync, asynchronous = found["rubric.py"], found["rubric_async.py"]
    assert asynchronous == sync
    rows, demos, calls, requests = sync
    assert [score for score, _, _ in rows] == [1.0, pytest.approx(2 / 3), pytest.approx(1 / 3)]
    assert rows[1][1].startswith("2 of 3 criteria met. NO: the answer does not meet 'is a single word'.")
    assert rows[2][2] == {"names the right capital": 1.0, "is a single word": 0.0, "does not hedge": 0.0}
    assert demos == [("What is the capital of France?", "Paris")]  # only the perfect call, at success_threshold=1.0
    assert calls == 6 and requests == 18  # three questions a call, each asked once
    assert len(judged(server)) == 36


def test_the_contract_check_names_an_async_score_and_passes_it(server, metrics_dir):
    server.responder = fixed_answers
    cases = [{"input": {"question": "What is the capital of France?"}, "output": "Paris", "expected": None},
             {"input": {"question": "What is the capital of Spain?"}, "output": "Madrid, Spain", "expected": None}]
    reports = {form: skynet_dspy.check_contract(metrics_dir / form, cases, metric_lm=judge_of(server))
               for form in FORMS}
    signature = {form: next(item.message for item in report.items if item.name == Item.SIGNATURE)
                 for form, report in reports.items()}
    assert signature == {"rubric.py": "called as score(input, output, expected)",
                         "rubric_async.py": "called as async score(input, output, expected)"}
    assert reports["rubric_async.py"].ok
    assert [call.result.score for call in reports["rubric_async.py"].calls] == \
        [call.result.score for call in reports["rubric.py"].calls] == [1.0, pytest.approx(2 / 3)]


def test_the_command_line_checks_and_scores_an_async_metric(server, metrics_dir, tmp_path, capsys, monkeypatch):
    from skynet_dspy._cli import main

    monkeypatch.setenv("OPENAI_API_KEY", KEY)  # the key of --metric-lm, as a user's environment holds it
    server.responder = fixed_answers
    data = tmp_path / "outputs.jsonl"
    rows = [{"input": {"question": f"What is the capital of {country}?"}, "output": answer, "expected": None}
            for country, answer in ANSWERS.items()]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    model = ["--metric-lm", "openai/judge", "--api-base", server.url]
    assert main(["check", str(metrics_dir / "rubric_async.py"), "--data", str(data), *model]) == 0
    printed = capsys.readouterr().out
    assert "called as async score(input, output, expected)" in printed
    scored = {}
    for form in FORMS:
        out = tmp_path / f"{form}.jsonl"
        assert main(["score", str(metrics_dir / form), "--data", str(data), "--out", str(out), *model]) == 0
        scored[form] = [(row["score"], row["feedback"]) for row in map(json.loads, out.read_text().splitlines())]
    assert scored["rubric_async.py"] == scored["rubric.py"]
    assert [score for score, _ in scored["rubric.py"]] == [1.0, pytest.approx(2 / 3), pytest.approx(1 / 3)]


# -- the optimizers ----------------------------------------------------------------------------------------------


def test_gepa_optimizes_with_the_async_rubric_as_with_the_sync_one(server, lm, metrics_dir):
    server.responder = world
    found = {}
    for form in FORMS:
        reflection = dspy.LM("openai/reflector", api_base=server.url, api_key="reflection-key-123", cache=False)
        optimizer = skynet_dspy.gepa(metrics_dir / form, reflection_lm=reflection, max_metric_calls=12)
        metric = optimizer.skynet_metric
        program = dspy.Predict("question -> answer")
        with metric, dspy.context(lm=lm):
            before = [metric(example, program(**example.inputs())).score for example in examples()]
            optimized = optimizer.compile(program, trainset=examples(), valset=examples())
            after = [metric(example, optimized(**example.inputs())).score for example in examples()]
            found[form] = (before, after, optimized.predictors()[0].signature.instructions, metric.stats["exception"])
    assert found["rubric_async.py"] == found["rubric.py"] == ([0.0, 0.0, 0.0], [1.0, 1.0, 1.0], BETTER, 0)


def test_mipro_v2_optimizes_with_the_async_rubric_as_with_the_sync_one(server, lm, metrics_dir):
    from e2e.test_dspy_optimizers import HINT, dataset
    from e2e.test_dspy_optimizers import world as question_world

    server.responder = lambda request: rubric_judge(request) or question_world(request)
    data = dataset()
    found = {}
    for form in FORMS:
        with skynet_dspy.load_metric(metrics_dir / form, metric_lm=judge_of(server)) as metric, dspy.context(lm=lm):
            optimizer = dspy.MIPROv2(metric=metric, prompt_model=lm, task_model=lm, auto=None, num_candidates=2,
                                     num_threads=2, max_bootstrapped_demos=1, max_labeled_demos=0, verbose=False,
                                     seed=0)
            compiled = optimizer.compile(dspy.Predict("question -> answer"), trainset=data[:4], valset=data[2:],
                                         num_trials=3, minibatch=False)
            found[form] = (compiled.signature.instructions, compiled.score, metric.stats["exception"],
                           metric.stats["invalid"], metric.stats["timeout"])
    assert found["rubric_async.py"] == found["rubric.py"]
    instructions, score, *failures = found["rubric.py"]
    assert HINT in instructions and score == 100.0 and failures == [0, 0, 0]


def test_optimize_anything_improves_an_artifact_with_the_async_rubric_as_with_the_sync_one(server, metrics_dir):
    server.responder = rubric_judge

    def run(template, input):
        country = next(country for country in CAPITALS if country in input["question"])
        return template.format(capital=CAPITALS[country], country=country)

    def reflect(prompt):
        return "```\n{capital}\n```"  # the reflection model's one proposal: the bare capital

    data = [skynet_dspy.split_row({"question": example.question}, inputs=["question"]) for example in examples()]
    found = {}
    for form in FORMS:
        result = skynet_dspy.optimize_anything("I think it is {capital}, in {country}", run, metrics_dir / form,
                                               trainset=data, reflection_lm=reflect, metric_lm=judge_of(server),
                                               max_metric_calls=12, max_workers=2)
        found[form] = (result.val_aggregate_scores, result.best_candidate)
    assert found["rubric_async.py"] == found["rubric.py"]
    scores, best = found["rubric.py"]
    assert scores[0] == pytest.approx(1 / 3) and max(scores) == 1.0 and best == "{capital}"


# -- allm(): concurrency, limits and the cache -----------------------------------------------------------------

GATHER = '''
import asyncio
from skynet import allm

async def score(input, output, expected=None):
    questions = [f"Question {n} on {output}?" for n in range(input["questions"])] + input.get("repeated", [])
    answers = await asyncio.gather(*(allm("Reply YES or NO.", input=question) for question in questions))
    return float(all(answer == "YES" for answer in answers)), {"feedback": " ".join(answers)}
'''


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_gathered_allm_questions_run_at_once_within_judge_max_concurrency(server, tmp_path, isolation):
    server.responder = lambda request: "YES"
    server.delay = 0.3
    path = write_metric(tmp_path, GATHER)
    with skynet_dspy.load_metric(path, metric_lm=judge_of(server), isolation=isolation) as metric:
        assert metric.score({"questions": 10}, "a").score == 1.0
        unlimited = server.most_in_progress
    server.most_in_progress = 0
    with skynet_dspy.load_metric(path, metric_lm=judge_of(server), isolation=isolation,
                                 judge_max_concurrency=3) as metric:
        assert metric.score({"questions": 10}, "b").score == 1.0
        assert server.most_in_progress == 3  # ten at once, three at a time
        # the same question thrice at once is sent once (the judge cache), as with llm()
        repeated = ["The same question?"] * 3
        assert metric.score({"questions": 0, "repeated": repeated}, "c").score == 1.0
        assert metric.judge_usage.requests == 11
    assert unlimited > 3  # without a limit they overlapped
    assert len(server.requests) == 21


def test_more_than_sixteen_gathered_questions_wait_their_turn_and_none_is_refused(server, tmp_path):
    server.responder = lambda request: "YES"
    server.delay = 0.05
    with skynet_dspy.load_metric(write_metric(tmp_path, GATHER), metric_lm=judge_of(server)) as metric:
        result = metric.score({"questions": 40}, "a")
    assert result.ok and result.score == 1.0, result.detail
    assert len(server.requests) == 40 and server.most_in_progress <= 16


def test_allm_outside_a_metric_uses_configure_llm_and_its_errors_are_llms(server):
    server.responder = lambda request: f"echo {request.user}"
    with pytest.raises(skynet_dspy.ModelNotConfigured):
        asyncio.run(skynet_dspy.skynet.allm("Hello?", input="x"))
    with pytest.raises(TypeError, match="api_base"):
        asyncio.run(skynet_dspy.skynet.allm("Hello?", api_base="http://elsewhere"))
    skynet_dspy.configure_llm(metric_lm=judge_of(server))

    async def ask():
        return await asyncio.gather(*(skynet_dspy.skynet.allm("Echo.", input=str(n)) for n in range(3)))

    assert asyncio.run(ask()) == ["echo 0", "echo 1", "echo 2"]


# -- the timeout ---------------------------------------------------------------------------------------------------

SLOW = '''
import asyncio
from skynet import allm

async def score(input, output, expected=None):
    try:
        answers = await asyncio.gather(*(allm("Reply YES.", input=f"question {n}") for n in range(8)))
    except asyncio.CancelledError:
        with open(input["log"], "a") as log:
            log.write("cancelled\\n")
        raise
    return 1.0, {"feedback": " ".join(answers)}
'''


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_a_coroutine_past_its_timeout_is_cancelled_and_no_judge_request_starts_after_it(server, tmp_path, isolation):
    server.responder = lambda request: "YES"
    server.delay = 1.0  # two at a time: requests start at about 0 s and 1 s; the next pair would at 2 s
    log = tmp_path / "log.txt"
    with skynet_dspy.load_metric(write_metric(tmp_path, SLOW), metric_lm=judge_of(server), isolation=isolation,
                                 judge_max_concurrency=2, timeout=1.5) as metric:
        result = metric.score({"log": str(log)}, "a")
        ended = time.time()  # the clock of Request.at
        assert result.failure is Failure.TIMEOUT
        assert "1.5 s" in result.feedback
        time.sleep(2.0)  # when the third pair would have started, and finished
        assert metric.stats["timeout"] == 1
    assert 2 <= len(server.requests) <= 4
    assert all(request.at < ended for request in server.requests)
    if isolation == "thread":  # the coroutine was cancelled in this process (a worker process is killed instead)
        assert log.read_text() == "cancelled\n"


SWALLOWS = '''
import asyncio

async def score(input, output, expected=None):
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        pass
    return 1.0, {"feedback": "finished anyway"}
'''


def test_a_coroutine_that_swallows_its_cancellation_still_times_out(tmp_path):
    for isolation in ("process", "thread"):
        with skynet_dspy.load_metric(write_metric(tmp_path, SWALLOWS), timeout=0.5, isolation=isolation) as metric:
            result = metric.score({}, "a")
            assert result.failure is Failure.TIMEOUT, (isolation, result)
            assert "finished anyway" not in result.feedback


def test_an_async_metrics_failures_are_contained_and_described_as_a_sync_ones(tmp_path):
    broken = write_metric(tmp_path, "async def score(input, output, expected=None):\n"
                                    "    return 1.0 / input['n'], {'feedback': 'ok'}\n")
    invalid = write_metric(tmp_path, "async def score(input, output):\n    return 'high'\n", name="invalid.py")
    exits = write_metric(tmp_path, "import sys\nasync def score(input, output):\n    sys.exit(3)\n", name="exits.py")
    for isolation in ("process", "thread"):
        with skynet_dspy.load_metric(broken, isolation=isolation) as metric:
            assert metric.score({"n": 2}, "a").score == 0.5
            failed = metric.score({"n": 0}, "a")
            assert failed.failure is Failure.EXCEPTION
            assert failed.feedback == "Not scored: the metric raised ZeroDivisionError while scoring this output."
            assert "metric.py, line 2: `return 1.0 / input['n'], {'feedback': 'ok'}`" in failed.detail
        with skynet_dspy.load_metric(invalid, isolation=isolation) as metric:
            assert metric.score({}, "a").failure is Failure.INVALID
        with skynet_dspy.load_metric(exits, isolation=isolation) as metric:
            assert metric.score({}, "a").failure is Failure.EXCEPTION


# -- a metric an event loop awaits ---------------------------------------------------------------------------------


async def _while_ticking(work):
    """Await `work` while another task ticks every 5 ms; (its value, the ticks counted meanwhile)."""
    ticks = 0
    done = asyncio.Event()

    async def ticker():
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await asyncio.sleep(0.005)

    task = asyncio.create_task(ticker())
    try:
        value = await work
    finally:
        done.set()
        await task
    return value, ticks


@pytest.mark.parametrize("form", FORMS)
def test_acall_after_program_acall_never_blocks_the_callers_loop(server, lm, metrics_dir, form):
    server.responder = fixed_answers
    server.delay = 0.2  # each judge request, and the program's, takes 0.2 s: a blocked loop would not tick meanwhile
    example = examples()[1]
    program = dspy.Predict("question -> answer")
    with skynet_dspy.load_metric(metrics_dir / form, metric_lm=judge_of(server)) as metric:

        async def run():
            with dspy.context(lm=lm):
                prediction, program_ticks = await _while_ticking(program.acall(**example.inputs()))
                score, metric_ticks = await _while_ticking(metric.acall(example, prediction))
                result, score_ticks = await _while_ticking(metric.ascore(dict(example.inputs()), "Madrid"))
            return prediction, score, result, (program_ticks, metric_ticks, score_ticks)

        prediction, score, result, ticks = asyncio.run(run())
    assert prediction.answer == "Madrid, Spain"
    assert isinstance(score, skynet_dspy.Score) and float(score) == pytest.approx(2 / 3)
    assert "is a single word" in score.feedback
    assert result.score == 1.0
    assert min(ticks) > 10, ticks  # the loop ran its other task all along each await


def test_acall_of_a_sync_metric_in_thread_isolation_and_a_cancelled_await(tmp_path):
    path = write_metric(tmp_path, "import time\ndef score(input, output, expected=None):\n"
                                  "    time.sleep(input['seconds'])\n    return 1.0, {'feedback': 'slept'}\n")
    with skynet_dspy.load_metric(path, isolation="thread") as metric:

        async def run():
            result, ticks = await _while_ticking(metric.ascore({"seconds": 0.3}, "a"))
            try:
                await asyncio.wait_for(metric.ascore({"seconds": 0.5}, "b"), timeout=0.05)
            except TimeoutError:
                cancelled = True
            return result, ticks, cancelled

        result, ticks, cancelled = asyncio.run(run())
        assert result.score == 1.0 and ticks > 10 and cancelled
        assert metric.score({"seconds": 0}, "c").ok  # the metric goes on after an await was dropped


def test_an_async_metric_called_by_hand_on_a_thread_whose_loop_runs(server, metrics_dir):
    # A notebook cell runs on the main thread inside the kernel's event loop: with isolation="thread" the metric's
    # coroutine gets a loop of its own, on a thread of its own.
    server.responder = fixed_answers
    with skynet_dspy.load_metric(metrics_dir / "rubric_async.py", metric_lm=judge_of(server),
                                 isolation="thread") as metric:

        async def cell():
            return metric.score({"question": "What is the capital of France?"}, "Paris")

        assert asyncio.run(cell()).score == 1.0
