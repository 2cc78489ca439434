"""Redaction (issue 14): what redact() masks, the redacting log filter, and cuts that never keep half a key."""

from __future__ import annotations

import html
import json
import logging
import uuid

import pytest

from skynet_dspy._core import secrets
from skynet_dspy._core.logs import RedactingFilter, get_logger
from skynet_dspy._core.types import Outcome, Result
from skynet_dspy._core.values import clip_words, shorten


def _key(prefix: str = "") -> str:
    return prefix + uuid.uuid4().hex + uuid.uuid4().hex[:8]


@pytest.mark.parametrize("name", ["AWS_SECRET_ACCESS_KEY", "AZURE_OPENAI_KEY", "github_token", "DB_PASSWD",
                                  "MY_PASSWORD", "GOOGLE_CREDENTIALS", "Stripe_Secret", "GH_PAT", "DB_PASS",
                                  "BASIC_AUTH", "SLACK_WEBHOOK_URL", "SENTRY_DSN", "SESSION_COOKIE"])
def test_environment_values_under_credential_names_are_masked_when_set_after_import(monkeypatch, name):
    value = _key()
    assert value in secrets.redact(f"x {value} y")  # not yet in the environment: nothing to mask
    monkeypatch.setenv(name, value)
    assert secrets.redact(f"x {value} y") == "x *** y"


def test_short_environment_values_are_settings_not_keys(monkeypatch):
    monkeypatch.setenv("USE_KEY_CACHE", "true")
    assert secrets.redact("true") == "true"


@pytest.mark.parametrize("length", [4, 5, 6, 7])
def test_given_keys_are_masked_from_four_characters(length):
    key = "~" + uuid.uuid4().hex[: length - 1]
    secrets.register(key)
    assert secrets.redact(f"key={key}!") == "key=***!"
    secrets.register("~ab")  # three characters: too short to be told from ordinary text
    assert secrets.redact("~ab") == "~ab"


def test_escaped_forms_of_a_known_key_are_masked():
    key = "Qk'&<>\"" + uuid.uuid4().hex
    secrets.register(key)
    for form in (key, repr(key), json.dumps(key), html.escape(key), html.escape(key, quote=False), repr([key])):
        assert key[7:] not in secrets.redact(form), form


@pytest.mark.parametrize(("text", "expected"), [
    ("use sk-proj-abcdefghijklmnop now", "use *** now"),
    ("Authorization: Bearer abc.def-ghi_jkl", "Authorization: Bearer ***"),
    ("Authorization: Basic YWxpY2U6UHc5eFEyekxtbg==", "Authorization: Basic ***"),
    ("Basic formatting is fine", "Basic formatting is fine"),
    ("GET /v1?api_key=abc123&x=1", "GET /v1?api_key=***&x=1"),
    ("https://bob:hunter22@db.example.com/x", "https://***:***@db.example.com/x"),
    ("id AKIAABCDEFGHIJKLMNOP here", "id *** here"),
    ("redis://:hunter2redis@cache:6379/0", "redis://:***@cache:6379/0"),
    ("token ghp_abcdefghijklmnopqrstuvwx12 used", "token *** used"),
    ("pat github_pat_11ABCDEFG0123456789_abcdefghij", "pat ***"),
    ("slack xoxb-1234567890-abcdefghij", "slack ***"),
    ("https://hooks.slack.com/services/T00/B00/abcdef", "https://hooks.slack.com/services/***"),
])
def test_key_shapes_are_masked_without_being_known(text, expected):
    assert secrets.redact(text) == expected


def test_the_log_filter_masks_every_record_of_the_package(monkeypatch):
    key = _key()
    monkeypatch.setenv("SOME_SERVICE_TOKEN", key)
    logger = get_logger()
    assert sum(isinstance(f, RedactingFilter) for f in logger.filters) == 1
    assert get_logger() is logger and sum(isinstance(f, RedactingFilter) for f in logger.filters) == 1
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record)

    handler = Keep()
    logger.addHandler(handler)
    try:
        try:
            raise ValueError(f"refused {key}")
        except ValueError:
            logger.error("calling with %s failed", key, exc_info=True, stack_info=True)
    finally:
        logger.removeHandler(handler)
    (record,) = seen
    assert record.getMessage() == "calling with *** failed" and record.args is None
    assert key not in logging.Formatter().format(record)
    assert "refused ***" in record.exc_text and key not in (record.stack_info or "")


def test_result_and_outcome_reprs_are_masked_but_keep_the_values():
    key = _key("sk-")
    result = Result(1.0, "fine", None, {"token": key}, None, f"detail {key}")
    assert key not in repr(result) and "'token': '***'" in repr(result)
    assert result.extra["token"] == key  # the user's own value, kept
    assert key not in repr(Outcome(detail=key, judge_detail=key))


def test_a_cut_never_keeps_part_of_a_word():
    key = uuid.uuid4().hex * 3  # unknown to redaction, as an env key is in a worker process
    for text in (f"{'a' * 40}{key}{'b' * 40}", f"before {key} after " * 5):
        for shown in (shorten(text, 60), shorten((text, {"feedback": "x"})), clip_words(text, 50)):
            assert "..." in shown or "characters>" in shown  # it was cut
            assert not any(key[i:i + 8] in shown for i in range(len(key) - 7)), shown
    assert shorten("x" * 1000) == "<a str of 1,000 characters>"
    assert shorten("hello world " * 30).startswith("'hello world hello world")
    assert clip_words("hello wonderful world", 14) == "hello ..."


def test_redacted_dict_keeps_its_values_and_masks_its_repr():
    key = _key()
    secrets.register(key)
    kwargs = secrets.RedactedDict(api_key=key, temperature=0.2)
    assert kwargs["api_key"] == key and {**kwargs}["api_key"] == key
    assert key not in repr(kwargs) and key not in str(kwargs) and key not in f"{kwargs}"


@pytest.mark.parametrize("name", ["PATH", "GIT_AUTHOR_NAME", "PASSAGE_DIR", "PATTERN", "HOME"])
def test_names_that_only_look_like_credential_names_are_settings(name):
    assert not secrets.is_credential_name(name)


# -- the environment rules (docs/safe-output.md): names and values ------------------------------------------


@pytest.mark.parametrize("name", ["MY_SERVICE_PASSWORD", "DB_PASSWD", "APP_SECRET", "GCP_CREDENTIALS", "SMTP_PASS"])
@pytest.mark.parametrize("value", ["hunt3r", "a1b2", "123456", "yes-please"])
def test_a_secret_named_variable_is_masked_and_kept_from_workers_from_four_characters(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    assert secrets.redact(f"x {value} y") == "x *** y"
    assert name not in secrets.credential_free_environment()


@pytest.mark.parametrize("name", ["SERVICE_API_KEY", "GH_TOKEN", "PROXY_AUTH", "SESSION_COOKIE", "SENTRY_DSN"])
def test_a_key_named_variable_is_masked_from_four_characters(monkeypatch, name):
    value = "k" + uuid.uuid4().hex[:5]  # six characters
    monkeypatch.setenv(name, value)
    assert secrets.redact(f"x {value} y") == "x *** y"
    assert name not in secrets.credential_free_environment()


@pytest.mark.parametrize("value", ["true", "False", "yes", "NO", "on", "off", "4096", "-1", "0.25", "1e3", " 12 "])
def test_a_key_named_variable_holding_a_setting_is_neither_masked_nor_kept_from_workers(monkeypatch, value):
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", value)
    monkeypatch.setenv("MAX_TOKENS", value)
    assert secrets.redact(f"x {value} y") == f"x {value} y"
    environment = secrets.credential_free_environment()
    assert environment["TOKENIZERS_PARALLELISM"] == value and environment["MAX_TOKENS"] == value


def test_true_and_false_are_never_masked_in_text_but_a_secret_named_one_stays_out_of_workers(monkeypatch):
    monkeypatch.setenv("SKIP_SECRET_SCAN", "true")
    assert secrets.redact('{"ok": true}') == '{"ok": true}'
    assert "SKIP_SECRET_SCAN" not in secrets.credential_free_environment()


def test_three_characters_are_too_short_to_be_told_from_text(monkeypatch):
    monkeypatch.setenv("MY_SERVICE_PASSWORD", "abc")
    assert secrets.redact("abc abcd") == "abc abcd"


def test_the_rules_are_one_function_and_the_name_test_keeps_its_meaning():
    assert secrets.is_credential_name("judge_api_key") and secrets.is_credential_name("MY_SERVICE_PASSWORD")
    assert not secrets.is_credential_name("GIT_AUTHOR_NAME") and not secrets.is_credential_name("PASSAGE_DIR")
    assert secrets.env_credential("MY_SERVICE_PASSWORD", "hunt3r")
    assert not secrets.env_credential("MY_SERVICE_PASSWORD", "abc")
    assert not secrets.env_credential("GIT_AUTHOR_NAME", "Ada Lovelace")
    assert not secrets.env_credential("HOME", "/root")
    assert secrets.env_credential("API_KEY", "sk-x") and not secrets.env_credential("API_KEY", "on")


@pytest.mark.parametrize("name", ["RAY_AUTH_MODE", "PROXY_AUTH_TYPE", "SSL_KEY_FILE", "API_KEY_PROVIDER"])
def test_a_key_named_variable_that_names_a_setting_about_the_credential_is_a_setting(monkeypatch, name):
    monkeypatch.setenv(name, "token")  # Ray sets RAY_AUTH_MODE=token: "token" must stay readable everywhere
    assert secrets.redact('{"prompt_tokens": 3}') == '{"prompt_tokens": 3}'
    assert secrets.credential_free_environment()[name] == "token"


def test_a_secret_named_variable_is_masked_even_when_its_name_ends_like_a_setting(monkeypatch):
    monkeypatch.setenv("DB_PASSWORD_FILE", "hunter")  # a secret-named variable is a secret whatever its ending
    assert secrets.redact("x hunter y") == "x *** y"
