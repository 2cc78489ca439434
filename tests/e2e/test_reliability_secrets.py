"""Secrets (issue 9): with an API key set, no error, log record, feedback, repr or report shows it.

A distinctive fake key is put in OPENAI_API_KEY and given as api_key to the metric model; the
loopback server is then made to fail (401, a 500 whose body echoes the Authorization header),
and metrics raise, return and cut text holding the key. Every text a user or an optimizer could
read is grepped for the key and for any 16-character piece of it (a key cut in half is a leak too).

Each metric runs in both isolations. A worker process (the default) gets an environment without
credentials, so the metric file also holds the key itself, as a careless user's might.
"""

from __future__ import annotations

import json
import logging
import textwrap
import traceback
import uuid
from pathlib import Path

import dspy
import pytest

import skynet_dspy
from skynet_dspy import _cli
from skynet_dspy._judge import Judge as Models

KEY = f"sk-skynetreltest-{uuid.uuid4().hex}{uuid.uuid4().hex}"
PIECE = 16

METRIC = """
    import os
    from skynet import llm

    EMBEDDED = {key!r}

    def score(input, output, expected=None):
        key = os.environ.get("OPENAI_API_KEY") or EMBEDDED
        mode = input["mode"]
        if mode == "environment":
            return 1.0, {{"feedback": f"the key is in the environment: {{'OPENAI_API_KEY' in os.environ}}"}}
        if mode == "judge":
            verdict = llm("Answer PASS or FAIL.", input=f"Answer: {{output}}")
            return (1.0 if verdict.startswith("PASS") else 0.0), {{"feedback": verdict}}
        if mode == "raise":
            raise PermissionError(f"the provider refused key {{key}} for this model")
        if mode == "feedback":
            return 1.0, {{"feedback": f"scored with key={{key}}"}}
        if mode == "bad_score":
            return key, {{"feedback": "the score is the key"}}
        if mode == "bad_long":
            return "a" * 50 + key + "b" * 50, {{"feedback": "x"}}
        if mode == "bad_named":
            return 1.0, {{"feedback": "x", "scores": {{"auth": key}}}}
        if mode == "bad_name":
            return 1.0, {{"feedback": "x", "scores": {{key: 1.0}}}}
        if mode == "cut":
            return 1.0, {{"feedback": "x" * input["offset"] + key + "y" * 300}}
        if mode == "extra":
            return 1.0, {{"feedback": "fine", "token": key}}
        raise AssertionError(mode)
"""
MODES = ["judge", "raise", "feedback", "bad_score", "bad_long", "bad_named", "bad_name", "extra"]
ISOLATIONS = ["process", "thread"]


def _pieces(text: str) -> list[str]:
    return [KEY[start:start + PIECE] for start in range(len(KEY) - PIECE + 1)] if text else []


def assert_clean(text: str, where: str) -> None:
    """`text` holds neither the key nor any 16-character piece of it."""
    assert isinstance(text, str), where
    assert KEY not in text, f"the API key appears in {where}: {text[:500]!r}"
    leaked = [piece for piece in _pieces(KEY) if piece in text]
    assert not leaked, f"a piece of the API key ({leaked[0]!r}) appears in {where}: {text[:500]!r}"


def _authorization(request) -> str | None:
    return next((value for name, value in request.headers.items() if name.lower() == "authorization"), None)


def assert_records_clean(caplog: pytest.LogCaptureFixture) -> None:
    for record in caplog.records:
        text = record.getMessage()
        if record.exc_info:
            text += "".join(traceback.format_exception(*record.exc_info))
        assert_clean(text, f"a log record of {record.name} ({record.levelname})")


@pytest.fixture
def keyed(monkeypatch, server):
    """The fake key in the environment; a judge model with it; a fast-retrying Models."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    server.responder = lambda request: "PASS: looks right"
    lm = dspy.LM("openai/gpt-4o-mini", api_base=server.url, api_key=KEY, cache=False)
    return lm


@pytest.fixture
def metric_file(tmp_path) -> Path:
    path = tmp_path / "metric.py"
    path.write_text(textwrap.dedent(METRIC).format(key=KEY), encoding="utf-8")
    return path


@pytest.fixture(params=ISOLATIONS)
def isolation(request) -> str:
    return request.param


def _models(lm) -> Models:
    return Models(metric_lm=lm, cache=False, timeout=5, max_retries=1, retry_base_delay=0.01)


def _load(metric_file: Path, lm, isolation: str, **options) -> skynet_dspy.Metric:
    """The metric with `lm` as its judge, uncached and retrying fast (the settings _models gives a Judge)."""
    metric = skynet_dspy.load_metric(metric_file, metric_lm=lm, judge_cache=False, isolation=isolation, **options)
    metric.judge.timeout, metric.judge.max_retries, metric.judge.retry_base_delay = 5.0, 1, 0.01
    return metric


def _check_score(score, where: str) -> None:
    assert_clean(score.feedback, f"feedback ({where})")
    assert_clean(repr(score), f"repr(Score) ({where})")
    assert_clean(str(score), f"str(Score) ({where})")
    assert_clean(repr(score.result.feedback), f"Result.feedback ({where})")
    assert_clean(score.result.detail or "", f"Result.detail ({where})")
    for key, value in score.result.extra.items():
        if key != "token":  # the metric's own extra key holds the key on purpose: the user's data, never shown
            assert_clean(repr(value), f"Result.extra[{key!r}] ({where})")
    assert_clean(json.dumps(dict(score.items()), default=repr), f"the fields DSPy reads ({where})")


def _everything_about(metric: skynet_dspy.Metric, where: str) -> None:
    assert_clean(repr(metric), f"repr(Metric) ({where})")
    assert_clean(repr(metric.models), f"repr(Models) ({where})")
    assert_clean(repr(metric.judge.metric_lm), f"repr(the metric model) ({where})")
    assert_clean(repr(metric.info), f"repr(metric.info) ({where})")
    assert_clean(repr(metric.judge_usage), f"repr(judge_usage) ({where})")
    assert_clean(repr(metric.stats), f"metric.stats ({where})")


@pytest.mark.parametrize("mode", MODES)
def test_no_feedback_repr_or_log_shows_the_key(keyed, metric_file, caplog, isolation, mode):
    metric = _load(metric_file, keyed, isolation, timeout=10)
    gold = dspy.Example(mode=mode, answer="4").with_inputs("mode")
    with caplog.at_level(logging.DEBUG):
        score = metric(gold, dspy.Prediction(answer="4"))
    _check_score(score, mode)
    _everything_about(metric, mode)
    assert_records_clean(caplog)
    if mode == "judge":
        assert score.result.ok and float(score) == 1.0
    elif mode == "extra":
        assert score.result.ok
        if isolation == "thread":
            assert score.result.extra["token"] == KEY  # kept for the user, shown nowhere
        else:  # what a worker process sends back is redacted too
            assert score.result.extra["token"] == "***"
            assert_clean(repr(score.result.extra), "Result.extra from a worker process")
    elif mode == "feedback":
        assert score.result.ok and score.feedback.startswith("scored with key=")
    else:
        assert score.result.failure is not None
        assert score.result.detail, "the full story is kept for the user, redacted"
    metric.close()


def test_a_worker_process_gets_no_credentials(keyed, metric_file, isolation):
    metric = _load(metric_file, keyed, isolation, timeout=10)
    result = metric.score({"mode": "environment"}, "4", None)
    assert result.ok
    assert result.feedback == f"the key is in the environment: {isolation == 'thread'}"
    metric.close()


@pytest.mark.parametrize("offset", [0, 10, 30, 50, 70, 90, 200])
def test_feedback_cut_through_the_key_does_not_leave_half_of_it(keyed, metric_file, caplog, isolation, offset):
    metric = _load(metric_file, keyed, isolation, timeout=10, feedback_limit=150)
    with caplog.at_level(logging.DEBUG):
        result = metric.score({"mode": "cut", "offset": offset}, "4", None)
    assert result.ok and len(result.feedback) <= 150
    assert result.feedback.startswith("x" * min(offset, 50)) and "feedback cut" in result.feedback
    assert_clean(result.feedback, f"feedback cut at offset {offset}")
    assert_records_clean(caplog)
    metric.close()


@pytest.mark.parametrize("fault", ["401", "403", "500_echoing_the_key", "429_forever"])
def test_judge_errors_never_show_the_key(keyed, metric_file, server, caplog, isolation, fault):
    if fault == "500_echoing_the_key":
        def responder(request):
            raise RuntimeError(f"upstream rejected {_authorization(request)}")

        server.responder = responder
    else:
        server.fail_next(status=int(fault[:3]), retry_after=0, times=10)
    metric = _load(metric_file, keyed, isolation, timeout=10)
    with caplog.at_level(logging.DEBUG):
        score = metric(dspy.Example(mode="judge", answer="4").with_inputs("mode"), dspy.Prediction(answer="4"))
    # a judge failure is its own kind; the optimizer reads a neutral sentence, the user the full error
    kind = "judge_error" if fault[:3] in ("401", "403") else "judge_unreachable"  # a refused key, or kept failing
    assert score.result.failure == kind
    assert score.feedback.startswith("Not scored: the metric's judge model could not")
    assert "LLMCallError" in score.result.detail
    assert fault[:3] not in score.feedback and "LLMCallError" not in score.feedback
    assert any(record.levelno >= logging.WARNING and kind in record.getMessage() for record in caplog.records)
    _check_score(score, fault)
    _everything_about(metric, fault)
    assert_records_clean(caplog)
    assert any(_authorization(request) == f"Bearer {KEY}" for request in server.requests), (
        "the key did reach the provider (so the test really had it in play)"
    )
    metric.close()


def test_llm_error_raised_in_a_notebook_does_not_show_the_key(keyed, server):
    server.fail_next(status=401)
    models = _models(keyed)
    with pytest.raises(Exception) as caught:
        models.complete("Answer PASS or FAIL.", "Answer: 4")
    error = caught.value
    assert "401" in str(error)
    assert_clean(str(error), "str(error)")
    assert_clean(repr(error), "repr(error)")
    assert_clean(repr(error.args), "error.args")
    assert_clean("".join(traceback.format_exception(error)), "the traceback")
    assert_clean(repr(models), "repr(Models)")


def test_the_key_from_the_environment_alone_is_kept_out_too(monkeypatch, server, metric_file, caplog, isolation):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    server.fail_next(status=401)
    lm = dspy.LM("openai/gpt-4o-mini", api_base=server.url, cache=False)  # LiteLLM reads OPENAI_API_KEY
    metric = _load(metric_file, lm, isolation, timeout=10)
    with caplog.at_level(logging.DEBUG):
        score = metric(dspy.Example(mode="judge", answer="4").with_inputs("mode"), dspy.Prediction(answer="4"))
    assert score.result.failure == "judge_error" and "401" in score.result.detail
    assert server.requests and _authorization(server.requests[0]) == f"Bearer {KEY}"
    _check_score(score, "env key")
    assert_records_clean(caplog)
    metric.close()


def test_metric_lm_given_as_a_dict_with_the_key(keyed, server, metric_file, caplog, isolation):
    server.fail_next(status=401)
    spec = {"model": "openai/gpt-4o-mini", "api_base": server.url, "api_key": KEY}
    metric = skynet_dspy.load_metric(metric_file, metric_lm=spec, timeout=10, isolation=isolation)
    with caplog.at_level(logging.DEBUG):
        score = metric(dspy.Example(mode="judge", answer="4").with_inputs("mode"), dspy.Prediction(answer="4"))
    assert score.result.failure == "judge_error" and "401" in score.result.detail
    _check_score(score, "dict metric_lm")
    _everything_about(metric, "dict metric_lm")
    assert_records_clean(caplog)
    metric.close()


@pytest.mark.parametrize("mode", ["raise", "feedback", "bad_score", "bad_long", "bad_named", "bad_name", "judge_401"])
def test_contract_report_and_cli_never_show_the_key(keyed, server, metric_file, tmp_path, caplog, capfd, isolation,
                                                    mode):
    case = {"input": {"mode": "judge" if mode == "judge_401" else mode}, "output": "4", "expected": {"answer": "4"}}
    if mode == "judge_401":
        server.fail_next(status=401, times=10)
    with caplog.at_level(logging.DEBUG):
        report = skynet_dspy.check_contract(metric_file, [case], metric_lm=keyed, timeout=10, isolation=isolation)
    texts = [(str(report), "report text"), (report._repr_html_(), "report HTML"), (repr(report), "repr"),
             (report.to_json(), "report JSON")]
    for text, where in texts:
        assert_clean(text, f"{where} ({mode})")
    for item in report.items:
        assert_clean(item.message, f"report item {item.name} ({mode})")
    for run in report.cases:
        for result in (run.result, run.perfect):
            if result is not None:
                assert_clean(result.feedback, f"a checked case's feedback ({mode})")
                assert_clean(result.detail or "", f"a checked case's detail ({mode})")
    assert_records_clean(caplog)
    if mode != "feedback":
        assert not report.ok, "the fault was reported (so the key was really in play)"

    cases = tmp_path / "cases.jsonl"
    cases.write_text(json.dumps(case) + "\n", encoding="utf-8")
    server.clear()
    if mode == "judge_401":
        server.fail_next(status=401, times=10)
    capfd.readouterr()  # capfd: a worker process writes to the file descriptors, not to sys.stdout
    for output in ([], ["--json"]):
        code = _cli.main(["check", str(metric_file), "--data", str(cases), "--timeout", "10", "--isolation", isolation,
                          "--metric-lm", "openai/gpt-4o-mini", "--api-base", server.url, *output])
        out, err = capfd.readouterr()
        assert code == (0 if mode == "feedback" else 1), out + err
        assert out.strip(), "the CLI printed its report"
        assert_clean(out, f"CLI stdout ({mode}, {output})")
        assert_clean(err, f"CLI stderr ({mode}, {output})")
    if mode == "judge_401":  # the CLI's judge read the key from the environment, as LiteLLM does
        assert server.requests and all(_authorization(request) == f"Bearer {KEY}" for request in server.requests)


def test_disk_cache_never_stores_the_key(keyed, server, tmp_path):
    models = Models(metric_lm=keyed, cache=tmp_path / "cache", max_retries=0)
    assert models.complete("Answer PASS or FAIL.", "Answer: 4").startswith("PASS")
    files = [path for path in (tmp_path / "cache").rglob("*") if path.is_file()]
    assert files, "the disk cache wrote a file"
    for path in files:
        data = path.read_bytes()
        assert KEY.encode() not in data and KEY[-PIECE:].encode() not in data, f"{path} holds the key"
