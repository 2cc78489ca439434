"""Key sweep (issue 14): every form a key takes is planted, every output the package makes is searched.

Key forms: values of environment variables whose names merely suggest a credential (AWS_SECRET_ACCESS_KEY,
AZURE_OPENAI_KEY, a lower-case github_token, DB_PASSWD, SERVICE_CREDENTIALS, a key holding ' & < > "); a
key put in the environment after load_metric; keys of 4 to 7 characters given as api_key= (a dict spec, a
dspy.LM, gepa()'s and optimize_anything's reflection model); the password and the query key inside an
api_base URL; key shapes known to no one but the metric (sk-..., Bearer ..., AKIA..., user:pass@, ?api_key=).

A metric file holds them all (a worker process has no credentials in its environment, so a careless
metric's own copy is what leaks) and spills them every way: feedback, exceptions, invalid return values,
named-score names, extra keys, a judge model echoing them, an import error, a default in score's signature.
Searched: Result and Score (fields, repr, str), Metric, Judge, endpoint settings and reflection-model reprs,
stats, every log record, the judge's disk cache, every request body the model server got, the contract
report (text, HTML, JSON, repr) and the CLI (text and --json, stdout and stderr). A key is found in any of
its raw, repr-, JSON- and HTML-escaped forms, or as any 8-character piece of a long key.
"""

from __future__ import annotations

import html
import json
import logging
import random
import string
import traceback
from dataclasses import dataclass
from pathlib import Path

import dspy
import pytest
from support import write_metric

import skynet_dspy
from skynet_dspy import _cli
from skynet_dspy._gepa import reflection_callable

PIECE = 8
_rng = random.SystemRandom()


def _token(length: int, alphabet: str = string.ascii_letters + string.digits) -> str:
    return "".join(_rng.choice(alphabet) for _ in range(length))


@dataclass(frozen=True)
class Key:
    """One planted key: how it is planted (`form`) and the secret text that must never be shown."""

    form: str
    secret: str
    planted: str = ""  # the text the metric spills, when it is more than the secret (a shape: 'Bearer ...')

    @property
    def spilled(self) -> str:
        return self.planted or self.secret


ENV = {  # environment variables whose names suggest a credential, none of them *_API_KEY
    "AWS_SECRET_ACCESS_KEY": _token(30) + "/" + _token(9),
    "AZURE_OPENAI_KEY": _token(32, "0123456789abcdef"),
    "github_token": "ghp_" + _token(36),
    "DB_PASSWD": _token(14) + "#" + _token(5),
    "SERVICE_CREDENTIALS": _token(24),
    "WEIRD_API_KEY": "Qk'&<>\"" + _token(20),  # escaped differently by repr, JSON and HTML
}
LATE = ("LATE_SERVICE_TOKEN", "late" + _token(24))  # set after load_metric, the notebook order
GIVEN = {length: "~" + _token(length - 1) for length in (4, 5, 6, 7)}  # '~' never occurs in hex or words
URL_PASSWORD = "pw" + _token(14)
QUERY_KEY = "qk" + _token(18)
_BEARER, _USERINFO, _QUERY = _token(30), "up" + _token(16), "ak" + _token(20)
SHAPES = [  # known to no one but the metric: masked by their shape alone
    Key("sk- shape", "sk-" + _token(40)),
    Key("Bearer shape", _BEARER, planted=f"Bearer {_BEARER}"),
    Key("AKIA shape", "AKIA" + _token(16, string.ascii_uppercase + string.digits)),
    Key("user:pass@ shape", _USERINFO, planted=f"https://bob:{_USERINFO}@db.example.com/x"),
    Key("?api_key= shape", _QUERY, planted=f"https://api.example.com/v1?api_key={_QUERY}"),
]

KEYS = [
    *(Key(f"env {name}", value) for name, value in ENV.items()),
    Key(f"env {LATE[0]}, set after loading", LATE[1]),
    *(Key(f"given api_key of {length} characters", value) for length, value in GIVEN.items()),
    Key("api_base password", URL_PASSWORD),
    Key("api_base ?key=", QUERY_KEY),
    *SHAPES,
]


def _needles(key: Key) -> list[str]:
    forms = {key.secret, repr(key.secret)[1:-1], json.dumps(key.secret)[1:-1], html.escape(key.secret),
             html.escape(key.secret, quote=False)}
    if len(key.secret) >= 16:
        forms |= {key.secret[start:start + PIECE] for start in range(len(key.secret) - PIECE + 1)}
    return sorted(forms)


NEEDLES = [(key, needle) for key in KEYS for needle in _needles(key)]


def assert_clean(text: str, where: str) -> None:
    """No key, in any of its forms or as an 8-character piece, is in `text`."""
    assert isinstance(text, str), where
    found = [f"{key.form} ({needle!r})" for key, needle in NEEDLES if needle in text]
    assert not found, f"{where} shows {found[:3]}: {text[:400]!r}"


def assert_records_clean(records: list[logging.LogRecord]) -> None:
    """The package's log records hold no key (LiteLLM's own debug records are LiteLLM's business)."""
    formatter = logging.Formatter("%(levelname)s %(name)s %(message)s")
    for record in [record for record in records if record.name.split(".")[0] == "skynet_dspy"]:
        text = formatter.format(record)
        if record.exc_info:
            text += "".join(traceback.format_exception(*record.exc_info))
        assert_clean(text, f"a log record ({record.levelname}: {record.getMessage()[:80]})")


METRIC = """
    from skynet import llm

    LEAK = {leak!r}
    ALL = " ".join(LEAK)

    def score(input, output, expected=None):
        mode = input["mode"]
        if mode == "raise":
            raise PermissionError(f"the provider refused: {{ALL}}")
        if mode == "feedback":
            return 1.0, {{"feedback": f"scored with {{ALL}}"}}
        if mode == "bad_score":
            return ALL, {{"feedback": "x"}}
        if mode == "bad_long":  # one long word, cut in a message: no piece of a key may survive the cut
            return "a" * 40 + "".join(LEAK) + "b" * 40, {{"feedback": "x"}}
        if mode == "bad_name":
            return 1.0, {{"feedback": "x", "scores": {{key: "high" for key in LEAK}}}}
        if mode == "named":
            return 1.0, {{"feedback": "x", "scores": {{key[:60]: 1.0 for key in LEAK[:30]}}}}
        if mode == "extra":
            return 1.0, {{"feedback": "fine", "token": LEAK}}
        if mode == "judge":
            verdict = llm("Answer PASS or FAIL. " + input.get("note", ""), input=f"Answer: {{output}}")
            return (1.0 if verdict.startswith("PASS") else 0.0), {{"feedback": verdict}}
        raise AssertionError(mode)
"""
MODES = ["raise", "feedback", "bad_score", "bad_long", "bad_name", "named", "extra", "judge"]


def _authorization(request) -> str:
    return next((value for name, value in request.headers.items() if name.lower() == "authorization"), "")


def _echo(request) -> str:
    """A judge that repeats its credentials and every key back (a provider's error page might)."""
    return f"PASS. You sent {_authorization(request)} to {request.path}; keys: {' '.join(k.spilled for k in KEYS)}"


@pytest.fixture
def planted(monkeypatch, server, tmp_path) -> Path:
    """Every environment key set, the echoing judge on the server; the metric file holding every key."""
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv(LATE[0], raising=False)
    # the 6- and 7-character keys given to the package as process-default models (the other two are given
    # with the metric); gepa() and optimize_anything's reflection model get them again below
    skynet_dspy.configure_llm(metric_lm={"model": "openai/gpt-4o-mini", "api_key": GIVEN[6]},
                              reflection_lm=dspy.LM("openai/gpt-4o-mini", api_key=GIVEN[7]))
    server.responder = _echo
    return write_metric(tmp_path, METRIC.format(leak=[key.spilled for key in KEYS]))


def _with_userinfo(url: str) -> str:
    return url.replace("http://", f"http://sweep:{URL_PASSWORD}@")


def _metric_lm(server) -> dict:
    return {"model": "openai/gpt-4o-mini", "api_base": _with_userinfo(server.url), "api_key": GIVEN[4]}


def _reflection_lm(server) -> dspy.LM:
    return dspy.LM("openai/gpt-4o-mini", api_base=f"{server.url}?key={QUERY_KEY}", api_key=GIVEN[5], cache=False)


def _files(folder: Path) -> list[Path]:
    return [path for path in folder.rglob("*") if path.is_file()]


def _assert_files_clean(folder: Path) -> None:
    files = _files(folder)
    assert files, f"{folder} holds the files the package wrote"
    for path in files:
        assert_clean(path.read_bytes().decode("utf-8", "replace"), f"the file {path}")


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_no_key_reaches_any_result_repr_log_file_or_request(planted, server, tmp_path, caplog, monkeypatch,
                                                            isolation):
    cache = tmp_path / "judge-cache"
    metric = skynet_dspy.load_metric(planted, metric_lm=_metric_lm(server), reflection_lm=_reflection_lm(server),
                                     judge_cache=str(cache), isolation=isolation, timeout=20)
    metric.judge.max_retries, metric.judge.retry_base_delay = 0, 0.01
    monkeypatch.setenv(*LATE)  # after loading: read when redacting, so masked all the same
    results = {}
    with caplog.at_level(logging.DEBUG):
        for mode in MODES:
            results[mode] = metric.score({"mode": mode}, "billing", None)
            gold = dspy.Example(mode=mode, note="dspy", answer="billing").with_inputs("mode", "note")
            score = metric(gold, dspy.Prediction(answer="billing"))
            for text, where in [(repr(score), "repr(Score)"), (str(score), "str(Score)"),
                                (json.dumps(dict(score.items()), default=repr), "the fields DSPy reads"),
                                (repr(score.result), "repr(Score.result)")]:
                assert_clean(text, f"{where} ({mode})")
        server.responder = lambda request: (_ for _ in ()).throw(RuntimeError(_echo(request)))  # now a 500
        results["judge_500"] = metric.score({"mode": "judge", "note": "again"}, "billing", None)
    for mode, result in results.items():
        where = f"{mode}, {isolation}"
        assert_clean(result.feedback, f"feedback ({where})")
        assert_clean(result.detail or "", f"Result.detail ({where})")
        assert_clean(repr(result), f"repr(Result) ({where})")
        assert_clean(json.dumps(result.scores), f"named scores ({where})")
    # the calls really spilled the keys, and failed or passed as they should
    assert results["feedback"].ok and results["feedback"].feedback.startswith("scored with ***")
    assert results["judge"].ok and results["judge"].feedback.startswith("PASS. You sent Basic *** to")
    assert results["judge_500"].failure == "judge_unreachable" and "InternalServerError" in results["judge_500"].detail
    assert results["named"].ok and "***" in results["named"].scores
    for mode in ("raise", "bad_score", "bad_name"):
        assert results[mode].failure in ("exception", "invalid") and "***" in results[mode].detail, mode
    assert results["bad_long"].failure == "invalid" and "(<a str of " in results["bad_long"].detail  # dropped whole
    if isolation == "thread":
        assert results["extra"].extra["token"][0] == ENV["AWS_SECRET_ACCESS_KEY"]  # the user's own value, kept
    models = metric.models
    for text, where in [
        (repr(metric), "repr(Metric)"), (repr(models), "repr(metric.models)"),
        (repr(models.metric_lm), "repr(metric_lm)"), (repr(models.metric_lm.settings), "metric_lm.settings"),
        (str(models.metric_lm.settings), "str(metric_lm.settings)"),
        (repr(models.reflection_lm.settings), "reflection_lm.settings"), (repr(metric.stats), "metric.stats"),
        (repr(metric.judge_usage), "judge_usage"), (repr(metric.info), "metric.info"),
    ]:
        assert_clean(text, f"{where} ({isolation})")
    assert models.metric_lm.litellm_kwargs()["api_key"] == GIVEN[4]  # LiteLLM still gets the key itself
    assert_records_clean(caplog.records)
    assert any(record.levelno >= logging.WARNING and "judge_unreachable" in record.getMessage()
               for record in caplog.records)
    metric.close()
    _assert_files_clean(cache)
    judged = [request for request in server.requests if "PASS or FAIL" in request.text]
    assert judged and all(_authorization(request).startswith("Basic ") for request in judged)
    for request in server.requests:  # the credentials travel in the Authorization header only
        assert_clean(json.dumps(request.body) + request.path, "a request the model server received")


@pytest.mark.parametrize("isolation", ["process", "thread"])
@pytest.mark.parametrize("fault", ["import", "signature"])
def test_a_key_in_a_metric_that_does_not_load_is_masked(planted, server, tmp_path, capfd, caplog, monkeypatch,
                                                         isolation, fault):
    monkeypatch.setenv(*LATE)
    # the 4- and 5-character keys (and the URL password) are given with the metric, as in the tests above: a key
    # is masked once the package was handed it, whichever test ran first
    models = {"metric_lm": _metric_lm(server), "reflection_lm": _reflection_lm(server)}
    leak = " ".join(key.spilled for key in KEYS)
    if fault == "import":
        body = f"LEAK = {leak!r}\nraise RuntimeError('cannot start: ' + LEAK)\n"
    else:  # the error shows the signature, default values and all
        body = f"def score(input, output, expected, key={leak!r}):\n    return 1.0, {{'feedback': 'x'}}\n"
    (tmp_path / "broken").mkdir()
    path = write_metric(tmp_path / "broken", body)
    with caplog.at_level(logging.DEBUG), pytest.raises(skynet_dspy.MetricLoadError) as caught:
        skynet_dspy.load_metric(path, isolation=isolation, **models)
    error = caught.value
    assert ("importing the file raised RuntimeError" if fault == "import" else "takes 4 parameters") in str(error)
    for text, where in [(str(error), "str"), (repr(error), "repr"), (repr(error.args), "args"),
                        ("".join(traceback.format_exception(error)), "the traceback")]:
        assert_clean(text, f"MetricLoadError {where} ({fault}, {isolation})")
    report = skynet_dspy.check_contract(path, [{"input": {"mode": "x"}, "output": "y"}], isolation=isolation,
                                        **models)
    assert not report.ok
    _assert_report_clean(report, f"{fault}, {isolation}")
    cases = tmp_path / "cases.jsonl"
    cases.write_text('{"input": {"mode": "x"}, "output": "y"}\n', encoding="utf-8")
    capfd.readouterr()
    for output in ([], ["--json"]):
        assert _cli.main(["check", str(path), "--data", str(cases), "--isolation", isolation, *output]) == 1
        out, err = capfd.readouterr()
        assert out.strip()
        assert_clean(out + err, f"CLI output ({fault}, {isolation}, {output})")
    assert_records_clean(caplog.records)


def _assert_report_clean(report, where: str) -> None:
    for text, form in [(str(report), "text"), (report._repr_html_(), "HTML"), (repr(report), "repr"),
                       (report.to_json(), "JSON")]:
        assert_clean(text, f"the report as {form} ({where})")
    for item in report.items:
        assert_clean(item.message, f"report item {item.name} ({where})")
    for call in report.calls:
        assert_clean(repr(call.result), f"a checked call's result ({where})")


def test_the_contract_report_and_the_cli_never_show_a_key(planted, server, tmp_path, capfd, caplog, monkeypatch):
    cases = [{"input": {"mode": mode}, "output": "billing", "expected": {"label": "billing"}} for mode in MODES]
    monkeypatch.setenv(*LATE)
    with caplog.at_level(logging.DEBUG):
        report = skynet_dspy.check_contract(planted, cases, max_cases=None, metric_lm=_metric_lm(server),
                                            judge_cache=False, timeout=20)
    assert not report.ok and report.item("Metric return value").status == "failed"
    assert "***" in str(report)
    _assert_report_clean(report, "check_contract")
    assert_records_clean(caplog.records)
    data = tmp_path / "cases.jsonl"
    data.write_text("".join(json.dumps(case) + "\n" for case in cases), encoding="utf-8")
    monkeypatch.setenv("OPENAI_API_KEY", GIVEN[6])  # the CLI's judge reads its key from the environment
    capfd.readouterr()
    for output in ([], ["--json"]):
        code = _cli.main(["check", str(planted), "--data", str(data), "--all", "--timeout", "20",
                          "--metric-lm", "openai/gpt-4o-mini", "--api-base", _with_userinfo(server.url), *output])
        out, err = capfd.readouterr()
        assert code == 1 and out.strip(), out + err
        assert_clean(out, f"CLI stdout {output}")
        assert_clean(err, f"CLI stderr {output}")
    if_json = json.loads(out)
    assert if_json["ok"] is False


def test_reflection_models_built_from_a_spec_show_no_key(planted, server, tmp_path):
    spec = {"model": "openai/gpt-4o-mini", "api_base": _with_userinfo(server.url), "api_key": GIVEN[6]}
    optimizer = skynet_dspy.gepa(planted, reflection_lm=spec, max_metric_calls=5)
    lm = optimizer.reflection_lm
    for text, where in [(repr(lm.kwargs), "repr(gepa().reflection_lm.kwargs)"), (str(lm.kwargs), "str(kwargs)"),
                        (repr(optimizer.skynet_metric.models), "repr(the metric's models)"),
                        (repr(optimizer.skynet_metric.models.reflection_lm.settings), "reflection_lm.settings")]:
        assert_clean(text, where)
    assert lm.kwargs["api_key"] == GIVEN[6]  # the model still gets its key
    optimizer.skynet_metric.close()
    plain = reflection_callable({"model": "openai/gpt-4o-mini", "api_base": f"{server.url}?key={QUERY_KEY}",
                                 "api_key": GIVEN[7]})
    for text, where in [(repr(plain), "repr(optimize_anything's reflection model)"),
                        (repr(plain.completion_kwargs), "its completion kwargs")]:
        assert_clean(text, where)
    assert plain.completion_kwargs["api_key"] == GIVEN[7]


def test_the_sweep_finds_every_planted_form():
    """The control: each key, in each form the sweep looks for, is reported when it is shown."""
    for key in KEYS:
        for text in (key.secret, repr(key.secret), json.dumps(key.secret), html.escape(key.secret),
                     f"...{key.secret[:PIECE]}..." if len(key.secret) >= 16 else key.secret):
            with pytest.raises(AssertionError):
                assert_clean(f"some text {text} more", key.form)


# -- named scores past the limits -------------------------------------------------------------


LIMITS = """
    def score(input, output, expected=None):
        count, length = (expected or input)["count"], (expected or input)["length"]
        return 1.0, {"feedback": "ok", "scores": {f"{i:03d}".ljust(length, "n"): 1.0 for i in range(count)}}
"""


@pytest.mark.parametrize(("count", "length", "verdict", "rule"), [
    (32, 64, "passed", None),
    (33, 8, "failed", "too many named scores"),
    (2, 65, "failed", "named score name is too long"),
])
def test_named_score_limits_in_the_contract_check(tmp_path, count, length, verdict, rule):
    path = write_metric(tmp_path, LIMITS)
    report = skynet_dspy.check_contract(path, [{"input": {"count": count, "length": length}, "output": "x"}],
                                        isolation="thread")
    item = report.item("Named scores")
    assert item.status == verdict, item.message
    if rule is not None:
        assert rule in item.message and ("33 names" in item.message or "65 characters" in item.message)
        assert report.item("Metric return value").status == "failed"


def test_named_score_limits_in_a_run(tmp_path, lm, server):
    """Over the limits, every call of a real dspy.Evaluate run scores as invalid, with the neutral feedback."""
    server.responder = lambda request: "[[ ## answer ## ]]\nx\n\n[[ ## completed ## ]]"
    path = write_metric(tmp_path, LIMITS)
    rows = [dspy.Example(question=f"q{i}", count=count, length=length).with_inputs("question")
            for i, (count, length) in enumerate([(33, 8), (2, 65), (32, 64), (3000, 90)])]
    with skynet_dspy.load_metric(path, timeout=20) as metric, dspy.context(lm=lm):
        evaluation = dspy.Evaluate(devset=rows, metric=metric, num_threads=2, display_progress=False)(
            dspy.Predict("question -> answer")
        )
        stats = metric.stats
    scores = [float(score) for _, _, score in evaluation.results]
    feedback = [score.feedback for _, _, score in evaluation.results]
    assert scores == [0.0, 0.0, 1.0, 0.0]
    assert stats["invalid"] == 3 and stats["calls"] == 4
    assert "(too many named scores)" in feedback[0] and "(named score name is too long)" in feedback[1]
    assert "(too many named scores)" in feedback[3] and len(feedback[3]) < 300
