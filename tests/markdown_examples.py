"""Tested documentation: every ```python block of README.md and docs/**/*.md is a test (see docs/development.md).

A pytest plugin, registered by tests/conftest.py (`pytest_plugins`), so its hooks also see README.md at the root.

pytest-markdown-docs collects the blocks (```python notest ones are left out; tests/docs/test_examples.py
compiles those). Each block runs as a user runs it from the repository root, against the scripted loopback
model server: OPENAI_API_BASE and OPENAI_API_KEY point LiteLLM's "openai/..." models at it, as a user's
environment points them at the provider. The block runs in a temporary folder where examples/ is linked, so
files it writes (results.csv, a judge cache, mlflow.db) stay out of the checkout.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
_server: Any = None


def is_documentation(path: Path) -> bool:
    """README.md and every Markdown page of the site."""
    return path.suffix == ".md" and (path == ROOT / "README.md" or DOCS in path.parents)


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if is_documentation(file_path) and not parent.config.option.markdowndocs:  # --markdown-docs collects it itself
        from pytest_markdown_docs.plugin import MarkdownTextFile

        return MarkdownTextFile.from_parent(parent, path=file_path)
    return None


def scripted_model_url() -> str:
    """The base URL of this process's scripted model server, started on first use."""
    global _server
    if _server is None:
        from skynet_dspy.devserver import scripted_server

        _server = scripted_server()
    return str(_server.url)


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _server is not None:
        _server.stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    from pytest_markdown_docs.plugin import MarkdownInlinePythonItem

    if not isinstance(item, MarkdownInlinePythonItem):
        return (yield)
    import dspy

    from skynet_dspy._core import context
    from skynet_dspy._judge import judge

    folder = Path(tempfile.mkdtemp(prefix="skynet-dspy-example-"))
    (folder / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    saved_env = {name: os.environ.get(name) for name in ("OPENAI_API_BASE", "OPENAI_API_KEY")}
    saved_cwd, saved_cache = os.getcwd(), dspy.cache
    os.environ["OPENAI_API_BASE"] = scripted_model_url()
    os.environ["OPENAI_API_KEY"] = "sk-local-docs-example"
    dspy.configure_cache(enable_disk_cache=False)  # the scripted answers never reach the user's DSPy cache
    os.chdir(folder)
    try:
        return (yield)
    finally:
        os.chdir(saved_cwd)
        shutil.rmtree(folder, ignore_errors=True)
        dspy.cache = saved_cache
        dspy.configure(lm=None)
        judge._default, context._default_llm = None, None  # what a block set with configure_llm()
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
