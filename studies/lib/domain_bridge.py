"""The bridge between a participant and their Domain: state, prompt, end and outcome.

Below the participation flow and the chat: every Domain rule a study applies comes through these functions
and the Domain interface (agents/domains/base.py), never from testing a domain's name.
"""

from functools import lru_cache

from agents.domains import get_domain as fresh_domain
from agents.domains.base import Domain, Outcome, QuestionnaireInput
from agents.domains.base import Scenario as DomainScenario
from studies.lib.flow_errors import FlowError
from studies.models import Conversation, Participant, Study

OPEN_CHAT = Study.OPEN_CHAT  # a study with no Domain: free conversation, no scenario


@lru_cache(maxsize=8)
def shared_domain(name: str, source: str = "", protocol: str = "") -> Domain | None:
    """The one shared Domain of this name for the whole process (agents.domains.get_domain makes
    a fresh one each call); `source` is the official data folder a scenario came from,
    `protocol` the study's (protocol_of)."""
    if name == OPEN_CHAT:
        return None
    return fresh_domain(name, data_dir=source or None, protocol=protocol)


def protocol_of(study: Study, domain_name: str) -> str:
    """The protocol a study runs `domain_name` under: its domain_protocol for its own domain
    ("" = the Domain's default; a pool's scenario of another domain keeps that one's default)."""
    return study.domain_protocol if domain_name == study.domain else ""


def speaker_names(domain_name: str) -> dict[str, str]:
    """What a reader calls a conversation's two speakers, by stored speaker ("agent", "user"):
    the Domain's own words (P4G's persuader and persuadee), an open chat's agent and user, and
    the same for a domain no longer registered (its conversations are still read)."""
    try:
        domain = shared_domain(domain_name)
    except ValueError:
        domain = None
    if domain is None:
        return {"agent": Domain.agent_name, "user": Domain.user_name}
    return {"agent": domain.agent_name, "user": domain.user_name}


def domain_scenario(participant: Participant) -> DomainScenario | None:
    return domain_and_scenario(participant.study, participant.scenario)[1]


def domain_and_scenario(study: Study, row) -> tuple[Domain | None, DomainScenario | None]:
    """A scenario row's own Domain (a pool may mix retail and airline), else the study's, and
    the row as the Domain takes it (None without one)."""
    if row is None:
        domain, scenario = shared_domain(study.domain, "", study.domain_protocol), None
    else:
        domain = shared_domain(row.domain, row.source, protocol_of(study, row.domain))
        scenario = DomainScenario(
            id=row.key, domain=row.domain, payload=row.payload, title=row.title
        )
    if domain is not None:  # its texts say the study's length, not the Domain's own
        domain = domain.with_turn_limit(2 * study.max_exchanges)
    return domain, scenario


def domain_of(participant: Participant) -> tuple[Domain | None, DomainScenario | None]:
    """The scenario's own Domain (a pool may mix retail and airline), else the study's."""
    domain, scenario = domain_and_scenario(participant.study, participant.scenario)
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
    return system_prompt_of(domain, scenario, participant.arm)


def system_prompt_of(domain: Domain | None, scenario: DomainScenario | None, arm) -> str:
    """An arm's system prompt on a scenario: the Domain's agent prompt, then the arm's own (a
    participant's chat and a held-out simulator's conversation get the same)."""
    parts = [domain.agent_system_prompt(scenario)] if domain else []
    if arm.system_prompt:
        parts.append(arm.system_prompt)
    return "\n\n".join(parts)


def history(conversation: Conversation) -> list[dict]:
    return [m.to_chat() for m in conversation.messages.order_by("seq")]


def end_reason(participant: Participant, messages: list | None = None) -> str | None:
    """The Domain's reason the conversation is over (a stated donation, a transfer, ...), or None.
    `messages`: the conversation's Message rows when the caller has them (no query then).

    An end the Domain lets the agent answer first (a stated donation gets the persuader's
    closing reply) is None until that reply is stored: the consumer asks after storing the
    participant's message and again after the agent's answer, so the chat ends after the reply.
    """
    domain, _ = domain_of(participant)
    if domain is None:
        return None
    chat = chat_of(participant, messages)
    reason = domain.is_done(chat)
    if reason is not None and awaits_closing_reply(domain, reason, chat):
        return None
    return reason


def chat_of(participant: Participant, messages: list | None) -> list[dict]:
    if messages is not None:
        return [m.to_chat() for m in messages]
    return history(participant.conversation)


def awaits_closing_reply(domain: Domain, reason: str, chat: list[dict]) -> bool:
    last = chat[-1] if chat else {}
    return last.get("role") == "user" and domain.closing_reply(reason)


def score_conversation(participant: Participant, conversation: Conversation) -> dict | None:
    domain, scenario = domain_of(participant)
    if domain is None:
        return None
    state = domain.load_state(scenario, conversation.state)
    return domain.score(history(conversation), state, conversation.end_reason).to_dict()


def questionnaire_inputs(participant: Participant) -> dict[str, QuestionnaireInput]:
    """What the participant's Domain reads from the questionnaire, by name."""
    domain, _ = domain_of(participant)
    return {need.name: need for need in domain.questionnaire_inputs} if domain else {}


def outcome_after_questionnaire(
    participant: Participant, inputs: dict[str, float]
) -> tuple[dict | None, str | None]:
    """The Domain's outcome from the answers mapped to its inputs (P4G: the donation a person
    intends), else the chat's own score; and the problem, in words, when the Domain needed an
    answer it did not get or could not use (the chat's score stands then, and the researcher
    must be told: the answer is never dropped quietly)."""
    domain, _ = domain_of(participant)
    if domain is None:
        return participant.outcome, None
    missing = [need for need in domain.questionnaire_inputs if need.name not in inputs]
    if missing:
        return participant.outcome, (
            "The questionnaire gave no answer for "
            + "; ".join(need.describe() for need in missing)
            + ": no item is mapped to it (\"answers the task's\"). The outcome is the chat's "
            "own score."
        )
    try:
        outcome = domain.outcome_from_answers(inputs, history(participant.conversation))
    except ValueError as error:
        return participant.outcome, (
            f"The task could not use the answers ({error}). The outcome is the chat's own score."
        )
    return (outcome.to_dict() if outcome is not None else participant.outcome), None


def debrief(participant: Participant) -> dict:
    """What the debrief tells the participant about their task, by the study's outcome_feedback:
    `confirmation` (a decision they made, always), `words` and `score` (when the setting says
    so, and never for a score that checked nothing the conversation could change)."""
    told = {"confirmation": None, "words": None, "score": None}
    if not participant.outcome:
        return told
    domain, _ = domain_of(participant)
    if domain is None:
        return told
    outcome = Outcome(
        reward=participant.outcome.get("reward", 0.0),
        success=bool(participant.outcome.get("success")),
        components=participant.outcome.get("components") or {},
        details=participant.outcome.get("details") or {},
    )
    told["confirmation"] = domain.confirmation(outcome)
    feedback = participant.study.outcome_feedback
    if feedback in (Study.Feedback.WORDS, Study.Feedback.SCORE):
        told["words"] = domain.outcome_words(outcome)
    if feedback == Study.Feedback.SCORE and outcome.details.get("checked", True):
        told["score"] = outcome.reward
    return told
