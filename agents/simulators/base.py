"""A user simulator: the other side of the conversation, played by a model.

Training uses it to produce rollouts and the studies use it for bot participants. It is
given the Domain, the scenario and the conversation as the agent sees it, and returns the
next user message. The model behind it sees the conversation from the user's side: the
agent's messages become "user" turns and its own earlier messages "assistant" turns.
"""

from __future__ import annotations

import abc
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from agents.domains.base import Domain, Message, Scenario

if TYPE_CHECKING:  # agents.llm is only needed by callers that build a client
    from agents.llm import LLMClient


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


_NUMBER = re.compile(r"\d+(?:\.\d+)?|\.\d+")


def _canonical(text: str) -> str:
    """A text as choices are compared: case, spaces and number spellings ("$1.00", "$1") aside."""
    text = _NUMBER.sub(lambda m: f"{float(m.group()):g}", text.lower())
    return re.sub(r"\s+", "", text)


def match_choice(text: str, choices: list[str] | tuple[str, ...]) -> str | None:
    """The allowed text `text` is (exactly, else up to case, spacing and number spelling)."""
    if text in choices:
        return text
    canonical = _canonical(text)
    return next((c for c in choices if _canonical(c) == canonical), None)


def find_choice(raw: str, choices: list[str] | tuple[str, ...]) -> str | None:
    """The allowed text that appears first in free text `raw` (compared as match_choice does)."""
    found = [(raw.find(c), c) for c in choices if c in raw]
    if not found:
        canonical = _canonical(raw)
        found = [(canonical.find(_canonical(c)), c) for c in choices if _canonical(c) in canonical]
    return min(found)[1] if found else None


def choice_instruction(choices: list[str] | tuple[str, ...]) -> str:
    """What a choice turn asks in words where the provider does not enforce the schema."""
    return "(Reply with exactly one of: " + ", ".join(choices) + " and nothing else.)"


def with_instruction(messages: list[Message], note: str) -> list[Message]:
    """`messages` with `note` added to the last user turn (or as one, after the rest)."""
    out = list(messages)
    if out and out[-1].get("role") == "user" and isinstance(out[-1].get("content"), str):
        out[-1] = {**out[-1], "content": out[-1]["content"] + "\n\n" + note}
    else:
        out.append({"role": "user", "content": note})
    return out


class Simulator(abc.ABC):
    """Produces the next user message through an agents.llm client."""

    def __init__(self, client: LLMClient, model: str, **params: Any):
        self.client = client
        self.model = model
        self.params = params  # generation settings passed to client.chat (temperature, ...)

    def enforces_choices(self) -> bool:
        """Whether the provider behind the client holds a reply to the response_format's schema
        (agents.llm.providers); where it does not, choices are asked in words and read from the
        text. A client without providers (a test's stand-in) is taken to enforce it."""
        provider_for = getattr(self.client, "provider_for", None)
        return provider_for is None or provider_for(self.model).enforces_response_format

    def system_prompt(self, domain: Domain, scenario: Scenario) -> str:
        return domain.simulator_system_prompt(scenario)

    def messages(
        self, domain: Domain, scenario: Scenario, conversation: list[Message]
    ) -> list[Message]:
        """The chat the simulator's model is asked to continue."""
        system = {"role": "system", "content": self.system_prompt(domain, scenario)}
        return [system, *domain.user_view(conversation)]

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
