"""Shared fixtures: the loopback model server, a dspy.LM pointed at it, and a clean judge default per test."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy  # noqa: E402
import pytest  # noqa: E402
from redis_support import own_redis, redis_server, redis_url  # noqa: E402, F401 - fixtures: a real redis-server

from skynet_dspy._core import context  # noqa: E402
from skynet_dspy._judge import judge  # noqa: E402
from skynet_dspy.devserver import DevServer  # noqa: E402

pytest_plugins = ["markdown_examples"]  # README.md's and docs/'s ```python blocks run as tests

METRICS = Path(__file__).parent / "metrics"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def server():
    """A fresh loopback OpenAI-compatible server; set `server.responder` to script it."""
    with DevServer(model_name="gpt-4o-mini") as running:
        yield running


@pytest.fixture
def lm(server):
    """A dspy.LM reaching the loopback server through LiteLLM, uncached."""
    return dspy.LM("openai/gpt-4o-mini", api_base=server.url, api_key="local-test-key", cache=False)


@pytest.fixture
def metrics_dir() -> Path:
    return METRICS


@pytest.fixture(autouse=True)
def no_default_models(monkeypatch):
    """Each test starts with no process-default models for llm() (configure_llm), and leaves none behind."""
    monkeypatch.setattr(judge, "_default", None)
    monkeypatch.setattr(context, "_default_llm", None)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """`--dist loadgroup` for pytest 9.2: pytest-xdist 3.8 renames a grouped test's `_nodeid` (test@group), which
    pytest 9.2 no longer reads (a node's id is `_id`), so its groups were spread over workers. Carry the rename over
    (private pytest API, checked against 9.2), so the tests of one group (one local Ray) share one worker."""
    for item in items:
        renamed = item.__dict__.get("_nodeid")
        if isinstance(renamed, str) and renamed != item.nodeid:
            from _pytest.nodeid import coerce_node_id

            item._id = coerce_node_id(renamed)
