"""check_contract's report with hostile feedback and named-score names: its HTML holds no live markup, its text
no raw control character, its JSON is valid UTF-8; a lone surrogate never loses it."""

from __future__ import annotations

import json
import re

from support import write_metric

import skynet_dspy

METRIC = '''
def score(input, output, expected=None):
    text = input["text"]
    return 0.5, {"feedback": "said: " + text, "scores": {text[:30]: 1.0}}
'''
TEXTS = ["<img src=x onerror=alert(1)>", "<script>alert(2)</script>", "\x1b]52;c;eA==\x07\x1b[2K\rThe contract holds.",
         "half \ud83d", "$$ {{{{", "=HYPERLINK(1)"]


def test_every_form_of_the_report_is_safe(tmp_path):
    cases = [{"input": {"text": text}, "output": "x", "expected": None} for text in TEXTS]
    report = skynet_dspy.check_contract(str(write_metric(tmp_path, METRIC)), cases, max_cases=None)
    html = report._repr_html_()
    tags = {tag.lower() for tag in re.findall(r"<\s*/?\s*([a-zA-Z][a-zA-Z0-9]*)", html)}
    assert tags <= {"div", "p", "b", "span", "table", "thead", "tbody", "tr", "th", "td", "details", "summary"}, tags
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in html
    html.encode("utf-8")
    text = str(report)
    text.encode("utf-8")
    assert all(ord(char) >= 0x20 or char in "\n\t" for char in text)
    assert "\\x1b]52;c;eA==\\x07" in text and "\\ud83d" in text
    assert text.rstrip().splitlines()[-1] == report.verdict
    data = json.loads(report.to_json())
    assert len(data["calls"]) >= len(TEXTS)
    report.to_json().encode("utf-8")
