"""The documentation of the options and the API reference hold to the code: the options table in docs/dspy.md
names every load_metric option with Metric's type and default, and the built site shows parameter tables."""

from __future__ import annotations

import html
import inspect
import os
import re
import subprocess
import sys

import pytest
from conftest import ROOT

import skynet_dspy


def _table_rows() -> dict[str, tuple[str, str]]:
    text = (ROOT / "docs" / "dspy.md").read_text()
    section = text[text.index("## load_metric options"):]
    section = section[:section.index("\n## ", 5)] if "\n## " in section[5:] else section
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == 4 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = (cells[1].strip("`").replace("\\|", "|"), cells[2].strip("`"))
    return rows


def test_the_docs_options_table_has_every_option_with_metrics_type_and_default():
    parameters = {name: p for name, p in inspect.signature(skynet_dspy.Metric).parameters.items() if name != "source"}
    rows = _table_rows()
    assert set(rows) == set(parameters)
    for name, (written_type, default) in rows.items():
        assert written_type == str(parameters[name].annotation), name
        assert default == repr(parameters[name].default), name


def test_defaults_shown_by_value_are_the_constants_the_code_uses():
    from skynet_dspy._core.contract import DEFAULT_FEEDBACK_LIMIT, DEFAULT_TIMEOUT

    parameters = inspect.signature(skynet_dspy.Metric).parameters
    assert parameters["timeout"].default == DEFAULT_TIMEOUT
    assert parameters["feedback_limit"].default == DEFAULT_FEEDBACK_LIMIT


@pytest.fixture(scope="module")
def api_page(tmp_path_factory):
    site = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--quiet", "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=900, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stderr
    return (site / "api" / "index.html").read_text()


def _section(page: str, name: str) -> str:
    start = page.index(f'id="skynet_dspy.{name}"')
    end = page.find('<div class="doc doc-object', start + 1)
    return page[start:end if end != -1 else None]


@pytest.mark.parametrize("name, parameters", [
    ("load_metric", ["source", "**options"]),
    ("Metric", ["timeout", "isolation", "workers", "success_threshold"]),
    ("make_evaluator", ["run", "run_isolation", "**metric_options"]),
])
def test_the_built_api_reference_has_a_parameter_table(api_page, name, parameters):
    section = _section(api_page, name)
    assert "<table>" in section and "Parameters" in section
    text = html.unescape(re.sub(r"<[^>]+>", " ", section))
    for parameter in parameters:
        assert re.search(rf"\b{re.escape(parameter.lstrip('*'))}\b", text), parameter


def test_the_api_reference_shows_metrics_timeout_default_by_value(api_page):
    text = html.unescape(re.sub(r"<[^>]+>", "", _section(api_page, "Metric")))
    assert "timeout: float = 60.0" in text
    assert "DEFAULT_TIMEOUT" not in text


def test_the_mipro_extra_brings_optuna_and_the_docs_name_it():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(requirement.startswith("optuna") for requirement in extras["mipro"])
    for page in ("README.md", "docs/dspy.md", "docs/getting-started.md", "docs/troubleshooting.md"):
        assert "[mipro]" in (ROOT / page).read_text(), page
    troubleshooting = (ROOT / "docs" / "troubleshooting.md").read_text()
    assert "MIPROv2 requires optional dependency 'optuna'" in troubleshooting  # the error a user searches for


def test_every_public_name_with_parameters_documents_them_google_style():
    import enum

    undocumented = []
    for name in sorted(set(skynet_dspy.__all__) - {"skynet", "helpers"}):
        value = getattr(skynet_dspy, name)
        if isinstance(value, type) and issubclass(value, (BaseException, enum.Enum)):
            continue  # exceptions take a message; enum members are listed by mkdocstrings
        try:
            parameters = [p for p in inspect.signature(value).parameters if p != "self"]
        except (TypeError, ValueError):
            continue
        doc = inspect.getdoc(value) or ""
        if parameters and "Args:" not in doc and "Attributes:" not in doc:
            undocumented.append(name)
    assert undocumented == []
