"""The scripted model behind the loopback DevServer: a tiny deterministic world for the demo, notebooks and tests.

One responder plays three roles, told apart by the request it receives:

- **task model** (a DSPy program's call, or a plain chat call): it labels a support ticket by the rules its
  instructions state, lines such as ``Tickets that mention 'refund' are billing.``, falling back on a little
  common sense of its own (``PRIOR``) and then on ``other``. A better instruction gives better answers. Rules
  are read the same way wherever a prompt puts them (system message, before or after the ticket), and the
  words of a rule are never taken for words of the ticket.
- **reflection model** (DSPy GEPA's instruction proposal, or plain GEPA's reflection prompt): it reads the
  feedback texts it is shown, picks up every ``... mentions 'CUE', which points to LABEL`` statement, and
  proposes the current instruction plus one rule line per new cue. It learns only from feedback.
- **judge** (an ``llm()`` call asking for PASS or FAIL): it checks a label against what it knows
  (``KNOWLEDGE``, more than the task model knows) and answers ``PASS. ...`` or ``FAIL. ...``.

Everything is a pure function of the request, so a GEPA run with a fixed seed is reproducible.

    with scripted_server() as server:
        lm = dspy.LM("openai/gpt-4o-mini", api_base=server.url, api_key="local", cache=False)
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from .._core.values import content_text
from .server import DevServer, Request, dspy_reply

__all__ = [
    "KNOWLEDGE",
    "LABELS",
    "PRIOR",
    "ScriptedModel",
    "requests_by_role",
    "role_of",
    "rule_line",
    "rules_in",
    "scripted_server",
    "split_rules",
]

LABELS = ("billing", "bug", "how-to", "account", "other")
DEFAULT_LABEL = "other"

# What the scripted task model knows without being told: the obvious words only.
PRIOR: dict[str, str] = {
    "invoice": "billing",
    "crash": "bug",
    "how do i": "how-to",
    "password": "account",
}

# What the judge knows (a stronger model): every cue of the bundled example's world.
KNOWLEDGE: dict[str, str] = {
    **PRIOR,
    "refund": "billing",
    "charged twice": "billing",
    "receipt": "billing",
    "discount": "billing",
    "error 500": "bug",
    "blank page": "bug",
    "freezes": "bug",
    "spinner": "bug",
    "export": "how-to",
    "dark mode": "how-to",
    "shortcut": "how-to",
    "webhook": "how-to",
    "locked out": "account",
    "two-factor": "account",
    "username": "account",
    "email address": "account",
    "partnership": "other",
    "conference": "other",
}

# "Tickets that mention 'refund' are billing." (instructions) and
# "The ticket mentions 'refund', which points to billing." (feedback) both state a rule.
_RULE = re.compile(
    r"mentions?\s+['\"‘“](?P<cue>[^'\"’”\n]{1,60})['\"’”],?\s+"
    r"(?:which\s+points\s+to|points\s+to|are|is|means)\s+['\"]?(?P<label>[A-Za-z][\w-]*)",
    re.IGNORECASE,
)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_FIELD_LIST = re.compile(r"^\s*\d+\.\s+`(?P<name>\w+)`", re.MULTILINE)
_SECTION = re.compile(r"\[\[ ## (?P<name>\w+) ## \]\]\n?")
_OBJECTIVE = "your objective is:"
_REFLECTION_FIELDS = ("new_instruction", "improved_instruction")
_FENCE = re.compile(r"```[^\n]*\n(?P<body>.*?)\n?```", re.DOTALL)
_JSON_KEYS = re.compile(r"\bkeys?\b\s*:?\s*(?P<keys>[^.\n]+)", re.IGNORECASE)


def rule_line(cue: str, label: str) -> str:
    """The instruction line the scripted task model obeys: ``Tickets that mention 'CUE' are LABEL.``"""
    return f"Tickets that mention '{cue}' are {label}."


def rules_in(text: str) -> list[tuple[str, str]]:
    """Every (cue, label) rule stated in `text`, in order of appearance, first statement of a cue wins."""
    found: dict[str, str] = {}
    for match in _RULE.finditer(text or ""):
        cue, label = match["cue"].strip().lower(), match["label"].lower()
        if cue and cue not in found:
            found[cue] = label
    return list(found.items())


def split_rules(text: str) -> tuple[list[tuple[str, str]], str]:
    """(the rules `text` states, the rest of `text`), sentence by sentence.

    A plain prompt template may hold its rule lines before the ticket, after it, or on the ticket's line;
    a rule sentence is taken out whole, so a cue inside a rule ("... mention 'crash' are bug.") is never
    read as the ticket mentioning it.
    """
    rules: list[tuple[str, str]] = []
    kept_lines: list[str] = []
    for line in (text or "").splitlines():
        kept = []
        for sentence in _SENTENCE_END.split(line):
            stated = rules_in(sentence)
            if stated:
                rules.extend(stated)
            else:
                kept.append(sentence)
        if kept:
            kept_lines.append(" ".join(kept))
    return rules, "\n".join(kept_lines)


def _find_cue(text: str, table: Iterable[tuple[str, str]]) -> tuple[str, str] | None:
    lowered = text.lower()
    for cue, label in table:
        if cue in lowered:
            return cue, label
    return None


# -- reading requests ----------------------------------------------------------------------------


def _objective(system: str) -> str:
    """The signature instructions inside a DSPy system message (the whole message when not DSPy's)."""
    at = system.find(_OBJECTIVE)
    if at < 0:
        return system
    return "\n".join(line.strip() for line in system[at + len(_OBJECTIVE):].strip().splitlines())


def _output_fields(system: str) -> list[str]:
    """The output field names a DSPy adapter's system message lists."""
    start = system.find("Your output fields are:")
    if start < 0:
        return []
    end = system.find("All interactions will be structured", start)
    return _FIELD_LIST.findall(system[start: end if end > 0 else None])


def _sections(text: str) -> dict[str, str]:
    """The `[[ ## name ## ]]` sections of a DSPy-formatted message."""
    parts = _SECTION.split(text)
    return {parts[i]: parts[i + 1].strip() for i in range(1, len(parts) - 1, 2)}


def _last_user(request: Request) -> str:
    users = [m for m in request.messages if m.get("role") == "user"]
    if not users:
        return request.text
    return content_text(users[-1].get("content"))


def role_of(request: Request) -> str:
    """Which role a request asks for: "reflection", "judge" or "task"."""
    system = request.system
    fields = _output_fields(system)
    if any(name in fields for name in _REFLECTION_FIELDS):
        return "reflection"
    if fields:
        return "task"
    text = request.text
    if "```" in text and re.search(r"(new|improved)[^.\n]*(instruction|parameter)", text, re.IGNORECASE):
        return "reflection"
    if "PASS" in text and "FAIL" in text:
        return "judge"
    return "task"


def requests_by_role(requests: Iterable[Request], role: str) -> list[Request]:
    """The recorded requests that asked for `role` ("task", "reflection" or "judge")."""
    return [request for request in requests if role_of(request) == role]


def _feedback_texts(value: Any) -> list[str]:
    """Every "Feedback" string inside a parsed reflective dataset."""
    found: list[str] = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            if str(key).lower() == "feedback" and isinstance(item, str):
                found.append(item)
            else:
                found.extend(_feedback_texts(item))
    elif isinstance(value, list | tuple):
        for item in value:
            found.extend(_feedback_texts(item))
    return found


# -- the model ------------------------------------------------------------------------------------


class ScriptedModel:
    """A DevServer responder: task model, reflection model and judge of the bundled example's world.

    `prior` is what the task model knows untold, `knowledge` what the judge knows (cue -> label).
    """

    def __init__(self, prior: Mapping[str, str] | None = None, knowledge: Mapping[str, str] | None = None):
        self.prior = dict(PRIOR if prior is None else prior)
        self.knowledge = dict(KNOWLEDGE if knowledge is None else knowledge)

    def __call__(self, request: Request) -> str:
        role = role_of(request)
        if role == "reflection":
            return self._reflect(request)
        if role == "judge":
            return self.judge(_last_user(request))
        return self._task(request)

    # task model

    def classify(self, ticket: str, instructions: str = "") -> tuple[str, str]:
        """(label, reasoning) for `ticket`: the stated rules first, then the prior, then "other".

        Rules count wherever they are stated, in `instructions` or inside the `ticket` text (a filled-in
        template); only the ticket text outside rule sentences is searched for cues.
        """
        stated_rules, _ = split_rules(instructions)
        inline_rules, ticket = split_rules(ticket)
        first: dict[str, str] = {}
        for cue, label in [*stated_rules, *inline_rules]:
            first.setdefault(cue, label)
        stated = _find_cue(ticket, first.items())
        if stated is not None:
            cue, label = stated
            return label, f"The ticket mentions '{cue}', and the instructions say such tickets are {label}."
        known = _find_cue(ticket, self.prior.items())
        if known is not None:
            cue, label = known
            return label, f"The ticket mentions '{cue}', which usually means {label}."
        return DEFAULT_LABEL, "Nothing in the ticket matches a known kind of request, so it is other."

    def _task(self, request: Request) -> str:
        system = request.system
        fields = _output_fields(system)
        user = _last_user(request)
        if not fields:  # a plain chat call: the system message is the instruction, the user message the ticket
            return self.classify(user, system)[0]
        instructions = _objective(system)
        inputs = _sections(user)
        ticket = "\n".join(inputs.values()) if inputs else user
        label, reasoning = self.classify(ticket, instructions)
        values: dict[str, Any] = {}
        for name in fields:
            if name == "reasoning":
                values[name] = reasoning
            elif "json" in instructions.lower():
                values[name] = self._json_answer(instructions, ticket, label)
            else:
                values[name] = label
        if "Outputs will be a JSON object" in system:
            return json.dumps(values)
        return dspy_reply(**values)

    @staticmethod
    def _json_answer(instructions: str, ticket: str, label: str) -> str:
        """A JSON object with exactly the keys the instructions list ("... with the keys: a, b, c.")."""
        match = _JSON_KEYS.search(instructions)
        names = re.split(r",|\band\b", match["keys"]) if match else ["label"]
        keys = [name.strip(" `'\"") for name in names if name.strip(" `'\"")]
        summary = " ".join(ticket.split()[:8])
        values = {"label": label, "category": label, "topic": label, "summary": summary}
        return json.dumps({key: values.get(key, summary) for key in keys})

    # reflection model

    def propose(self, current_instruction: str, feedback: Iterable[str]) -> str:
        """The current instruction plus a rule line for every cue the feedback names that it lacks."""
        known = dict(rules_in(current_instruction))
        lines = [line for line in current_instruction.strip().splitlines() if not rules_in(line)]
        while lines and not lines[-1].strip():
            lines.pop()
        rules = list(known.items())
        for text in feedback:
            for cue, label in rules_in(text):
                if cue not in known:
                    known[cue] = label
                    rules.append((cue, label))
        return "\n".join([*lines, *(rule_line(cue, label) for cue, label in rules)])

    def _reflect(self, request: Request) -> str:
        system = request.system
        fields = _output_fields(system)
        if fields:  # DSPy GEPA's proposer: a signature (current_instruction, examples_with_feedback)
            sections = _sections(_last_user(request))
            current = sections.get("current_instruction", "")
            raw = sections.get("examples_with_feedback", "")
            try:
                feedback = _feedback_texts(json.loads(raw))
            except ValueError:
                feedback = [raw]
            new = self.propose(current, feedback)
            name = next(name for name in fields if name in _REFLECTION_FIELDS)
            if "Outputs will be a JSON object" in system:
                return json.dumps({name: new})
            return dspy_reply(**{name: new})
        # gepa's plain reflection prompt: the current value in the first ``` block, the side info in the next
        text = request.text
        blocks = [match["body"] for match in _FENCE.finditer(text)]
        current = blocks[0] if blocks else ""
        side_info = "\n".join(blocks[1:]) if len(blocks) > 1 else text
        return "```\n" + self.propose(current, [side_info]) + "\n```"

    # judge

    def judge(self, text: str) -> str:
        """PASS or FAIL, then one sentence, for "Question: ...\\nAnswer: ..." (or a bare ticket and label)."""
        question, answer = text, ""
        if "Answer:" in text:
            question, answer = text.rsplit("Answer:", 1)
        question = question.replace("Question:", "", 1).strip()
        given = answer.strip().strip("'\".").lower()
        if given not in LABELS:
            if given:
                return "PASS. The answer addresses the question."
            return "FAIL. The answer is empty."
        known = _find_cue(question, self.knowledge.items())
        if known is None:
            right, why = DEFAULT_LABEL, "Nothing in the ticket points to a specific team"
        else:
            cue, right = known
            why = f"The ticket mentions '{cue}', which points to {right}"
        if given == right:
            return f"PASS. {why}."
        return f"FAIL. Expected '{right}', got '{given}'. {why}."


def scripted_server(*, delay: float = 0.0, model_name: str = "gpt-4o-mini", **options: Any) -> DevServer:
    """A started DevServer answering as the ScriptedModel; stop it with .stop() or use it in a `with`.

    It reports `model_name` (LiteLLM prices "gpt-4o-mini", so runs have a measurable cost) and
    waits `delay` seconds before each answer. `options` go to ScriptedModel (prior, knowledge).
    """
    return DevServer(responder=ScriptedModel(**options), model_name=model_name, delay=delay).start()
