"""An endpoint's credentials (issue 14): the key and the secrets inside api_base stay out of every repr."""

from __future__ import annotations

import uuid

import dspy

from skynet_dspy._core import secrets
from skynet_dspy._judge import Judge
from skynet_dspy._judge.endpoints import endpoint


def test_settings_and_reprs_mask_a_password_and_a_query_key_in_api_base():
    password, query, sig, key = (uuid.uuid4().hex[:14] for _ in range(4))
    base = f"http://alice:{password}@example.test/v1?key={query}&sig={sig}&region=eu"
    judge = Judge(metric_lm=dspy.LM("openai/gpt-4o-mini", api_base=base, api_key=key),
                  reflection_lm={"model": "openai/gpt-4o", "api_base": base, "api_key": key[:5]}, cache=False)
    for endpoint_ in (judge.metric_lm, judge.reflection_lm):
        for text in (repr(endpoint_.settings), str(endpoint_.settings), repr(endpoint_), repr(judge)):
            assert not any(secret in text for secret in (password, query, sig, key, key[:5])), text
        assert endpoint_.settings["api_base"] == base and endpoint_.litellm_kwargs()["api_base"] == base
    assert "region=eu" in repr(judge.metric_lm.settings)
    # registered: masked wherever else they turn up, even on their own
    assert secrets.redact(f"{password} {query} {sig}") == "*** *** ***"


def test_a_percent_encoded_password_is_masked_in_both_forms():
    raw = "p%40" + uuid.uuid4().hex[:10]
    endpoint({"model": "openai/gpt-4o-mini", "api_base": f"http://u:{raw}@h/v1"}, "metric model")
    assert secrets.redact(raw) == "***" and secrets.redact(raw.replace("%40", "@")) == "***"
