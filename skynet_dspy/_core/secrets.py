"""Keeping credentials out of every error, log line, feedback text, repr, report and file the package writes.

Masked: environment values whose name says they hold a credential (read when redacting; `env_credential`), every
key given to the package (`register`) and its escaped forms, and common key shapes by pattern (`_SHAPES`); the
rules are docs/safe-output.md's. Callers redact before escaping. This module imports nothing from the package.
"""

from __future__ import annotations

import base64
import html
import json
import os
import re
import threading
from typing import Any

MASK = "***"
MIN_LENGTH = 4  # a given or environment credential is masked (and kept from workers) from this many characters

# The environment-variable rules (docs/safe-output.md): a secret-named variable holds a credential from
# MIN_LENGTH characters; a key/token/auth-named one unless its value is plainly a setting (true/false, yes/no,
# on/off, a number) or its name ends in a word naming a setting about the credential (_MODE, _TYPE, _FILE, ...);
# "true" and "false" are never masked in text: masking them would break every JSON document the package prints.
_SECRET_NAME = re.compile(
    r"SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|CONNECTION_?STRING|(?:^|_)PASS(?:$|_)|(?<!BY)PASS$|.+_PWD(?:$|_)",
    re.IGNORECASE,
)
_KEY_NAME = re.compile(r"KEY|TOKEN|COOKIE|WEBHOOK|DSN|JWT|AUTH(?!OR)|(?:^|_)PAT(?:$|_)", re.IGNORECASE)
_SETTING = re.compile(r"\s*(?:true|false|yes|no|on|off|[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?)\s*",
                      re.IGNORECASE)
_SETTING_NAME = re.compile(
    r"_(?:MODE|TYPE|METHOD|SCHEME|PROVIDER|BACKEND|STRATEGY|LEVEL|FILE|PATH|DIR|ENABLED|DISABLED)$", re.IGNORECASE
)
_NEVER_MASKED = frozenset({"true", "false"})


def _basic(found: re.Match[str]) -> str:
    """'Basic ***' for a Basic credential (base64 of user:password); other words after 'Basic' are kept."""
    try:
        decoded = base64.b64decode(found[1], validate=True)
    except ValueError:  # not base64 (binascii.Error is a ValueError)
        return found[0]
    return "Basic " + MASK if b":" in decoded else found[0]


# The key shapes: (pattern, replacement, whether a match also marks a whole environment value as a credential:
# distinctive enough never to be part of a path or a setting, unlike "sk-" in /opt/sk-toolkit/bin).
_SHAPES: tuple[tuple[re.Pattern[str], Any, bool], ...] = (
    (re.compile(r"\bsk-[A-Za-z0-9_\-]{8,}"), MASK, False),  # OpenAI/Anthropic/... style keys: sk-..., sk-ant-...
    (re.compile(r"\bBearer\s+[A-Za-z0-9._~+/=\-]{6,}"), "Bearer " + MASK, False),
    # HTTP basic auth, base64 of user:password (what a server echoing the Authorization header shows)
    (re.compile(r"\bBasic\s+([A-Za-z0-9+/]{6,}={0,2})"), _basic, False),
    # ?api_key=... &key=... &token=... in a URL
    (
        re.compile(
            r"([?&](?:api[_-]?key|key|token|access[_-]?token|secret|password|passwd|sig|signature)=)[^&#\s'\"<>]+",
            re.IGNORECASE,
        ),
        r"\1" + MASK,
        False,
    ),
    # scheme://user:password@host (the user may be empty: redis://:password@host)
    (
        re.compile(r"(\b[A-Za-z][A-Za-z0-9+.\-]*://)([^/\s:@'\"<>]*):[^/\s@'\"<>]+@"),
        lambda found: f"{found[1]}{MASK if found[2] else ''}:{MASK}@",
        True,
    ),
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), MASK, True),
    # GitHub tokens (ghp_, gho_, ghu_, ghs_, ghr_, github_pat_), Slack tokens (xoxb-, xoxp-, ...) and webhooks
    (re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})"), MASK, True),
    (re.compile(r"\bxox[abposr]-[A-Za-z0-9\-]{10,}"), MASK, True),
    (re.compile(r"(hooks\.slack\.com/services/)[A-Za-z0-9/]+"), r"\1" + MASK, True),
    (re.compile(r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]*"), MASK, True),  # JWTs
    # connection strings: AccountKey=... (Azure), Password=... / Pwd=... (ODBC, ADO.NET, libpq key=value)
    (re.compile(r"\b((?:AccountKey|SharedAccessKey|Password|Pwd)\s*=\s*)[^;&\s'\"<>]+", re.IGNORECASE), r"\1" + MASK,
     True),
    (re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----(?:[\s\S]*?-----END [A-Z0-9 ]*PRIVATE KEY-----|[\s\S]*)"), MASK,
     True),
)
# The shapes that mark a whole environment value as holding a credential (a bare sk- key only as the whole value).
_VALUE_SHAPES = (re.compile(r"^\s*sk-[A-Za-z0-9_\-]{16,}\s*$"), *(pattern for pattern, _, whole in _SHAPES if whole))


_lock = threading.Lock()
_given: set[str] = set()
_env_names: tuple[str, ...] = ()
_env_values: tuple[str | None, ...] = ()
_env_size = -1
_NOTHING = re.compile(r"(?!x)x")  # the pattern when no credential is known: matches nothing
_literal: re.Pattern[str] | None = None


def is_credential_name(name: str) -> bool:
    """True when an environment variable's (or a setting's) name suggests it holds a credential."""
    return bool(_SECRET_NAME.search(name) or _KEY_NAME.search(name))


def env_credential(name: str, value: str | None) -> bool:
    """True when the environment variable `name`=`value` holds a credential by its name (the rules above):
    a secret-named one from MIN_LENGTH characters, a key/token/auth-named one unless its value is a setting."""
    if not value or len(value.strip()) < MIN_LENGTH:
        return False
    if _SECRET_NAME.search(name):
        return True
    return bool(_KEY_NAME.search(name)) and not _SETTING.fullmatch(value) and not _SETTING_NAME.search(name)


def register(secret: object) -> None:
    """Remember a key given to the package so redact() masks it, and its escaped forms, wherever it appears."""
    global _literal
    if not isinstance(secret, str) or len(secret) < MIN_LENGTH:
        return
    with _lock:
        if secret not in _given:
            _given.add(secret)
            _literal = None


def _variants(secret: str) -> set[str]:
    forms = {
        secret, repr(secret)[1:-1], json.dumps(secret)[1:-1], html.escape(secret), html.escape(secret, quote=False)
    }
    return {form for form in forms if form}


def _env_changed() -> bool:
    """Whether the environment may hold other credentials than when the pattern was built (cheap to ask)."""
    if len(os.environ) != _env_size:
        return True
    return bool(_env_names) and tuple(map(os.environ.get, _env_names)) != _env_values


def _pattern() -> re.Pattern[str]:
    global _literal, _env_names, _env_values, _env_size
    if _literal is not None and not _env_changed():
        return _literal
    with _lock:
        names = tuple(name for name in os.environ if is_credential_name(name))
        values = tuple(os.environ.get(name) for name in names)
        secrets = set(_given)
        secrets.update(
            value for name, value in zip(names, values, strict=True)
            if value and env_credential(name, value) and value.strip().lower() not in _NEVER_MASKED
        )
        forms = {form for secret in secrets for form in _variants(secret)}
        if forms:
            ordered = sorted(forms, key=len, reverse=True)  # longest first, so a key inside a longer one is whole
            _literal = re.compile("|".join(map(re.escape, ordered)))
        else:
            _literal = _NOTHING
        _env_names, _env_values, _env_size = names, values, len(os.environ)
        return _literal


# Every key shape above contains one of these: text holding none of them is not scanned for shapes.
_SHAPE_HINTS = (
    "sk-", "Bearer", "Basic", "=", "@", "AKIA", "ASIA", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "xox",
    "hooks.slack.com", "eyJ", "PRIVATE KEY",
)


def redact(text: str) -> str:
    """`text` with every credential it holds replaced by '***'."""
    if not text:
        return text
    literal = _pattern()
    if literal is not _NOTHING:
        text = literal.sub(MASK, text)
    if any(hint in text for hint in _SHAPE_HINTS):  # not one regex: re tries each at every position
        for pattern, replacement, _ in _SHAPES:
            text = pattern.sub(replacement, text)
    return text


def looks_like_credential(value: str) -> bool:
    """True when an environment value holds a credential of a distinctive shape (a URL with a password, an AWS
    key id, a GitHub or Slack token, a webhook, a bare sk- key, a JWT, a PEM private key, a connection string's
    AccountKey= or Password=)."""
    return any(pattern.search(value) for pattern in _VALUE_SHAPES)


def credential_free_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """A copy of the environment for metric workers, without credentials: a variable that holds one by its name
    (`env_credential`: MY_SERVICE_PASSWORD=hunter; TOKENIZERS_PARALLELISM=false is a setting and stays), and a
    variable whose value holds one (DATABASE_URL=postgres://app:PASSWORD@db, HTTPS_PROXY=http://u:PASSWORD@proxy)."""
    source = os.environ if environ is None else environ
    return {
        name: value for name, value in source.items()
        if not (env_credential(name, value) or looks_like_credential(value))
    }


class RedactedDict(dict[Any, Any]):
    """A dict whose repr and str mask credentials: for settings the package hands on (a model's kwargs)."""

    def __repr__(self) -> str:
        return redact(dict.__repr__(self))

    __str__ = __repr__
