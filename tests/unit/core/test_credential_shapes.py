"""Credential names and value shapes v0.3 missed (issue 31, finding 9), each through the public API: kept from a
metric's worker processes, masked in feedback, refused in RayCluster(runtime_env=...)."""

from __future__ import annotations

import pytest
from support import write_metric

import skynet_dspy

JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJjaS1qb2ItNDIiLCJuYW1lIjoiQ0kifQ.c2lnbmF0dXJlLW9mLXRoZS1qb2I"
PEM = ("-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAq7BFUpkGp3+LQmlQ\nYm9ndXMta2V5LWZvci10ZXN0cw==\n"
       "-----END RSA PRIVATE KEY-----")

# (variable, value, the part of the value that must never show)
BY_NAME = [
    ("MYSQL_PWD", "mysql-canary-pw-1", "mysql-canary-pw-1"),
    ("SSHPASS", "sshpass-canary-2", "sshpass-canary-2"),
    ("GPG_PASSPHRASE", "gpg canary phrase 3", "gpg canary phrase 3"),
    ("CI_JOB_JWT", "ci-job-jwt-canary-4", "ci-job-jwt-canary-4"),
    ("AZURE_STORAGE_CONNECTION_STRING", "DefaultEndpointsProtocol=https;AccountName=acct5;EndpointSuffix=x",
     "AccountName=acct5"),
]
BY_SHAPE = [  # under a plain name: the value's shape says it is a credential
    ("APP_SETTING_JWT_SHAPE", JWT, JWT),
    ("APP_SETTING_AZURE", "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=azkey+canary/6==;",
     "azkey+canary/6"),
    ("APP_SETTING_PEM", PEM, "MIIEowIBAAKCAQEAq7BFUpkGp3"),
    ("APP_SETTING_ODBC", "Server=db.local;Database=app;User Id=app;Password=odbc-canary-7;", "odbc-canary-7"),
]
ALL = BY_NAME + BY_SHAPE

ENV_METRIC = """
import os

def score(input, output, expected=None):
    present = sorted(name for name in input["names"] if name in os.environ)
    return (1.0, {"feedback": "present: " + ",".join(present) + " echo: " + input["echo"]})
"""


@pytest.mark.parametrize(("name", "value", "secret"), ALL, ids=[name for name, _, _ in ALL])
def test_a_credential_is_kept_from_workers_masked_and_refused_for_ray(tmp_path, monkeypatch, name, value, secret):
    monkeypatch.setenv(name, value)
    path = write_metric(tmp_path, ENV_METRIC)
    with skynet_dspy.load_metric(path, workers=1) as metric:
        result = metric.score({"names": [name, "PATH"], "echo": value}, "x")
    assert result.ok, result.detail
    assert result.feedback.startswith("present: PATH echo: "), result.feedback  # the worker never had it
    assert secret not in result.feedback and "***" in result.feedback  # masked where the metric wrote it
    with pytest.raises(ValueError, match="credential") as refused:
        skynet_dspy.RayCluster(runtime_env={"env_vars": {name: value}})
    assert secret not in str(refused.value)


def test_plain_settings_and_the_working_folder_are_not_credentials(tmp_path, monkeypatch):
    monkeypatch.setenv("PWD", str(tmp_path))
    monkeypatch.setenv("OLDPWD", "/home/someone/projects")
    monkeypatch.setenv("CACHE_BYPASS", "enabled-for-tests")
    path = write_metric(tmp_path, ENV_METRIC)
    with skynet_dspy.load_metric(path, workers=1) as metric:
        result = metric.score({"names": ["PWD", "OLDPWD", "CACHE_BYPASS"], "echo": "/home/someone/projects"}, "x")
    assert result.feedback == "present: CACHE_BYPASS,OLDPWD,PWD echo: /home/someone/projects"
    skynet_dspy.RayCluster(runtime_env={"env_vars": {"OLDPWD": "/home/someone/projects"}})
