"""The Domain interface: one task family served to simulated users (training) and to people (studies).

A conversation is a list of OpenAI-style chat messages:
  {"role": "assistant", "content": str, "tool_calls": [{"id", "type": "function",
                                                        "function": {"name", "arguments": str}}]}
  {"role": "tool", "tool_call_id": str, "name": str, "content": str}
  {"role": "user", "content": str}          # the simulated or human user
The agent's system prompt is not part of the conversation; ask the Domain for it.
Training and studies call these methods unchanged, so a study's Outcome and a training
reward are the same function.
"""

from __future__ import annotations

import abc
from dataclasses import asdict, dataclass, field
from typing import Any

from agents.messages import Message, count_turns, message_text, user_view

__all__ = [
    "Domain",
    "Message",
    "Outcome",
    "QuestionnaireInput",
    "Scenario",
    "count_turns",
    "message_text",
]


@dataclass
class Scenario:
    """One task of a Domain: a tau2 task, a P4G persona, ..."""

    id: str
    domain: str
    payload: dict[str, Any]
    title: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Outcome:
    """The score of one finished conversation. `reward` is the training reward."""

    reward: float
    success: bool
    components: dict[str, Any] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class QuestionnaireInput:
    """An answer a Domain reads from a study's questionnaire to score a person (P4G: the
    donation): a number from `min_value` to `max_value`, in `unit`. The researcher says which
    item asks it; a study whose questionnaire supplies it nowhere cannot go live."""

    name: str
    label: str
    min_value: float
    max_value: float
    unit: str = ""

    def describe(self) -> str:
        """E.g. "donation (the donation the participant intends): a number in dollars from 0
        to 2"."""
        unit = f" in {self.unit}" if self.unit else ""
        return (
            f"{self.name} ({self.label}): a number{unit} "
            f"from {self.min_value:g} to {self.max_value:g}"
        )


class Domain(abc.ABC):
    """What a task family must provide. State is domain-specific but JSON-serialisable
    through `dump_state` / `load_state`, so a study can keep it between WebSocket reconnects."""

    name: str = ""
    title: str = ""  # what researchers read in the admin and in CLI help
    first_speaker: str = "user"  # "agent" when the agent opens without a fixed greeting
    # what people reading a conversation call its two speakers (a rater's page, a transcript):
    # the agent's role and the user's, in the task's own words
    agent_name: str = "agent"
    user_name: str = "user"
    # a co-trained simulator's reward under simulator_reward = "auto": one of training/vocabulary.py
    # SIMULATOR_REWARDS ("cooperative": the agent's own; P4G "adversarial": a persuadee keeps its
    # money; tau2 "curriculum": the agent's successes over a task's group should split evenly)
    simulator_reward: str = "cooperative"
    # whether the simulator's whole part of an episode is one choice (user_choices) answering
    # the agent's opening choice: its distribution over the texts is then exact for every ask,
    # which a co-trained simulator's simulator_update = "exact" needs (the P4G decision episode)
    exact_user_decision: bool = False
    max_turns: int = 30  # messages of the user and agent, tool messages excluded
    # lowest and highest `Outcome.reward` this Domain gives: a study's outcome figure is drawn
    # on it (a Domain with another scale says so here)
    reward_range: tuple[float, float] = (0.0, 1.0)
    max_tool_calls_per_turn: int = 10
    # whether the run's max_tool_rounds (tool-calling agent turns in a row) ends a rollout; a
    # Domain whose every turn calls tools (CooperBench's steps) keeps its own step limit instead
    limits_tool_rounds: bool = True
    # the Persona-Guided simulator's default behavioural guidelines, put before its system
    # prompt (training's regime "persona"); "" = none by default, a run must give its own
    simulator_guidelines: str = ""
    # what `outcome_from_answers` reads from a person's questionnaire, each mapped to one item
    # in the study's admin and checked at go-live; none: the chat's own score is the outcome
    questionnaire_inputs: tuple[QuestionnaireInput, ...] = ()
    # the task's variants, by name, with what each does (the first is the default): a run config's
    # domain_protocol and a study's pick one; {} = one protocol only (P4G: parley's and the
    # paper's release's)
    protocols: dict[str, str] = {}

    def with_turn_limit(self, max_turns: int) -> Domain:
        """This Domain for conversations of at most `max_turns` messages (user and agent), as a
        study allows them: a Domain whose texts say how long the chat is (P4G) gives a copy that
        says this limit; the others are the same whatever the length."""
        return self

    @abc.abstractmethod
    def scenarios(self, split: str | None = None) -> list[Scenario]:
        """Bundled scenarios (split: 'train', 'test' or None for all)."""

    @abc.abstractmethod
    def agent_system_prompt(self, scenario: Scenario) -> str: ...

    def tools(self, scenario: Scenario) -> list[dict[str, Any]]:
        """OpenAI function-format tool schemas; none by default."""
        return []

    def user_tools(self, scenario: Scenario) -> list[dict[str, Any]]:
        """The simulated user's own tools (CooperBench's partner codes too); none by default.
        Its calls are written in the JSON text format its system prompt describes, whatever
        supplies it (an endpoint, Verbalized Sampling, a model in this process), and are kept in
        the conversation as tau2-bench keeps a user's: the user message carries `tool_calls`,
        and each result is a `tool` message with `"requestor": "user"`."""
        return []

    def execute_user_tool(self, state: Any, name: str, arguments: dict[str, Any] | str) -> str:
        """Run one of the user's tool calls against `state`; errors come back as text."""
        return f"Error: unknown tool {name!r}"

    def next_speaker(self, conversation: list[Message], agent_first: bool) -> str:
        """ "agent" or "user": who takes the next turn. By default the agent goes on while its
        last message called tools, and otherwise the speakers alternate."""
        last = conversation[-1] if conversation else None
        if last is None:
            return "agent" if agent_first else "user"
        role = last["role"]
        if role == "tool":  # the results of someone's calls: that speaker goes on
            return "user" if last.get("requestor") == "user" else "agent"
        if last.get("tool_calls"):
            return "agent" if role == "assistant" else "user"
        return "user" if role == "assistant" else "agent"

    def agent_view(self, messages: list[Message]) -> list[Message]:
        """`messages` (a stretch of the conversation) as the agent's model reads them: all of
        them by default. Applied message by message, so a stretch's view is its messages'."""
        return messages

    def user_view(self, messages: list[Message]) -> list[Message]:
        """`messages` from the simulated user's side (agents.messages.user_view: roles flipped,
        tool traffic dropped)."""
        return user_view(messages)

    def greeting(self, scenario: Scenario) -> str | None:
        """The agent's opening message, or None when the user speaks first."""
        return None

    @abc.abstractmethod
    def new_state(self, scenario: Scenario) -> Any:
        """A fresh per-conversation state (never shared between conversations)."""

    def execute_tool(self, state: Any, name: str, arguments: dict[str, Any] | str) -> str:
        """Run one tool call against `state`; errors come back as text, never raise."""
        return f"Error: unknown tool {name!r}"

    def dump_state(self, state: Any) -> Any:
        return state

    def load_state(self, scenario: Scenario, data: Any) -> Any:
        return data

    @abc.abstractmethod
    def user_instructions(self, scenario: Scenario) -> str:
        """What a human participant sees in the side panel."""

    @abc.abstractmethod
    def simulator_system_prompt(self, scenario: Scenario) -> str:
        """The system prompt of a simulated user for this scenario."""

    def agent_choices(self, scenario: Scenario, conversation: list[Message]) -> list[str] | None:
        """The only messages a model agent may send next, when the task fixes them (a decision
        episode); None for free text. People in studies are never constrained."""
        return None

    def user_choices(
        self, scenario: Scenario, conversation: list[Message], final: bool
    ) -> list[str] | None:
        """The only messages a simulated user may send next (`final`: its last message before
        the turn limit), e.g. the P4G donation markers; None for free text."""
        return None

    def turn_count(self, conversation: list[Message]) -> int:
        """The turns taken so far, which a run's max_turns bounds: messages with visible text
        by default (agents.messages.count_turns)."""
        return count_turns(conversation)

    def is_done(self, conversation: list[Message]) -> str | None:
        """Why the conversation is over (e.g. 'user_stop', 'max_turns'), or None."""
        return "max_turns" if count_turns(conversation) >= self.max_turns else None

    def closing_reply(self, end_reason: str) -> bool:
        """Whether a person's chat, ended by the user's message for `end_reason`, first gets the
        agent's reply to that message (a thank-you for a donation). Training rollouts end at
        once either way: only studies ask."""
        return False

    def outcome_words(self, outcome: Outcome) -> str | None:
        """The outcome told to a participant in plain words, or None when the score checked
        nothing the conversation could change (details["checked"] False): it would be no news."""
        if not outcome.details.get("checked", True):
            return None
        return "The task was completed." if outcome.success else "The task was not completed."

    def confirmation(self, outcome: Outcome) -> str | None:
        """What the participant decided, confirmed on their debrief whatever else the study
        tells them (P4G: the donation); None when there is nothing to confirm."""
        return None

    def outcome_from_answers(
        self, answers: dict[str, Any], conversation: list[Message]
    ) -> Outcome | None:
        """A person's Outcome when the questionnaire decides it, or None to keep the chat's own
        score. `answers`: by the name of each of `questionnaire_inputs` (studies pass every one,
        a number within its bounds); ValueError for one it cannot use. Only studies call this:
        simulated users answer no questions."""
        return None

    @abc.abstractmethod
    def score(
        self, conversation: list[Message], state: Any, end_reason: str | None = None
    ) -> Outcome: ...
