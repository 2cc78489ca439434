"""skynet.llm(): routing to the metric / reflection model through LiteLLM, retries, cache, usage, threads."""

from __future__ import annotations

import contextlib
import logging
import subprocess
import sys
import threading

import diskcache
import dspy
import litellm
import pytest

import skynet_dspy
from skynet_dspy import LLMCallError, configure_llm
from skynet_dspy._core import context as _context
from skynet_dspy._judge import Judge as Models
from skynet_dspy._judge import judge as _models
from skynet_dspy._judge import retry

KEY = "sk-test-judge-key-0123456789"
JUDGE_INSTRUCTIONS = "Answer PASS or FAIL, then give one sentence of reasons."
CAPITALS = {"France": "Paris", "Spain": "Madrid", "Italy": "Rome"}


def judge_responder(request):
    """PASS when the answer in the user message is the capital of the country in the question."""
    for country, capital in CAPITALS.items():
        if country in request.user:
            return f"PASS: {capital} is right." if f"Answer: {capital}" in request.user else "FAIL: wrong capital."
    return "FAIL: unknown question."


def endpoint(server, model="openai/gpt-4o-mini", **settings):
    return {"model": model, "api_base": server.url, "api_key": KEY, **settings}


def fast_models(server, **options):
    """Models on the loopback server with tiny backoff sleeps."""
    options.setdefault("retry_base_delay", 0.001)
    return Models(metric_lm=options.pop("metric_lm", endpoint(server)), **options)



# -- the seed page's judge example ---------------------------------------------------------


def test_judge_example_scores_pass_and_fail(server, metrics_dir):
    server.responder = judge_responder
    metric = skynet_dspy.load_metric(metrics_dir / "judge.py", metric_lm=endpoint(server))

    right = metric.score({"question": "What is the capital of France?"}, "Paris")
    wrong = metric.score({"question": "What is the capital of France?"}, "Lyon")

    assert (right.score, right.failure) == (1.0, None)
    assert right.feedback.startswith("PASS")
    assert (wrong.score, wrong.failure) == (0.0, None)
    assert wrong.feedback.startswith("FAIL")
    assert len(server.requests) == 2


def test_judge_example_passes_the_contract_check(server, metrics_dir):
    server.responder = judge_responder
    cases = [
        {"input": {"question": f"What is the capital of {country}?"}, "output": capital, "expected": None}
        for country, capital in CAPITALS.items()
    ]
    report = skynet_dspy.check_contract(metrics_dir / "judge.py", cases, metric_lm=endpoint(server))
    assert report.ok, str(report)
    assert report.item("Metric return value").status == "passed"
    assert [case.result.score for case in report.cases] == [1.0, 1.0, 1.0]


def test_instructions_are_the_system_message_and_input_the_user_message(server, metrics_dir):
    server.responder = judge_responder
    metric = skynet_dspy.load_metric(metrics_dir / "judge.py", metric_lm=endpoint(server))
    metric.score({"question": "What is the capital of Spain?"}, "Madrid")

    (request,) = server.requests
    assert request.path.endswith("/chat/completions")
    assert request.messages == [
        {"role": "system", "content": JUDGE_INSTRUCTIONS},
        {"role": "user", "content": "Question: What is the capital of Spain?\nAnswer: Madrid"},
    ]
    assert request.headers.get("authorization") == f"Bearer {KEY}"


def test_without_input_the_instructions_are_the_only_user_message(server):
    server.responder = lambda request: "OK"
    models = fast_models(server)
    assert models.complete("Reply OK.") == "OK"
    assert server.requests[0].messages == [{"role": "user", "content": "Reply OK."}]


def test_overrides_reach_the_request_and_key_the_cache(server):
    server.responder = lambda request: f"temperature={request.body.get('temperature')}"
    models = fast_models(server, metric_lm=endpoint(server, temperature=0.0))

    assert models.complete("Judge.", "x") == "temperature=0.0"
    assert models.complete("Judge.", "x", temperature=0.7, max_tokens=20) == "temperature=0.7"
    assert server.requests[1].body["max_tokens"] == 20
    assert len(server.requests) == 2


def test_llm_rejects_non_text_arguments(server):
    models = fast_models(server)
    with pytest.raises(TypeError, match="input must be a str"):
        models.complete("Judge.", {"a": 1})
    with pytest.raises(TypeError, match="instructions must be a str"):
        models.complete(None)
    with pytest.raises(TypeError, match="stream"):
        models.complete("Judge.", "x", stream=True)
    assert server.requests == []


# -- routing -------------------------------------------------------------------------------


def test_falls_back_to_the_reflection_model(server, metrics_dir):
    server.responder = judge_responder
    metric = skynet_dspy.load_metric(
        metrics_dir / "judge.py", reflection_lm=endpoint(server, model="openai/reflector")
    )
    result = metric.score({"question": "What is the capital of Italy?"}, "Rome")
    assert result.score == 1.0
    assert [request.body["model"] for request in server.requests] == ["reflector"]


def test_the_metric_model_wins_over_the_reflection_model(server, metrics_dir):
    server.responder = judge_responder
    metric = skynet_dspy.load_metric(
        metrics_dir / "judge.py",
        metric_lm=endpoint(server, model="openai/judge-m"),
        reflection_lm=endpoint(server, model="openai/reflector"),
    )
    metric.score({"question": "What is the capital of Italy?"}, "Rome")
    assert [request.body["model"] for request in server.requests] == ["judge-m"]


def test_a_dspy_lm_gives_its_model_base_url_key_and_settings(server, metrics_dir):
    server.responder = judge_responder
    lm = dspy.LM(
        "openai/lm-judge", api_base=server.url, api_key="dspy-lm-key-98765", temperature=0.3, max_tokens=64,
        cache=False,
    )
    metric = skynet_dspy.load_metric(metrics_dir / "judge.py", metric_lm=lm)
    result = metric.score({"question": "What is the capital of France?"}, "Paris")

    assert result.score == 1.0
    (request,) = server.requests
    assert request.body["model"] == "lm-judge"
    assert request.body["temperature"] == 0.3
    assert request.body["max_tokens"] == 64
    assert request.headers.get("authorization") == "Bearer dspy-lm-key-98765"
    assert "dspy-lm-key-98765" not in repr(metric.models)


def test_base_url_is_taken_as_api_base(server):
    server.responder = lambda request: "via base_url"
    models = Models(metric_lm={"model": "openai/gpt-4o-mini", "base_url": server.url, "api_key": KEY})
    assert models.complete("Say.") == "via base_url"
    assert len(server.requests) == 1


def test_no_model_set_is_a_clear_error_at_the_first_llm_call(metrics_dir, caplog):
    metric = skynet_dspy.load_metric(metrics_dir / "judge.py")  # loading works: the error waits for llm()
    with caplog.at_level(logging.ERROR, logger="skynet_dspy"):
        result = metric.score({"question": "What is the capital of France?"}, "Paris")
    assert result.failure == "judge_not_configured"
    assert "metric_lm=" in result.detail and "reflection_lm=" in result.detail
    assert "not configured" in result.feedback and "setup problem" in result.feedback  # neutral words only
    errors = [record for record in caplog.records if record.levelno == logging.ERROR]
    assert errors and "metric_lm=" in errors[0].getMessage()  # logged as an error at once

    from skynet import llm

    with pytest.raises(skynet_dspy.ModelNotConfigured, match=r"load_metric\(\.\.\.,? .*configure_llm\(metric_lm="):
        llm("Judge this.", input="anything")


def test_contract_check_reports_the_missing_model_on_metric_return_value(metrics_dir):
    cases = [{"input": {"question": "What is the capital of France?"}, "output": "Paris"}]
    report = skynet_dspy.check_contract(metrics_dir / "judge.py", cases)
    item = report.item("Metric return value")
    assert not report.ok
    assert item.status == "failed"
    assert "ModelNotConfigured" in item.message and "metric_lm=" in item.message
    assert "metric_lm=" in str(report)


def test_configure_llm_serves_llm_outside_a_metric_and_metrics_without_models(server, metrics_dir):
    server.responder = judge_responder
    defaults = configure_llm(metric_lm=endpoint(server, model="openai/notebook-judge"))
    from skynet import llm

    assert llm(JUDGE_INSTRUCTIONS, input="Question: capital of France?\nAnswer: Paris").startswith("PASS")
    metric = skynet_dspy.load_metric(metrics_dir / "judge.py")
    assert metric.score({"question": "capital of Spain?"}, "Rome").score == 0.0
    assert [request.body["model"] for request in server.requests] == ["notebook-judge", "notebook-judge"]
    assert defaults.usage.requests == 1  # the metric's own call is counted on the metric
    assert metric.judge_usage.requests == 1

    configure_llm()  # clears them
    with pytest.raises(skynet_dspy.ModelNotConfigured):
        llm("Judge.", input="x")


@pytest.mark.parametrize(
    ("spec", "error", "words"),
    [
        (42, TypeError, "metric model must be a LiteLLM model string"),
        ({"api_base": "http://127.0.0.1:9/v1"}, ValueError, "needs a 'model' string"),
        ("  ", ValueError, "empty string"),
    ],
)
def test_a_bad_model_is_refused_when_the_metric_loads(metrics_dir, spec, error, words):
    with pytest.raises(error, match=words):
        skynet_dspy.load_metric(metrics_dir / "judge.py", metric_lm=spec)


def test_bad_models_options_are_refused():
    with pytest.raises(TypeError, match="cache must be"):
        Models(cache=123)
    with pytest.raises(ValueError, match="max_retries"):
        Models(max_retries=-1)
    with pytest.raises(ValueError, match="timeout"):
        Models(timeout=0)


# -- reliability ---------------------------------------------------------------------------


def test_429_then_success_is_retried(server):
    server.responder = lambda request: "fine"
    server.fail_next(status=429, retry_after=0)
    models = fast_models(server)
    assert models.complete("Judge.", "x") == "fine"
    assert len(server.requests) == 2
    usage = models.usage
    assert (usage.requests, usage.retries, usage.failed) == (2, 1, 0)


@pytest.mark.parametrize("status", [500, 502, 503, 408])
def test_server_errors_are_retried(server, status):
    server.responder = lambda request: "recovered"
    server.fail_next(status=status)
    assert fast_models(server).complete("Judge.", "x") == "recovered"
    assert len(server.requests) == 2


def test_a_dropped_connection_is_retried(server):
    server.responder = lambda request: "after the drop"
    server.fail_next(close_connection=True)
    assert fast_models(server).complete("Judge.", "x") == "after the drop"
    assert len(server.requests) == 2


def test_a_request_timeout_is_retried(server):
    server.responder = lambda request: "in time"
    server.fail_next(stall=1.5)
    assert fast_models(server, timeout=0.3).complete("Judge.", "x") == "in time"
    assert len(server.requests) == 2


def test_retries_are_bounded(server, caplog):
    server.fail_next(status=503, times=10)
    models = fast_models(server, max_retries=2)
    with caplog.at_level(logging.INFO, logger="skynet_dspy"), pytest.raises(LLMCallError) as caught:
        models.complete("Judge.", "x")
    assert caught.value.status == 503
    assert "3 time(s) in a row" in str(caught.value)
    assert len(server.requests) == 3
    assert (models.usage.requests, models.usage.retries, models.usage.failed) == (3, 2, 1)
    assert "retrying" in caplog.text and KEY not in caplog.text


def test_retry_after_is_honoured_when_small(server, monkeypatch):
    slept = []
    monkeypatch.setattr(_models, "_sleep", lambda seconds, cancelled: slept.append(seconds))
    server.responder = lambda request: "ok"
    server.fail_next(status=429, retry_after=0.25)
    server.fail_next(status=503, retry_after=3600)  # too long: bounded
    models = fast_models(server, retry_base_delay=0.01)
    assert models.complete("Judge.", "x") == "ok"
    assert slept[0] == pytest.approx(0.25)
    assert slept[1] == retry.MAX_RETRY_DELAY
    assert len(slept) == 2


@pytest.mark.parametrize("status", [401, 403])
def test_auth_errors_fail_at_once_without_the_key(server, metrics_dir, status, caplog):
    server.fail_next(status=status, times=5)
    models = fast_models(server)
    with caplog.at_level(logging.DEBUG), pytest.raises(LLMCallError) as caught:
        models.complete("Judge.", "x")
    message = str(caught.value)
    assert len(server.requests) == 1
    assert caught.value.status == status
    assert f"HTTP {status}" in message and "API key" in message and "metric model" in message
    assert KEY not in message and KEY not in repr(models) and KEY not in caplog.text

    metric = skynet_dspy.load_metric(metrics_dir / "judge.py", metric_lm=endpoint(server))
    result = metric.score({"question": "What is the capital of France?"}, "Paris")
    assert result.failure == "judge_error" and f"HTTP {status}" in result.detail
    assert "judge model could not answer" in result.feedback
    assert KEY not in result.feedback and KEY not in result.detail


def test_a_missing_key_fails_at_once(server, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    models = Models(metric_lm={"model": "openai/judge", "api_base": server.url})
    with pytest.raises(LLMCallError, match="has no API key") as caught:
        models.complete("Judge.", "x")
    assert "api_key=" in str(caught.value)
    assert models.usage.requests == 1 and server.requests == []


def test_a_bad_request_is_not_retried(server):
    server.fail_next(status=400)
    models = fast_models(server)
    with pytest.raises(LLMCallError) as caught:
        models.complete("Judge.", "x")
    assert caught.value.status == 400
    assert len(server.requests) == 1


def test_repr_never_shows_the_key(server):
    models = fast_models(server, reflection_lm={"model": "openai/r", "api_key": "another-secret-key-42"})
    text = repr(models) + repr(models.metric_lm) + repr(models.reflection_lm)
    assert "gpt-4o-mini" in text and server.url in text
    assert KEY not in text and "another-secret-key-42" not in text


# -- cost discipline -----------------------------------------------------------------------


def test_a_repeated_request_reaches_the_server_once(server, metrics_dir):
    server.responder = judge_responder
    metric = skynet_dspy.load_metric(metrics_dir / "judge.py", metric_lm=endpoint(server))
    first = metric.score({"question": "What is the capital of France?"}, "Lyon")
    second = metric.score({"question": "What is the capital of France?"}, "Lyon")
    assert first.feedback == second.feedback
    assert len(server.requests) == 1
    usage = metric.judge_usage
    assert (usage.requests, usage.cache_hits) == (1, 1)


def test_cache_off_pays_every_time(server):
    models = fast_models(server, cache=False)
    models.complete("Judge.", "x")
    models.complete("Judge.", "x")
    assert len(server.requests) == 2
    assert models.usage.cache_hits == 0


def test_the_disk_cache_survives_a_new_models(server, tmp_path):
    server.responder = lambda request: f"verdict #{len(server.requests)}"
    first = fast_models(server, cache=tmp_path / "judge-cache")
    assert first.complete("Judge.", "x") == "verdict #1"

    again = fast_models(server, cache=tmp_path / "judge-cache")
    assert again.complete("Judge.", "x") == "verdict #1"
    assert len(server.requests) == 1
    assert (again.usage.requests, again.usage.cache_hits) == (0, 1)
    assert again.complete("Judge.", "y") == "verdict #2"

    first.cache.close()
    again.cache.close()
    files = [path for path in (tmp_path / "judge-cache").rglob("*") if path.is_file()]
    assert any(b"verdict #1" in path.read_bytes() for path in files)  # the answers are in these files
    for path in files:  # the store's database, its journal and any value files: no key anywhere
        assert KEY.encode() not in path.read_bytes(), path
    with diskcache.Cache(str(tmp_path / "judge-cache")) as store:
        assert len(store) == 2  # the two answers, one entry each


def test_a_file_is_not_a_cache_directory(tmp_path):
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(ValueError, match="is a file; give a folder"):
        Models(cache=path)
    with pytest.raises(ValueError, match=r"the judge cache at .*inside cannot be used \(NotADirectoryError"):
        Models(cache=path / "inside")  # a folder that cannot be made


def test_concurrent_identical_requests_reach_the_server_once(server):
    server.delay = 0.2
    server.responder = lambda request: "shared verdict"
    models = fast_models(server)
    start = threading.Barrier(8)
    answers = []

    def ask():
        start.wait()
        answers.append(models.complete("Judge.", "the same input"))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers == ["shared verdict"] * 8
    assert len(server.requests) == 1
    assert (models.usage.requests, models.usage.cache_hits) == (1, 7)


def test_usage_counts_tokens_and_cost(server):
    server.responder = lambda request: {"content": "PASS", "prompt_tokens": 1200, "completion_tokens": 300}
    models = fast_models(server)
    models.complete("Judge.", "one")
    models.complete("Judge.", "two")
    models.complete("Judge.", "two")

    price = litellm.model_cost["gpt-4o-mini"]
    usage = models.usage
    assert (usage.requests, usage.cache_hits) == (2, 1)
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (2400, 600, 3000)
    expected = 2400 * price["input_cost_per_token"] + 600 * price["output_cost_per_token"]
    assert usage.cost_usd == pytest.approx(expected)
    assert usage.seconds > 0
    assert isinstance(usage, skynet_dspy.JudgeUsage)


def test_an_unknown_price_makes_the_cost_none(server):
    server.responder = lambda request: {"content": "PASS", "model": "private-judge-7", "prompt_tokens": 10}
    models = fast_models(server, metric_lm=endpoint(server, model="openai/private-judge-7"))
    models.complete("Judge.", "x")
    usage = models.usage
    assert usage.cost_usd is None
    assert usage.prompt_tokens == 10 and usage.requests == 1


def test_judge_calls_run_outside_the_program_measurement(server, monkeypatch):
    active = []
    state = {"inside": 0}

    real_judging = _context.judging

    @contextlib.contextmanager
    def not_measured():
        state["inside"] += 1
        try:
            with real_judging():
                assert _context.is_judging()  # what the program's measurement reads
                yield
        finally:
            state["inside"] -= 1

    monkeypatch.setattr(_context, "judging", not_measured)

    def responder(request):
        active.append(state["inside"])
        return "ok"

    server.responder = responder
    fast_models(server).complete("Judge.", "x")
    assert active == [1]
    assert state["inside"] == 0


# -- threads -------------------------------------------------------------------------------


def test_threads_each_reach_their_own_metric_model(server):
    server.responder = lambda request: f"{request.body['model']}|{request.user}"

    def score(input, output):
        from skynet import llm

        return 1.0, {"feedback": llm("Which model answers?", input=input["q"])}

    metrics = {
        "judge-a": skynet_dspy.load_metric(score, metric_lm=endpoint(server, model="openai/judge-a")),
        "judge-b": skynet_dspy.load_metric(score, metric_lm=endpoint(server, model="openai/judge-b")),
    }
    start = threading.Barrier(8)
    outcomes = []
    lock = threading.Lock()

    def work(worker):
        start.wait()
        for round_ in range(6):
            name = "judge-a" if (worker + round_) % 2 else "judge-b"
            question = f"{name} worker {worker} round {round_}"
            result = metrics[name].score({"q": question}, "out")
            with lock:
                outcomes.append((name, question, result.feedback))

    threads = [threading.Thread(target=work, args=(worker,)) for worker in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(outcomes) == 48
    for name, question, feedback in outcomes:
        assert feedback == f"{name}|{question}"
    assert len(server.requests) == 48
    for request in server.requests:
        assert request.user.startswith(request.body["model"] + " ")
    assert metrics["judge-a"].judge_usage.requests == 24
    assert metrics["judge-b"].judge_usage.requests == 24


# -- import cost ---------------------------------------------------------------------------


def test_importing_the_package_does_not_import_litellm():
    code = "import sys, skynet_dspy, skynet_dspy._judge, skynet; print('litellm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"
