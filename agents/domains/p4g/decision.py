"""The P4G decision episode: one ask, one decision. A bandit played through an LLM.

The agent opens with one of a fixed set of asks (an appeal x an amount) and the persuadee answers
with one of the five decision markers; the reward is P4G's own, min(amount / 2, 1). Both sides
are schema-constrained (Domain.agent_choices / user_choices), so every probability in it is exact:
the agent's distribution over asks and the persuadee's over amounts. That is what makes the
simulator-collapse mechanism measurable on a 135M model in minutes (`python -m training
experiment collapse`). It is not a dialogue: the P4GDomain is the dialogue.
"""

from __future__ import annotations

from typing import Any

from agents.domains.base import Message, Scenario
from agents.domains.p4g import prompts
from agents.domains.p4g.domain import P4GDomain
from agents.domains.p4g.donation import DECISION_AMOUNTS, dollars, marker

# Two of P4G's persuasion strategies (Wang et al. 2019), in words a person would use.
APPEALS = {
    "evidence": (
        "Save the Children has worked in more than 100 countries since 1919, giving children "
        "healthcare, food and schooling."
    ),
    "emotion": (
        "Right now many children go hungry and sick, and your help can give one of them a "
        "safer, healthier day."
    ),
}
ASK_AMOUNTS = (0.5, 1.0, 1.5, 2.0)

AGENT_PROMPT = f"""You are chatting online with another participant of a study. They earned \
${prompts.PAYMENT:.2f} for the task. Persuade them to donate part of it to the charity \
{prompts.CHARITY}. Send one message: an argument and an ask."""


def ask_text(appeal: str, amount: float) -> str:
    return (
        f"{APPEALS[appeal]} Would you give {dollars(amount)} of your payment to {prompts.CHARITY}?"
    )


ASKS = {(appeal, amount): ask_text(appeal, amount) for appeal in APPEALS for amount in ASK_AMOUNTS}


def persuadee_prompt(persona: dict[str, Any]) -> str:
    return f"""You are a person taking part in an online study, not an assistant. You were paid \
${prompts.PAYMENT:.2f} for the task. Another participant asks you to donate part of it to the \
charity {prompts.CHARITY}. You may give $0, $0.50, $1, $1.50 or $2; whatever you give is taken \
from your payment.

Who you are:
{prompts.describe_persona(persona)}

Reply only with your decision: [DONATE $N]."""


class P4GDecisionDomain(P4GDomain):
    """P4G personas and scoring; the agent's one ask and the persuadee's one decision."""

    name = "p4g-decision"
    title = "Persuasion for Good: one ask, one decision"
    first_speaker = "agent"
    max_turns = 2
    protocols = {"parley": "one fixed ask, one of five decision markers"}  # no release variant
    exact_user_decision = True  # the persuadee's one turn is a choice among the five markers

    def agent_system_prompt(self, scenario: Scenario) -> str:
        return AGENT_PROMPT

    def greeting(self, scenario: Scenario) -> str | None:
        return None

    def agent_choices(self, scenario: Scenario, conversation: list[Message]) -> list[str] | None:
        return list(ASKS.values())

    def user_choices(
        self, scenario: Scenario, conversation: list[Message], final: bool
    ) -> list[str] | None:
        return [marker(a) for a in DECISION_AMOUNTS]

    def simulator_system_prompt(self, scenario: Scenario) -> str:
        return persuadee_prompt(scenario.payload["persona"])
