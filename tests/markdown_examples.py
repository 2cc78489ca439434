"""Tested documentation: every ```python block of README.md and docs/**/*.md is a test (see docs/development.md).

A pytest plugin, registered by tests/conftest.py (`pytest_plugins`), so its hooks also see README.md at the root.

pytest-markdown-docs collects the blocks (```python notest ones are left out; tests/docs/test_examples.py
compiles those). Each block runs as a user runs it from the repository root, against the scripted loopback
model server: OPENAI_API_BASE and OPENAI_API_KEY point LiteLLM's "openai/..." models at it, as a user's
environment points them at the provider. The block runs in a temporary folder where every file and folder of
the repository root is linked (`like_the_root`), so paths resolve as from the root while the files it writes
(results.csv, a judge cache, mlflow.db) stay out of the checkout.
"""

from __future__ import annotations

import os
import shutil
import sys
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


NOT_LINKED = {".git", ".venv", "build", ".pytest_cache", ".mypy_cache", ".ruff_cache", "__pycache__"}


def like_the_root(folder: Path) -> Path:
    """Link each entry of the repository root into `folder`: a place to run an example "from the root"."""
    for entry in ROOT.iterdir():
        if entry.name not in NOT_LINKED:
            (folder / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    return folder


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


# The environment a block sees is a fresh process's: these are set for it, or unset (an earlier test's MLflow
# experiment, say), and restored after it.
ENVIRONMENT = ("OPENAI_API_BASE", "OPENAI_API_KEY", "MLFLOW_EXPERIMENT_ID", "MLFLOW_TRACKING_URI")


def _mlflow_state(restore: tuple[Any, Any] | None) -> tuple[Any, Any]:
    """MLflow's process-wide (experiment, tracking URI), set to `restore` (None: a fresh process's, no experiment).

    An earlier test in this worker process may have made an experiment active in another store; a block that
    opens its own store would then look for that experiment there. MLflow has no public way to forget it.
    """
    fluent = sys.modules.get("mlflow.tracking.fluent")
    tracking = sys.modules.get("mlflow.tracking._tracking_service.utils")
    if fluent is None or tracking is None:
        return (None, None)
    before = (fluent._active_experiment_id, tracking._tracking_uri)
    fluent._active_experiment_id = None if restore is None else restore[0]
    if restore is not None:
        tracking._tracking_uri = restore[1]
    return before


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    from pytest_markdown_docs.plugin import MarkdownInlinePythonItem

    if not isinstance(item, MarkdownInlinePythonItem):
        return (yield)
    import dspy

    from skynet_dspy._core import context
    from skynet_dspy._judge import judge

    folder = like_the_root(Path(tempfile.mkdtemp(prefix="skynet-dspy-example-")))
    saved_env = {name: os.environ.pop(name, None) for name in ENVIRONMENT}
    saved_cwd, saved_cache, saved_mlflow = os.getcwd(), dspy.cache, _mlflow_state(None)
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
        _mlflow_state(saved_mlflow)
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
