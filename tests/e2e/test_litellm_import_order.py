"""LiteLLM imported before skynet_dspy: the package's own paths never wait on LiteLLM's price-list download.

Run in a fresh interpreter (the test process has long imported LiteLLM with the local price list). LiteLLM's
price-list URL points at a loopback server that refuses the import's first fetch and holds every later one
(LiteLLM's background retry) until the script ends. While that fetch hangs, the script runs the package's
paths: a judge metric's llm() call, a measured program run priced in USD, dspy.Evaluate, the contract check.
Had any of them waited on the download, the script would hang until the test's timeout instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT

SCRIPT = textwrap.dedent('''
    import json, os, sys, threading, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    hits, release = [], threading.Event()

    class Prices(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            hits.append(self.headers.get("User-Agent", ""))
            if len(hits) == 1:  # the import's own attempt: refused at once, so LiteLLM retries in the background
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            release.wait(120)  # every later attempt hangs until the package's paths have run

    prices = ThreadingHTTPServer(("127.0.0.1", 0), Prices)
    prices.daemon_threads = True
    threading.Thread(target=prices.serve_forever, daemon=True).start()
    os.environ.pop("LITELLM_LOCAL_MODEL_COST_MAP", None)
    os.environ["LITELLM_MODEL_COST_MAP_URL"] = f"http://127.0.0.1:{prices.server_address[1]}/prices.json"

    import litellm  # before skynet_dspy, as a user's script may

    deadline = time.monotonic() + 60
    while len(hits) < 2 and time.monotonic() < deadline:  # LiteLLM's background retry is now hanging
        time.sleep(0.05)
    hanging = len(hits) == 2

    import dspy
    import skynet_dspy
    from skynet_dspy.devserver import scripted_server

    metric_file = sys.argv[1]
    with open(metric_file, "w") as handle:
        handle.write(
            "from skynet import llm, observation\\n"
            "def score(input, output, expected=None):\\n"
            "    verdict = llm('Answer PASS or FAIL, then one sentence.',\\n"
            "                  input=f\\"Question: {input['ticket']}\\\\nAnswer: {output}\\")\\n"
            "    seen = observation()\\n"
            "    return (1.0 if verdict.startswith('PASS') else 0.0), {'feedback': verdict, 'cost': seen.cost_usd}\\n"
        )
    with scripted_server() as server:
        lm = dspy.LM("openai/gpt-4o-mini", api_base=server.url, api_key="local", cache=False)
        dspy.configure(lm=lm)
        metric = skynet_dspy.load_metric(metric_file, metric_lm=lm)
        devset = [dspy.Example(ticket="The app crashes at start.", label="bug").with_inputs("ticket")]
        evaluation = dspy.Evaluate(devset=devset, metric=metric)(dspy.Predict("ticket -> label"))
        report = skynet_dspy.check_contract(metric_file, [{"input": {"ticket": "x"}, "output": "bug"}], metric_lm=lm)
        score = evaluation.results[0][2]
        print(json.dumps({
            "hanging_during_run": hanging and not release.is_set(),
            # LiteLLM's background retry times out a held fetch after 5 s and tries again (httpx); any other
            # client (DSPy's urllib, the package) asking for the price list would show another user agent
            "fetchers": sorted({agent.split("/")[0] for agent in hits}),
            "setting": os.environ.get("LITELLM_LOCAL_MODEL_COST_MAP"),
            "feedback": score.feedback,
            "program_cost": score.result.extra["cost"],
            "judge_cost": metric.judge_usage.cost_usd,
            "check_ok": report.ok,
        }))
    release.set()
''')


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_litellm_imported_first_never_makes_the_package_wait_on_its_price_download(tmp_path):
    script = tmp_path / "import_litellm_first.py"
    script.write_text(SCRIPT, encoding="utf-8")
    env = {key: value for key, value in os.environ.items() if key != "LITELLM_LOCAL_MODEL_COST_MAP"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "metric.py")],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["hanging_during_run"], found  # every path below ran while LiteLLM's download hung
    assert found["fetchers"] == ["python-httpx"]  # only LiteLLM's own fetch and retries: the package never asked
    assert found["feedback"].startswith("PASS.")
    assert found["program_cost"] > 0 and found["judge_cost"] > 0  # priced from LiteLLM's bundled list
    assert found["check_ok"]
    # import skynet_dspy sets the variable for later imports (metric workers, subprocesses): docs/getting-started.md
    assert found["setting"] == "True"
