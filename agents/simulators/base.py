"""A user simulator: the other side of the conversation, played by a model.

Training uses it to produce rollouts and the studies use it for bot participants. It is
given the Domain, the scenario and the conversation as the agent sees it, and returns the
next user message. The model behind it sees the conversation from the user's side: the
agent's messages become "user" turns and its own earlier messages "assistant" turns.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from agents.domains.base import Domain, Message, Scenario

if TYPE_CHECKING:  # agents.llm is only needed by callers that build a client
    from agents.llm import LLMClient

# Sent when the user speaks first, since chat templates expect a user turn to answer.
OPENING = "(The chat has started. Write your first message.)"


class Candidate(NamedTuple):
    """One of the replies a Verbalized Sampling simulator proposes."""

    text: str
    probability: float


@dataclass
class UserTurn:
    """The simulator's next message and how it came about."""

    text: str
    raw: str  # the model's output the text was taken from
    candidates: list[Candidate] | None = None  # Verbalized Sampling only
    attempts: int = 1
    fell_back: bool = False  # the raw text was used because no attempt parsed
    errors: list[str] = field(default_factory=list)
    usage: list[Any] = field(default_factory=list)


def user_view(conversation: list[Message]) -> list[Message]:
    """The conversation from the user's side: roles flipped, tool traffic dropped, and
    consecutive messages of one speaker merged (some chat templates require alternation)."""
    flipped: list[Message] = []
    for message in conversation:
        role, content = message.get("role"), message.get("content")
        if role not in ("user", "assistant") or not isinstance(content, str) or not content.strip():
            continue  # tool results and tool-call-only agent turns are invisible to the user
        role = "assistant" if role == "user" else "user"
        if flipped and flipped[-1]["role"] == role:
            flipped[-1] = {"role": role, "content": flipped[-1]["content"] + "\n\n" + content}
        else:
            flipped.append({"role": role, "content": content})
    return flipped or [{"role": "user", "content": OPENING}]


class Simulator(abc.ABC):
    """Produces the next user message through an agents.llm client."""

    def __init__(self, client: LLMClient, model: str, **params: Any):
        self.client = client
        self.model = model
        self.params = params  # generation settings passed to client.chat (temperature, ...)

    def system_prompt(self, domain: Domain, scenario: Scenario) -> str:
        return domain.simulator_system_prompt(scenario)

    def messages(
        self, domain: Domain, scenario: Scenario, conversation: list[Message]
    ) -> list[Message]:
        """The chat the simulator's model is asked to continue."""
        system = {"role": "system", "content": self.system_prompt(domain, scenario)}
        return [system, *user_view(conversation)]

    async def reply(
        self,
        domain: Domain,
        scenario: Scenario,
        conversation: list[Message],
        choices: list[str] | None = None,
    ) -> UserTurn:
        """The next user message; `choices`: the texts it must be one of (a choice turn)."""
        return await self.answer(self.messages(domain, scenario, conversation), choices)

    @abc.abstractmethod
    async def answer(self, messages: list[Message], choices: list[str] | None) -> UserTurn:
        """The next user message, asked of the model as the chat `messages` continued."""
