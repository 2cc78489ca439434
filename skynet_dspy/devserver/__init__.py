"""A scripted OpenAI-compatible model server on 127.0.0.1, for tests, the demo and notebooks.

Reach it through LiteLLM exactly as a real provider, e.g.
`dspy.LM("openai/gpt-4o-mini", api_base=server.url, api_key="local")`. `DevServer` answers with
what its responder returns and records every request; `scripted_server()` starts one playing the
bundled example's task model, reflection model and judge. The library never imports this package.
"""

from .scripted import (
    KNOWLEDGE,
    LABELS,
    PRIOR,
    ScriptedModel,
    requests_by_role,
    role_of,
    rule_line,
    rules_in,
    scripted_server,
    split_rules,
)
from .server import DevServer, Fault, Request, dspy_reply

__all__ = [
    "KNOWLEDGE",
    "LABELS",
    "PRIOR",
    "DevServer",
    "Fault",
    "Request",
    "ScriptedModel",
    "dspy_reply",
    "requests_by_role",
    "role_of",
    "rule_line",
    "rules_in",
    "scripted_server",
    "split_rules",
]
