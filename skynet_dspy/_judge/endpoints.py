"""A model to call, the one parser of model specs in the package: a LiteLLM model string, a settings dict
{"model", "api_base", "api_key", ...} or a dspy.LM. The key is kept apart, so no repr of settings can show it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

from .._core import secrets

# dspy.LM settings that are DSPy's own or that the judge sets itself: never sent to LiteLLM.
_NOT_SENT = frozenset({"rollout_id", "prompt_cache", "num_retries", "max_retries", "cache", "callbacks"})
_FORMS = ("a LiteLLM model string ('openai/gpt-4o-mini'), a dict {'model': ..., 'api_base': ..., 'api_key': ...} "
          "or a dspy.LM")


def is_credential_setting(name: object) -> bool:
    """Whether a setting's name suggests a credential (`*key*`, `*token*`, ...; not max_tokens): never kept or shown."""
    return not str(name).lower().endswith("tokens") and secrets.is_credential_name(str(name))


def public_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """`settings` without credentials: credential-named settings left out, every header's value hidden."""
    return {name: {str(header): "<hidden>" for header in value}
            if name in ("extra_headers", "headers") and isinstance(value, dict) else value
            for name, value in settings.items() if not is_credential_setting(name)}


class Settings(dict[str, Any]):
    """An endpoint's settings, whose repr masks credentials (credential settings, headers, a key inside api_base)."""

    def __repr__(self) -> str:  # str() too: dict has no __str__ of its own
        return secrets.redact(repr(public_settings(self)))


# Query parameters holding a credential, besides names with KEY, TOKEN, SECRET... in them (`?api_key=`, `&token=`).
_QUERY_NAMES = frozenset({"sig", "signature", "code", "auth"})


def register_url_credentials(url: Any) -> None:
    """Register for redaction a URL's password and credential-like query values, as written and %-decoded."""
    try:
        parts = urlsplit(url) if isinstance(url, str) else None
        found = [parts.password or ""] if parts else []  # as written (urlsplit does not decode it)
    except ValueError:
        return
    pairs = [pair.partition("=") for pair in parts.query.split("&")] if parts else []
    found += [value for name, _, value in pairs if secrets.is_credential_name(unquote(name))
              or unquote(name).lower() in _QUERY_NAMES]
    _register_all(found + [unquote(value.replace("+", " ")) for value in found])


def _register_all(value: Any) -> None:
    """Register for redaction every text in a credential setting (a str, a dict's or list's values)."""
    values = value.values() if isinstance(value, Mapping) else value if isinstance(value, (list, tuple)) else None
    for item in values if values is not None else ():
        _register_all(item)
    secrets.register(value)


class Endpoint:
    """One model: a LiteLLM model string, its settings (without the key) and its key, for one role.

    What `judge.metric_lm` and `judge.reflection_lm` give; its repr and settings never show the key.

    Args:
        model: The LiteLLM model string, e.g. "openai/gpt-4o-mini".
        settings: LiteLLM settings (api_base, temperature, ...); an api_key among them is kept apart.
        role: What the model is for, in messages ("metric model", "reflection model").
        api_key: The key, kept out of every repr.
    """

    __slots__ = ("model", "settings", "role", "_api_key")

    def __init__(self, model: str, settings: Mapping[str, Any], role: str, api_key: str | None = None):
        self.model = model
        self.settings = Settings({k: v for k, v in settings.items() if k != "api_key"})
        for name, value in self.settings.items():  # every credential setting and header is masked wherever written
            if is_credential_setting(name) or name in ("extra_headers", "headers"):
                _register_all(value)
        self.role = role
        self._api_key = api_key
        secrets.register(api_key)
        register_url_credentials(self.settings.get("api_base"))

    @property
    def api_base(self) -> str | None:
        value = self.settings.get("api_base")
        return value if isinstance(value, str) else None

    def litellm_kwargs(self) -> dict[str, Any]:
        """What LiteLLM is called with: the model, its settings and its key."""
        kwargs = {"model": self.model, **self.settings}
        if self._api_key:
            kwargs["api_key"] = self._api_key
        return kwargs

    def describe(self) -> str:
        """'openai/gpt-4o-mini at http://host/v1', with any credential in the URL masked."""
        where = f" at {self.api_base}" if self.api_base else ""
        return secrets.redact(f"{self.model}{where}")

    def __repr__(self) -> str:
        return f"Endpoint({self.describe()!r}, role={self.role!r})"


def is_lm(spec: Any) -> bool:
    """Whether `spec` is a dspy.LM, or anything shaped like one (a `model` string and a `kwargs` mapping)."""
    return isinstance(getattr(spec, "model", None), str) and isinstance(getattr(spec, "kwargs", None), Mapping)


def endpoint(spec: Any, role: str) -> Endpoint | None:
    """The Endpoint for a model given as a string, a settings dict, a dspy.LM or an Endpoint; None stays None."""
    if spec is None:
        return None
    if isinstance(spec, Endpoint):
        return Endpoint(spec.model, spec.settings, role, spec._api_key)
    if isinstance(spec, str):
        if not spec.strip():
            raise ValueError(f"{role} is an empty string; give {_FORMS}")
        return Endpoint(spec.strip(), {}, role)
    if isinstance(spec, Mapping):
        settings = dict(spec)
        model = settings.pop("model", None)
        if not isinstance(model, str) or not model.strip():
            raise ValueError(f"{role} as a dict needs a 'model' string, e.g. {{'model': 'openai/gpt-4o-mini', "
                             f"'api_base': ..., 'api_key': ...}}; got keys {sorted(map(str, spec))}")
        return _from_settings(model.strip(), settings, role)
    if is_lm(spec):
        if not isinstance(getattr(spec, "engine", "auto"), str):
            raise TypeError(f"{role} is a dspy.LM with a custom engine, which LiteLLM cannot call; give the model as "
                            "a LiteLLM string or a dict {'model': ..., 'api_base': ..., 'api_key': ...} instead")
        return _from_settings(spec.model, dict(spec.kwargs), role)
    raise TypeError(f"{role} must be {_FORMS}; got {type(spec).__name__}")


def _from_settings(model: str, settings: dict[str, Any], role: str) -> Endpoint:
    if "base_url" in settings:  # LiteLLM's other name for api_base (an api_base given as well wins)
        settings.setdefault("api_base", settings.pop("base_url"))
    cleaned = {key: value for key, value in settings.items() if value is not None and key not in _NOT_SENT}
    key = cleaned.pop("api_key", None)
    return Endpoint(model, cleaned, role, key if isinstance(key, str) else None)
