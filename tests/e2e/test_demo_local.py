"""`make demo` against a local model server (SKYNET_DEMO_API_BASE): the loopback server poses as a local model
that LiteLLM has no price for and that answers one request at a time (429 for a second one in flight)."""

from __future__ import annotations

import pytest

from examples import demo
from skynet_dspy.devserver import DevServer
from skynet_dspy.devserver.scripted import ScriptedModel

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def local_run():
    server = DevServer(responder=ScriptedModel(), model_name="my-local-model", max_concurrent=1).start()
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("SKYNET_DEMO_MODEL", "openai/my-local-model")
            patch.setenv("SKYNET_DEMO_API_BASE", server.url)
            patch.delenv("SKYNET_DEMO_REFLECTION_MODEL", raising=False)
            patch.delenv("SKYNET_DEMO_CONCURRENCY", raising=False)
            patch.delenv("OPENAI_API_KEY", raising=False)
            lines: list[str] = []
            result = demo.main(budget=30, seed=0, out=lines.append)
        yield result, "\n".join(lines), server
    finally:
        server.stop()


def test_a_local_model_has_its_time_measured_and_shown_without_a_price(local_run):
    result, printed, _ = local_run
    for evaluation in (result.baseline, result.optimized):
        assert evaluation.run_ms is not None and evaluation.run_ms > 0
        assert evaluation.cost_usd is None
    assert "ms per ticket" in printed and "cost unknown" in printed
    assert "time not measured" not in printed


def test_the_demo_sends_temperature_0_at_a_concurrency_the_server_serves(local_run):
    result, printed, server = local_run
    assert server.requests
    assert all(request.body.get("temperature") == 0 for request in server.requests)
    assert server.rate_limited == 0  # never a second request in flight: no 429, no judge call queued to time out
    assert result.judge_usage.requests > 0 and not result.metric_stats.get("timeout")
    assert "1 request(s) at a time" in printed
