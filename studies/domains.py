"""The bridge between a participant and their Domain: state, prompt, end and outcome.

Below flow.py and chat.py: every Domain rule a study applies comes through these functions
and the Domain interface (agents/domains/base.py), never from testing a domain's name.
"""

from functools import lru_cache

from agents.domains import get_domain as load
from agents.domains.base import Domain
from agents.domains.base import Scenario as DomainScenario

from .errors import FlowError
from .models import Conversation, Participant, Study

OPEN_CHAT = Study.OPEN_CHAT  # a study with no Domain: free conversation, no scenario


@lru_cache(maxsize=8)
def get_domain(name: str, source: str = "") -> Domain | None:
    """The Domain by name; `source` is the official data folder a scenario came from."""
    if name == OPEN_CHAT:
        return None
    return load(name, data_dir=source or None)


def domain_scenario(participant: Participant) -> DomainScenario | None:
    scenario = participant.scenario
    if scenario is None:
        return None
    return DomainScenario(
        id=scenario.key, domain=scenario.domain, payload=scenario.payload, title=scenario.title
    )


def domain_of(participant: Participant) -> tuple[Domain | None, DomainScenario | None]:
    """The scenario's own Domain (a pool may mix retail and airline), else the study's."""
    row = participant.scenario
    domain = get_domain(row.domain, row.source) if row else get_domain(participant.study.domain)
    scenario = domain_scenario(participant)
    if domain is not None and scenario is None:
        raise FlowError("This study is not ready", "The study has no scenario for this task.", 503)
    return domain, scenario


def opening_messages(participant: Participant) -> tuple[object, str]:
    """A fresh Domain state for this conversation and the agent's greeting (may be empty)."""
    domain, scenario = domain_of(participant)
    if domain is None:
        return None, participant.arm.greeting
    state = domain.dump_state(domain.new_state(scenario))
    return state, participant.arm.greeting or domain.greeting(scenario) or ""


def system_prompt(participant: Participant) -> str:
    """The Domain's agent prompt, then the arm's own system prompt."""
    domain, scenario = domain_of(participant)
    parts = [domain.agent_system_prompt(scenario)] if domain else []
    if participant.arm.system_prompt:
        parts.append(participant.arm.system_prompt)
    return "\n\n".join(parts)


def history(conversation: Conversation) -> list[dict]:
    return [m.to_chat() for m in conversation.messages.order_by("seq")]


def end_reason(participant: Participant, messages: list | None = None) -> str | None:
    """The Domain's reason the conversation is over (a stated donation, a transfer, ...), or None.
    `messages`: the conversation's Message rows when the caller has them (no query then)."""
    domain, _ = domain_of(participant)
    if domain is None:
        return None
    chat = [m.to_chat() for m in messages] if messages is not None else None
    return domain.is_done(chat if chat is not None else history(participant.conversation))


def score_conversation(participant: Participant, conversation: Conversation) -> dict | None:
    domain, scenario = domain_of(participant)
    if domain is None:
        return None
    state = domain.load_state(scenario, conversation.state)
    return domain.score(history(conversation), state, conversation.end_reason).to_dict()


def outcome_after_questionnaire(participant: Participant, answers: dict) -> dict | None:
    """The Domain's outcome from the answers (P4G: the donation a person intends), else the
    chat's own score."""
    domain, _ = domain_of(participant)
    if domain is None:
        return participant.outcome
    outcome = domain.outcome_from_answers(answers, history(participant.conversation))
    return outcome.to_dict() if outcome is not None else participant.outcome
