"""The turn rules of one conversation between an agent and a simulated user on a Domain: who
opens it, which user message is the last, how tool-calling agent turns are counted, and when it
is over. Who speaks next is the Domain's own rule (Domain.next_speaker), and so is what counts as
a turn (Domain.turn_count).

Training's rollouts (training/rollouts/rollout.py) and studies' held-out conversations
(studies/research/heldout_conversations.py) both follow these, so a held-out conversation plays
by the rules the agent was trained under.
"""

from __future__ import annotations

from agents.domains.base import Domain, Message, count_turns

AGENT, USER = "agent", "user"  # the speakers, as Domain.next_speaker names them

# a run's limits unless its config says otherwise (training/config_schema.py RunConfig reads
# them here)
MAX_TURNS = 10
MAX_TOOL_ROUNDS = 4


def agent_first(domain: Domain) -> bool:
    """Whether the agent opens (a Domain's greeting, when it has one, is that opening)."""
    return domain.first_speaker == AGENT


def turn_limit(domain: Domain, max_turns: int) -> int:
    """A run's max_turns, capped by the Domain's own."""
    return min(max_turns, domain.max_turns)


def user_final(conversation: list[Message], max_turns: int) -> bool:
    """The user's next message is its last before the turn limit (the `final` a Domain's
    user_choices is asked with)."""
    return count_turns(conversation) + 1 >= max_turns


def tool_rounds_after(tool_rounds: int, called_tools: bool) -> int:
    """The consecutive tool-calling agent turns after an agent turn: a turn without calls ends
    the run of them."""
    return tool_rounds + 1 if called_tools else 0


def end_reason(
    domain: Domain,
    conversation: list[Message],
    max_turns: int,
    tool_rounds: int,
    max_tool_rounds: int,
) -> str | None:
    """Why the conversation is over after its latest turn, or None: the Domain's own reason
    first, then the turn limit (turns as the Domain counts them), then max_tool_rounds
    tool-calling agent turns in a row where the Domain lets that bound it (limits_tool_rounds)."""
    return (
        domain.is_done(conversation)
        or ("max_turns" if domain.turn_count(conversation) >= max_turns else None)
        or (
            "max_tool_rounds"
            if domain.limits_tool_rounds and tool_rounds >= max_tool_rounds
            else None
        )
    )
