"""The scripted task model reads rules the same way wherever a prompt puts them, and never takes a rule's
words for the ticket's: a better prompt gives better answers, a rule about one cue changes no other ticket."""

from __future__ import annotations

import litellm
import pytest

from skynet_dspy.devserver import ScriptedModel, rule_line, scripted_server, split_rules

TICKET = "Please process a refund for the duplicate seat I bought."  # billing; the prior does not know 'refund'
RULES = "\n".join([rule_line("crash", "bug"), rule_line("refund", "billing")])
PLACES = {
    "before the ticket": f"{RULES}\nTicket: {TICKET}\nLabel:",
    "after the ticket": f"Classify the ticket.\nTicket: {TICKET}\nLabel:\n{RULES}",
    "on the ticket's line": f"{rule_line('refund', 'billing')} Ticket: {TICKET}",
}


@pytest.mark.parametrize("where", sorted(PLACES))
def test_a_rule_counts_wherever_the_template_puts_it(where):
    model = ScriptedModel()
    assert model.classify(PLACES[where])[0] == "billing"
    assert model.classify(TICKET, RULES)[0] == "billing"  # the same rules as instructions (a system message)
    assert model.classify(TICKET)[0] == "other"  # and without them the model does not know


def test_a_rule_mentioning_a_known_cue_does_not_relabel_other_tickets():
    """The old fault: once "Tickets that mention 'crash' are bug." was in the user message, every ticket was a bug."""
    model = ScriptedModel()
    for ticket, label in [(TICKET, "other"), ("The invoice shows the wrong company name.", "billing"),
                          ("I want to partner with you.", "other")]:
        prompt = f"Classify the support ticket.\nTicket: {ticket}\nLabel:\n{rule_line('crash', 'bug')}"
        assert model.classify(prompt)[0] == label, ticket
    assert model.classify(f"Ticket: The app crashes at start.\n{rule_line('crash', 'bug')}")[0] == "bug"


def test_split_rules_takes_rule_sentences_out_whole():
    text = f"Route it. {rule_line('error 500', 'bug')} Ticket: it crashed.\n{rule_line('x', 'other')}"
    rules, rest = split_rules(text)
    assert rules == [("error 500", "bug"), ("x", "other")]
    assert rest == "Route it. Ticket: it crashed."


def test_a_plain_chat_call_reads_rules_in_the_system_or_the_user_message():
    with scripted_server() as server:
        def ask(messages):
            reply = litellm.completion(model="openai/gpt-4o-mini", api_base=server.url, api_key="local",
                                       messages=messages)
            return reply.choices[0].message.content

        assert ask([{"role": "user", "content": PLACES["after the ticket"]}]) == "billing"
        assert ask([{"role": "system", "content": RULES}, {"role": "user", "content": TICKET}]) == "billing"
        assert ask([{"role": "user", "content": f"Ticket: {TICKET}\n{rule_line('crash', 'bug')}"}]) == "other"
