"""check_contract and its report: every item, through metric files written for each case."""

from __future__ import annotations

import logging
import re
import time

import dspy
import pytest
from support import returning
from support import write_metric as write

import skynet_dspy
from skynet_dspy import CheckItem, ContractReport, check_contract

FAILED, PASSED, WARNING, NOT_RUN = "failed", "passed", "warning", "not run"
CORE_ITEMS = ["Metric loads", "Metric signature", "Metric return value", "Metric timeout", "Named scores",
              "Perfect output scores highest"]
CASE = {"input": {"question": "Capital of France?"}, "output": "Paris", "expected": {"label": "Paris"}}
TICKETS = [
    dspy.Example(ticket="I was charged twice.", label="billing").with_inputs("ticket"),
    dspy.Example(ticket="The app crashes.", label="bug").with_inputs("ticket"),
    dspy.Example(ticket="How do I export?", label="how-to").with_inputs("ticket"),
]




def names(report: ContractReport) -> list[str]:
    return [item.name for item in report.items]


# -- the seed page's metrics ------------------------------------------------------------------


def test_exact_match_passes_on_dspy_examples(metrics_dir):
    report = check_contract(metrics_dir / "exact_match.py", TICKETS)
    assert report.ok, report
    assert names(report) == CORE_ITEMS
    assert all(item.status == PASSED for item in report.items), report
    assert report.item("Metric signature").message == "called as score(input, output, expected)"
    assert len(report.cases) == 3 and [case.expected for case in report.cases] == [
        {"label": "billing"}, {"label": "bug"}, {"label": "how-to"}]
    # each case: its expected values, and another case's as a wrong output
    assert [(call.case, call.role, call.output, call.result.score) for call in report.calls] == [
        (1, "perfect", "billing", 1.0), (1, "contrast", "bug", 0.0),
        (2, "perfect", "bug", 1.0), (2, "contrast", "how-to", 0.0),
        (3, "perfect", "how-to", 1.0), (3, "contrast", "billing", 0.0),
    ]


def test_exact_match_passes_on_plain_cases_with_and_without_output(metrics_dir):
    cases = [
        {"input": {"ticket": "charged twice"}, "expected": {"label": "billing"}},
        {"input": {"ticket": "crash"}, "output": "billing", "expected": {"label": "bug"}},
        {"input": {"ticket": "export"}, "output": "how-to", "expected": {"label": "how-to"}},
    ]
    report = check_contract(metrics_dir / "exact_match.py", cases)
    assert report.ok and all(item.status == PASSED for item in report.items), report
    assert report.cases[0].output == "billing" and report.cases[0].result is None
    assert report.cases[0].perfect.score == 1.0
    assert report.cases[1].result.score == 0.0 and report.cases[1].result.feedback == "Expected 'bug', got 'billing'."
    assert report.cases[1].perfect.score == 1.0
    assert "the 3 other output(s) tried score at most 1" in report.item("Perfect output scores highest").message


def test_json_fields_passes_on_cases_with_json_outputs(metrics_dir):
    cases = [
        {"input": {"text": "Ann, 31"}, "output": '{"name": "Ann", "age": 31}', "expected": {"fields": ["name", "age"]}},
        {"input": {"text": "Bob"}, "output": '{"name": "Bob"}', "expected": {"fields": ["name", "age"]}},
        {"input": {"text": "?"}, "output": "not json", "expected": {"fields": ["name"]}},
    ]
    report = check_contract(metrics_dir / "json_fields.py", cases)
    assert report.ok, report
    assert report.item("Metric return value").status == PASSED
    assert report.item("Named scores").message == "fields, format on every call"
    assert [case.result.score for case in report.cases] == [1.0, 0.75, 0.0]
    # its expected values are a list of required keys, not an output: the check says so, without failing
    perfect = report.item("Perfect output scores highest")
    assert perfect.status == WARNING and "TypeError" in perfect.message
    assert "json_fields.py, line 6" in perfect.message and "ignore this" in perfect.message


def test_reward_metric_passes_and_its_spec_is_checked(metrics_dir):
    report = check_contract(metrics_dir / "reward_metric.py", TICKETS)
    assert report.ok, report
    assert names(report) == CORE_ITEMS[:2] + ["Reward spec"] + CORE_ITEMS[2:]
    assert report.item("Reward spec").status == PASSED
    assert report.item("Named scores").message == "accuracy, cost, speed on every call"
    assert report.item("Perfect output scores highest").status == PASSED


def test_judge_without_a_model_reports_llm_as_not_configured(metrics_dir):
    cases = [{"input": {"question": "2+2?"}, "output": "4"}]
    report = check_contract(metrics_dir / "judge.py", cases)
    assert not report.ok
    item = report.item("Metric return value")
    assert item.status == FAILED
    assert "ModelNotConfigured" in item.message
    assert "metric_lm" in item.message or "reflection_lm" in item.message
    assert "judge.py, line 5" in item.message  # where in the metric the call was made
    assert "give it a model: metric_lm= in Python, or --metric-lm MODEL" in item.message  # advice for both ways
    assert report.item("Metric loads").status == PASSED


def test_judge_passes_with_a_metric_model(metrics_dir, server, lm):
    server.responder = lambda request: "PASS. Four is right." if "Answer: 4" in request.user else "FAIL. Not four."
    cases = [{"input": {"question": "2+2?"}, "output": "4"}, {"input": {"question": "2+2?"}, "output": "5"}]
    report = check_contract(metrics_dir / "judge.py", cases, metric_lm=lm)
    assert report.ok, report
    assert [case.result.score for case in report.cases] == [1.0, 0.0]
    assert report.cases[1].result.feedback == "FAIL. Not four."
    assert report.item("Perfect output scores highest").status == NOT_RUN  # no expected values to try


# -- the return-value table and the decided points ----------------------------------------------

VERDICTS = [
    # (expression score returns, report ok?, words in the "Metric return value" message)
    ('(0.8, {"feedback": "Close. Missing the date."})', True, "valid"),
    ('[1.0, {"feedback": "OK", "scores": {"format": 1.0}}]', True, "valid"),
    ("0.8", False, "no side information"),
    ('(0.8, "Close.")', False, "side information is not a dict"),
    ("(0.8, {})", False, "no feedback string"),
    ('("0.8", {"feedback": "OK"})', False, "score is a string"),
    ('(0.8, {"feedback": "OK", "scores": {"a": "high"}})', False, "named score is not a number"),
    ('(math.nan, {"feedback": "x"})', False, "score is NaN"),
    ('(math.inf, {"feedback": "x"})', False, "score is infinite"),
    ('(True, {"feedback": "x"})', True, "valid"),
    ('(np.float32(0.5), {"feedback": "x"})', True, "valid"),
    ('(np.int64(1), {"feedback": "x"})', True, "valid"),
    ('(1.0, {"feedback": "x"}, 3)', False, "not exactly 2 items"),
    ("None", False, "no return value"),
    ('(x for x in (1.0, {"feedback": "x"}))', False, "score returned a generator"),
]
# Each rejection names its rule (a short fixed name) after this prefix; the full advice and the value follow.
BROKE = "the return value broke the contract: "


@pytest.mark.parametrize(("value", "ok", "words"), VERDICTS)
def test_each_return_value_gets_its_verdict(tmp_path, value, ok, words):
    report = check_contract(returning(tmp_path, value), [CASE])
    item = report.item("Metric return value")
    assert report.ok is ok, report
    assert words in item.message
    if ok:
        assert item.status == PASSED
    else:
        assert item.status == FAILED
        assert "score returned" in item.message  # the value is shown
        assert item.message.startswith("case 1, given output: " + BROKE)
        # what the optimizer saw: the rule's short name, never the value
        result = report.cases[0].result
        assert result.failure == "invalid" and "score returned" not in result.feedback
        assert "(2 of 2 calls failed)" in item.message


def test_rejections_show_the_value_returned(tmp_path):
    report = check_contract(returning(tmp_path, '(0.8, "Close.")'), [CASE])
    assert "score returned (0.8, 'Close.')" in report.item("Metric return value").message


def test_a_huge_returned_value_is_shortened_in_the_report(tmp_path):
    report = check_contract(returning(tmp_path, '("x" * 500_000, {"feedback": "ok"})'), [CASE])
    message = report.item("Metric return value").message
    # one long word is never cut in two (a key cut in half escapes redaction): its length is shown instead
    assert "score is a string" in message and "<a str of 500,000 characters>" in message
    assert len(message) < 1000
    assert len(str(report)) < 5000


def test_bool_scores_are_numbers_in_the_results(tmp_path):
    report = check_contract(returning(tmp_path, '(output == expected["label"], {"feedback": "x"})'), [
        {**CASE, "output": "Lyon"}])
    assert report.ok
    assert report.cases[0].result.score == 0.0 and report.cases[0].perfect.score == 1.0


# -- the signature -----------------------------------------------------------------------------


@pytest.mark.parametrize("params", ["input", "a, b, c, d"])
def test_one_or_four_parameters_fail_at_metric_signature(tmp_path, params):
    report = check_contract(returning(tmp_path, '(1.0, {"feedback": "x"})', params), [CASE])
    assert not report.ok
    assert report.item("Metric loads").status == PASSED
    signature = report.item("Metric signature")
    assert signature.status == FAILED and f"score({params}) takes" in signature.message
    assert [item.status for item in report.items[2:]] == [NOT_RUN] * 4
    assert report.item("Metric timeout").message == "not run: Metric signature failed"
    assert report.calls == []


def test_star_args_is_called_with_input_output_expected(tmp_path):
    report = check_contract(returning(tmp_path, '(1.0, {"feedback": repr(args)})', "*args"), [CASE])
    assert report.ok, report
    assert report.item("Metric signature").message == "called as score(input, output, expected)"
    assert report.cases[0].result.feedback == repr(({"question": "Capital of France?"}, "Paris", {"label": "Paris"}))


def test_two_parameters_are_called_as_input_output(tmp_path):
    path = write(tmp_path, """
        def score(input, output):
            return 1.0, {"feedback": f"{sorted(input)} {output}"}
        """)
    report = check_contract(path, [CASE])
    assert report.ok, report
    assert report.item("Metric signature").message == "called as score(input, output)"
    assert report.cases[0].result.feedback == "['question'] Paris"


# -- load errors are reported, never raised ------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ("def score(input, output):\n    return (1.0, {'feedback': 'x'}\n", ", line 2: syntax error:"),
        ("x = 1\ny = x / 0\ndef score(input, output):\n    pass\n",
         ", line 2 (`y = x / 0`): importing the file raised ZeroDivisionError: division by zero"),
        ("def scorer(input, output):\n    pass\n", "defines no function named `score` (it defines scorer)"),
        ("score = 'high'\n", ": `score` is a str, not a function"),
    ],
)
def test_load_errors_are_reported_at_metric_loads(tmp_path, body, words):
    path = tmp_path / "metric.py"
    path.write_text(body)
    report = check_contract(path, [CASE])
    assert not report.ok
    loads = report.item("Metric loads")
    assert loads.status == FAILED
    assert loads.message.startswith(str(path)) and words in loads.message
    assert "Reward spec" not in names(report)
    assert [item.status for item in report.items[1:]] == [NOT_RUN] * 5
    assert report.item("Named scores").message == "not run: Metric loads failed"


def test_a_missing_metric_file_is_reported_at_metric_loads(tmp_path):
    report = check_contract(tmp_path / "missing.py", [CASE])
    assert not report.ok and report.item("Metric loads").status == FAILED
    assert "metric file not found" in report.item("Metric loads").message


def test_a_bad_reward_spec_is_reported_at_reward_spec(tmp_path):
    path = write(tmp_path, """
        from skynet import reward

        REWARD_SPEC = {"weights": {"accuracy": 1, "speed": 0, "cost": 0}, "speed": {"reference": -5},
                       "cost": {"reference": 0.01}}

        def score(input, output, expected=None):
            return reward(REWARD_SPEC, 1.0, "x")
        """)
    report = check_contract(path, [CASE])
    assert not report.ok
    assert [item.status for item in report.items[:3]] == [PASSED, PASSED, FAILED]
    assert report.items[2].name == "Reward spec" and "REWARD_SPEC['speed']['reference']" in report.items[2].message


def test_an_exception_in_score_is_reported_with_its_line(tmp_path):
    path = write(tmp_path, """
        def score(input, output, expected=None):
            words = output.split()
            return len(words[5]), {"feedback": "x"}
        """)
    report = check_contract(path, [CASE])
    item = report.item("Metric return value")
    assert item.status == FAILED
    assert "IndexError: list index out of range" in item.message
    assert "metric.py, line 4: `return len(words[5]), {\"feedback\": \"x\"}`" in item.message
    assert "(2 of 2 calls failed)" in item.message


def test_expected_none_hint_when_score_subscripts_it(metrics_dir):
    report = check_contract(metrics_dir / "exact_match.py", [{"input": {"q": 1}, "output": "x", "expected": None}])
    message = report.item("Metric return value").message
    assert "TypeError" in message and "score got expected=None" in message
    assert report.item("Perfect output scores highest").status == NOT_RUN


# -- the timeout -------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -2, 600.5, 1e9, float("nan")])
def test_timeout_outside_the_range_is_a_value_error(metrics_dir, bad):
    with pytest.raises(ValueError, match=r"timeout must be a number of seconds in \(0, 600\]"):
        check_contract(metrics_dir / "exact_match.py", TICKETS, timeout=bad)


def test_a_hanging_metric_is_reported_at_metric_timeout_and_the_check_returns(tmp_path):
    path = write(tmp_path, """
        import time

        def score(input, output, expected=None):
            time.sleep(30)
            return 1.0, {"feedback": "late"}
        """)
    started = time.monotonic()
    report = check_contract(path, TICKETS, timeout=0.5)
    elapsed = time.monotonic() - started
    assert elapsed < 10  # a correctness bound: the check did not wait for the 30 s sleep
    assert not report.ok
    item = report.item("Metric timeout")
    assert item.status == FAILED
    assert item.message.startswith("case 1, expected values as output: score did not return within 0.5 s")
    assert len(report.calls) == 1  # it stops at the first stuck call
    assert report.item("Metric return value").status == NOT_RUN


def test_a_slow_case_after_good_ones_is_named(tmp_path):
    path = write(tmp_path, """
        import time

        def score(input, output, expected=None):
            if input["ticket"] == "The app crashes.":
                time.sleep(30)
            return float(output == expected["label"]), {"feedback": "x"}
        """)
    report = check_contract(path, TICKETS, timeout=0.5)
    assert report.item("Metric timeout").message.startswith("case 2, expected values as output: ")
    assert report.item("Metric return value").status == PASSED  # the calls that returned were valid
    assert len(report.cases) == 2


def test_the_header_counts_every_case_a_timeout_left_unrun(tmp_path):
    path = write(tmp_path, """
        import time

        def score(input, output, expected=None):
            time.sleep(30)
        """)
    cases = [{"input": {"n": n}, "output": "x"} for n in range(6)]
    report = check_contract(path, cases, max_cases=4, timeout=0.3)
    assert len(report.cases) == 1 and report.stopped == 3 and report.not_run == 2
    assert report.heading.endswith(
        "on 1 case (3 cases not run after a call did not return in time; 2 more cases not run; "
        "max_cases=None runs every case)")
    assert report.to_dict()["cases_not_run"] == 5


def test_the_default_timeout_is_60_seconds(metrics_dir):
    report = check_contract(metrics_dir / "exact_match.py", TICKETS)
    assert "within the 60 s timeout" in report.item("Metric timeout").message


# -- perfect output ----------------------------------------------------------------------------

INVERTED = """
    def score(input, output, expected=None):
        right = output != expected["label"]   # the bug: inverted comparison
        return float(right), {"feedback": "right" if right else "wrong"}
    """


def test_an_inverted_comparison_fails_the_check_with_dspy_examples(tmp_path):
    report = check_contract(write(tmp_path, INVERTED), TICKETS)
    item = report.item("Perfect output scores highest")
    assert item.status == FAILED
    assert "a perfect output scores 0 (case 1, expected values as output), no higher than the failure score 0" in (
        item.message)
    assert "inverted comparison" in item.message and "wrong field" in item.message
    assert not report.ok
    assert "A perfect output does not score highest" in report.verdict and "inverted comparison" in report.verdict


def test_an_inverted_comparison_fails_with_plain_cases_with_outputs(tmp_path):
    cases = [{"input": {"ticket": "a"}, "output": "bug", "expected": {"label": "billing"}}]
    report = check_contract(write(tmp_path, INVERTED), cases)
    item = report.item("Perfect output scores highest")
    assert item.status == FAILED and "(case 1, expected values as output)" in item.message


def test_an_inverted_comparison_fails_with_plain_cases_without_outputs(tmp_path):
    cases = [{"input": {"ticket": "a"}, "expected": {"label": "billing"}},
             {"input": {"ticket": "b"}, "expected": {"label": "bug"}}]
    report = check_contract(write(tmp_path, INVERTED), cases)
    assert report.item("Perfect output scores highest").status == FAILED
    assert not report.ok


def test_a_perfect_output_below_a_different_output_fails_even_above_the_failure_score(tmp_path):
    path = write(tmp_path, """
        def score(input, output, expected=None):
            return (0.9 if output != expected["label"] else 0.5), {"feedback": "x"}
        """)
    report = check_contract(path, TICKETS)
    item = report.item("Perfect output scores highest")
    assert item.status == FAILED and not report.ok
    assert "a perfect output scores 0.5" in item.message and "below the 0.9 of an output that differs from it" in (
        item.message)


def test_a_metric_that_never_rewards_fails_even_when_every_output_scores_the_same(tmp_path):
    report = check_contract(returning(tmp_path, '(0.0, {"feedback": "no"})'), TICKETS)
    assert report.item("Perfect output scores highest").status == FAILED


def test_a_metric_that_scores_every_output_the_same_is_warned_about(tmp_path):
    report = check_contract(returning(tmp_path, '(0.7, {"feedback": "fine"})'), TICKETS)
    item = report.item("Perfect output scores highest")
    assert item.status == WARNING and report.ok
    assert "every output tried, the perfect ones included, scores 0.7" in item.message


def test_the_failure_score_is_the_floor_a_perfect_output_must_beat(tmp_path):
    path = write(tmp_path, """
        def score(input, output, expected=None):
            return (-1.0 if output == expected["label"] else -5.0), {"feedback": "x"}
        """)
    assert check_contract(path, TICKETS, failure_score=-10.0).item("Perfect output scores highest").status == PASSED
    assert check_contract(path, TICKETS, failure_score=-1.0).item("Perfect output scores highest").status == FAILED


def test_cases_without_expected_values_skip_the_perfect_output_item(tmp_path):
    path = write(tmp_path, """
        def score(input, output, expected=None):
            return float(len(output) < 10), {"feedback": "short" if len(output) < 10 else "too long"}
        """)
    cases = [{"input": {"q": "a"}, "output": "short", "expected": None}, {"input": {"q": "b"}, "output": "long" * 9}]
    report = check_contract(path, cases)
    assert report.ok, report
    item = report.item("Perfect output scores highest")
    assert item.status == NOT_RUN and item.message.startswith("skipped: no case has expected values")
    assert [call.role for call in report.calls] == ["given", "given"]


def test_a_single_case_with_no_other_output_says_there_is_nothing_to_compare(metrics_dir):
    report = check_contract(metrics_dir / "exact_match.py", TICKETS[:1])
    item = report.item("Perfect output scores highest")
    assert item.status == PASSED and "no other output to compare with" in item.message


def test_only_the_first_three_examples_are_used(metrics_dir):
    taken = []

    def cases():
        for number in range(100):
            taken.append(number)
            yield {"input": {"n": number}, "output": "x", "expected": {"label": "x"}}

    report = check_contract(metrics_dir / "exact_match.py", cases())
    # only the first three are scored, and a generator is not read further (it may be endless)
    assert len(report.cases) == 3 and [case.input for case in report.cases] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert {call.case for call in report.calls} == {1, 2, 3}
    assert len(taken) == 3 and report.not_run == 0
    # a list is counted: the header says how many were not run
    listed = check_contract(metrics_dir / "exact_match.py", list(cases()))
    assert listed.not_run == 97
    assert str(listed).splitlines()[0].endswith(
        "on 3 cases (97 more cases not run; max_cases=None runs every case)")

    everything = check_contract(metrics_dir / "exact_match.py", cases(), max_cases=None)
    assert len(everything.cases) == 100 and everything.not_run == 0


# -- feedback, extra keys, named scores ------------------------------------------------------------


def test_empty_feedback_is_valid_but_warned(tmp_path):
    report = check_contract(returning(tmp_path, '(1.0, {"feedback": "  "})'), [CASE])
    item = report.item("Metric return value")
    assert report.ok and item.status == WARNING
    assert "the feedback is empty on case 1, given output" in item.message


def test_extra_keys_are_allowed_and_named(tmp_path):
    report = check_contract(returning(tmp_path, '(1.0, {"feedback": "ok", "debug": 1, "trace": []})'), [CASE])
    item = report.item("Metric return value")
    assert report.ok and item.status == PASSED
    assert "extra keys kept for you, not shown to the optimizer: debug, trace" in item.message
    assert report.cases[0].result.extra == {"debug": 1, "trace": []}


def test_feedback_over_the_limit_is_cut_and_warned(tmp_path):
    report = check_contract(returning(tmp_path, '(1.0, {"feedback": "z" * 5000})'), [CASE], feedback_limit=300)
    feedback = report.cases[0].result.feedback
    assert len(feedback) <= 300 and feedback.startswith("zzz")
    assert "feedback cut" in feedback and "5,000 characters" in feedback
    item = report.item("Metric return value")
    assert report.ok and item.status == WARNING and "over the limit and was cut" in item.message


def test_named_scores_that_change_between_calls_are_warned(tmp_path):
    path = write(tmp_path, """
        def score(input, output, expected=None):
            if output == expected["label"]:
                return 1.0, {"feedback": "ok", "scores": {"format": 1.0, "accuracy": 1.0}}
            return 0.0, {"feedback": "no", "scores": {"format": 1.0}}
        """)
    report = check_contract(path, [{**CASE, "output": "Lyon"}])
    item = report.item("Named scores")
    assert report.ok and item.status == WARNING
    assert "{format} vs {accuracy, format}" in item.message


# -- sources, examples, report ---------------------------------------------------------------------


def test_a_loaded_metric_and_a_function_are_accepted(metrics_dir):
    metric = skynet_dspy.load_metric(metrics_dir / "exact_match.py", timeout=5)
    report = check_contract(metric, TICKETS)
    assert report.ok and "within the 5 s timeout" in report.item("Metric timeout").message

    def score(input, output):
        return 1.0, {"feedback": "always"}

    report = check_contract(score, [CASE])
    assert report.ok and report.metric.endswith("score")
    with pytest.raises(TypeError, match="got a Metric already loaded, and options"):
        check_contract(metric, TICKETS, timeout=3)


@pytest.mark.parametrize(
    ("examples", "error", "words"),
    [
        ([], ValueError, "needs at least one case"),
        ([{"input": {"a": 1}}], ValueError, "needs an 'output' to score, or 'expected' values"),
        ([{"inputs": {"a": 1}, "output": "x"}], ValueError, "unknown key(s) 'inputs'"),
        ([{"output": "x"}], ValueError, "a case has no 'input'"),
        ([{"input": "text", "output": "x"}], ValueError, "'input' must be a dict"),
        ([{"input": {}, "output": "x", "expected": "x"}], ValueError, "'expected' must be a dict"),
        ([42], ValueError, "each case must be a dspy.Example or a dict"),
        ({"input": {}, "output": "x"}, TypeError, "takes a list of cases"),
        ([dspy.Example(ticket="x", label="y")], ValueError, "with_inputs"),
    ],
)
def test_bad_examples_are_clear_errors(metrics_dir, examples, error, words):
    with pytest.raises(error) as caught:
        check_contract(metrics_dir / "exact_match.py", examples)
    assert words in str(caught.value)


def test_the_check_does_not_log_the_adapters_failure_warnings(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="skynet_dspy"):
        report = check_contract(returning(tmp_path, "0.8"), [CASE])
    assert not report.ok
    assert not [record for record in caplog.records if record.name == "skynet_dspy"]
    # the check's filter is gone after the check; the redacting filter stays
    assert [type(f).__name__ for f in logging.getLogger("skynet_dspy").filters] == ["RedactingFilter"]


def test_the_report_reads_as_text(metrics_dir, tmp_path):
    report = check_contract(metrics_dir / "exact_match.py", TICKETS)
    text = str(report)
    assert text.splitlines()[0] == f"Contract check of {metrics_dir / 'exact_match.py'} on 3 cases"
    for name in CORE_ITEMS:
        assert f"[ ok ] {name}" in text
    assert "case 1, case 2's expected values as output" in text and "Expected 'billing', got 'bug'." in text
    assert text.splitlines()[-1] == "The contract holds."
    assert max(len(line) for line in text.splitlines()) <= 120

    broken = str(check_contract(returning(tmp_path, "0.8"), [CASE]))
    assert "[FAIL] Metric return value" in broken
    assert broken.splitlines()[-1] == "The contract is broken: 1 item(s) failed (Metric return value)."


def test_the_report_renders_as_an_html_table_with_escaping(tmp_path):
    path = write(tmp_path, """
        def score(input, output, expected=None):
            raise ValueError("<script>alert('x')</script> & more")
        """)
    report = check_contract(path, [CASE])
    page = report._repr_html_()
    assert page.startswith("<div>") and "<table>" in page and "</table>" in page
    assert re.search(r"<th[^>]*>item</th><th[^>]*>status</th><th[^>]*>message</th>", page)
    assert page.count("<tr>") >= len(report.items) + 1
    assert "<script>" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; more" in page
    assert "The contract is broken" in page


def test_items_and_statuses_are_plain_values():
    item = CheckItem("Metric loads", "warning", "m")
    assert item.passed and not CheckItem("x", "failed", "m").passed and not CheckItem("x", "not run", "m").passed
    report = ContractReport("m", [item, CheckItem("Named scores", "not run", "skipped")])
    assert report.ok and report.item("Named scores").message == "skipped"
    with pytest.raises(KeyError, match="no check item named 'Nope'"):
        report.item("Nope")


def test_expected_values_with_more_than_the_output_get_a_hint_and_output_fields_fixes_it(metrics_dir):
    examples = [
        dspy.Example(ticket="charged twice", label="billing", note="refund due").with_inputs("ticket"),
        dspy.Example(ticket="crash", label="bug", note="settings page").with_inputs("ticket"),
    ]
    report = check_contract(metrics_dir / "exact_match.py", examples)
    item = report.item("Perfect output scores highest")
    assert item.status == WARNING
    assert "hold 2 fields (label, note)" in item.message and "output_fields=[...]" in item.message

    fixed = check_contract(metrics_dir / "exact_match.py", examples, output_fields=["label"])
    assert fixed.item("Perfect output scores highest").status == PASSED, fixed
    assert [call.output for call in fixed.calls if call.role == "perfect"] == ["billing", "bug"]


def test_a_given_metric_gets_the_line_that_raised_and_is_left_unchanged(tmp_path):
    path = write(tmp_path, """
        def score(input, output, expected=None):
            return 1.0 / 0, {"feedback": "x"}
        """)
    metric = skynet_dspy.load_metric(path)
    scorer, info = metric.scorer, metric.info
    report = check_contract(metric, [CASE])
    assert "ZeroDivisionError" in report.item("Metric return value").message
    assert "metric.py, line 3: `return 1.0 / 0, {\"feedback\": \"x\"}`" in report.item("Metric return value").message
    assert metric.scorer is scorer and metric.info == info
    # the check neither closed the given metric nor changed what it reports to an optimizer
    after = metric.score(CASE["input"], CASE["output"], CASE["expected"])
    assert after.failure == "exception" and after.feedback == (
        "Not scored: the metric raised ZeroDivisionError while scoring this output.")
    assert "line 3" in after.detail
    metric.close()


def test_a_metric_that_scores_right_and_wrong_outputs_alike_is_warned_about(tmp_path):
    report = check_contract(returning(tmp_path, '(0.5, {"feedback": "fine"})'), TICKETS)
    item = report.item("Perfect output scores highest")
    assert item.status == WARNING and report.ok
    assert "every output tried, the perfect ones included, scores 0.5" in item.message
    assert "score does not seem to tell a right output from a wrong one" in item.message
    assert "output_fields" not in item.message  # one label field: no shape hint


def test_output_fields_naming_a_column_the_cases_lack_skips_the_perfect_output_with_a_note(metrics_dir):
    # issue 15 item 4: an output field without expected values is unlabelled, not an error
    cases = [{"input": {"t": 1}, "expected": {"label": "a", "id": 7}}]
    report = skynet_dspy.check_contract(metrics_dir / "exact_match.py", cases, output_fields="lable")
    item = report.item("Perfect output scores highest")
    assert item.status == NOT_RUN and item.message.startswith("skipped: ")
    assert "output fields lable" in item.message and "no perfect output to try" in item.message
    assert report.calls == []  # no output given, and nothing labelled to build one from
    # with nothing to score at all, the check does not pass: it says why and names the likely typo
    returned = report.item("Metric return value")
    assert returned.status == FAILED and not report.ok
    assert "no call could be made" in returned.message and "did you mean 'label'?" in returned.message


def test_unlabelled_output_fields_use_given_outputs_and_fill_only_labelled_fields(tmp_path):
    path = write(tmp_path, """
        def score(input, output, expected=None):
            right = output["answer"] == expected["answer"]
            return float(right), {"feedback": f"fields {sorted(output)}"}
        """)
    cases = [
        {"input": {"q": "2+2?"}, "output": {"answer": "4", "confidence": 0.9}, "expected": {"answer": "4"}},
        {"input": {"q": "3+3?"}, "output": {"answer": "7", "confidence": 0.2}, "expected": {"answer": "6"}},
    ]
    report = check_contract(path, cases, output_fields=["answer", "confidence"])
    assert report.ok, report
    given = [call for call in report.calls if call.role == "given"]
    assert [call.output for call in given] == [case["output"] for case in cases]  # used as given
    assert [call.result.score for call in given] == [1.0, 0.0]
    assert given[0].result.feedback == "fields ['answer', 'confidence']"
    # the perfect-output probe is shaped like the output (a dict) and fills only the labelled field
    perfect = [call for call in report.calls if call.role == "perfect"]
    assert [call.output for call in perfect] == [{"answer": "4"}, {"answer": "6"}]
    assert [call.result.score for call in perfect] == [1.0, 1.0]
    assert report.item("Perfect output scores highest").status == PASSED
