"""Rollouts: conversations between the agent and a user simulator on Domain tasks.

`play` runs a batch of conversations in lockstep: every conversation waiting for the agent gets
its next turn from one batched call, then every one waiting for the user likewise. The Domain
decides when a conversation is over (by the turn rules of agents/domains/episode.py) and scores it. Who speaks is a Speaker: the agent
(training/rollouts/agent.py: in this process or on a vLLM server, its tool calls run by the Domain) and
the user (training/rollouts/simulator.py: a simulator in this process, scripted, or on an endpoint).

Speakers in this process keep a Transcript per conversation (training/rl/tokens.py). The agent's is
always tracked (its sampled ids are recorded and trained on); a trained simulator's too. A frozen
simulator is untracked: its history is the text it said, as with a simulator on an endpoint.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from agents.domains import episode
from agents.domains.base import Domain, Message, Outcome, Scenario
from agents.domains.episode import AGENT, USER
from agents.llm.tool_format import parse_tool_calls
from training.rl.choices import entropy
from training.rl.tokens import Transcript


@dataclass
class Decision:
    """A choice turn: the allowed texts, the speaker's exact distribution over them (for a
    Verbalized Sampling simulator, the distribution it wrote down), and the one taken."""

    role: str
    texts: list[str]
    probs: list[float]
    index: int

    @property
    def entropy(self) -> float:
        return entropy(self.probs)

    def redraw(self, rng: random.Random) -> int:
        return sample_index(self.probs, rng)


def sample_index(probs: list[float], rng: random.Random | None) -> int:
    """One index drawn from `probs`: with `rng`, or torch's generator (seeded by the run)."""
    if rng is not None:
        return rng.choices(range(len(probs)), weights=probs)[0]
    return int(torch.multinomial(torch.tensor(probs), 1))


@dataclass
class Rollout:
    """One conversation, its two token transcripts, and how it ended."""

    scenario: Scenario
    state: Any
    tools: list[dict]
    user_tools: list[dict] = field(default_factory=list)  # the simulated user's own (CooperBench)
    conversation: list[Message] = field(default_factory=list)
    agent: Transcript = field(default_factory=Transcript)
    user: Transcript = field(default_factory=Transcript)
    end_reason: str | None = None
    outcome: Outcome | None = None
    tool_rounds: int = 0  # consecutive agent turns that called tools
    fallbacks: int = 0  # verbalized replies (and endpoint choice turns) that fell back to raw text
    # turns cut off at max_new_tokens (no stop token sampled), by role: sampled in this process
    # or by vLLM; an endpoint's text says nothing of it ([curation]'s "cut" gate)
    cut_turns: dict[str, int] = field(default_factory=dict)
    agent_first: bool = False
    max_turns: int = 0  # set by play(): the user's last message is its `final` one
    decisions: list[Decision] = field(default_factory=list)
    index: int = 0  # position in play()'s batch
    member: str = "current"  # population, ensemble: which simulator played the user
    redraw_reward: float | None = None  # the reward had the user's last choice been redrawn

    @classmethod
    def begin(cls, domain: Domain, scenario: Scenario) -> Rollout:
        rollout = cls(
            scenario,
            domain.new_state(scenario),
            domain.tools(scenario),
            domain.user_tools(scenario),
        )
        rollout.agent_first = episode.agent_first(domain)
        greeting = domain.greeting(scenario)
        if greeting:
            rollout.conversation.append({"role": "assistant", "content": greeting})
        return rollout

    def decision(self, role: str) -> Decision | None:
        """The last choice turn of `role`, if any."""
        return next((d for d in reversed(self.decisions) if d.role == role), None)

    @property
    def user_final(self) -> bool:
        """The user's next message is its last before the turn limit."""
        return episode.user_final(self.conversation, self.max_turns)

    @property
    def reward(self) -> float:
        return self.outcome.reward if self.outcome else 0.0

    def next_speaker(self, domain: Domain) -> str:
        return domain.next_speaker(self.conversation, self.agent_first)

    def add_user_reply(self, domain: Domain, text: str) -> None:
        """The user's text as its message. Where the Domain gives the user tools, the calls in
        its text (agents.llm's JSON format, at most max_tool_calls_per_turn) are run by the
        Domain's execute_user_tool, each result a `tool` message with requestor "user" (as
        tau2-bench records a user's tool calls)."""
        content, calls = parse_tool_calls(text) if self.user_tools else (text, [])
        self.add_message(USER, content, calls[: domain.max_tool_calls_per_turn], domain)

    def add_message(self, role: str, content: str, calls: list[dict], domain: Domain) -> None:
        """A speaker's message, then each of its tool calls' results, run by the Domain (the
        agent's by execute_tool; the user's by execute_user_tool, marked requestor "user")."""
        message: Message = {"role": "assistant" if role == AGENT else "user", "content": content}
        if calls:
            message["tool_calls"] = calls
        self.conversation.append(message)
        run = domain.execute_tool if role == AGENT else domain.execute_user_tool
        for call in calls:
            name, arguments = call["function"]["name"], call["function"]["arguments"]
            result: Message = {
                "role": "tool",
                "tool_call_id": call["id"],
                "name": name,
                "content": str(run(self.state, name, arguments)),
            }
            if role == USER:
                result["requestor"] = "user"
            self.conversation.append(result)

    def check_end(self, domain: Domain, max_turns: int, max_tool_rounds: int) -> None:
        self.end_reason = episode.end_reason(
            domain, self.conversation, max_turns, self.tool_rounds, max_tool_rounds
        )


class Speaker(Protocol):
    role: str

    def respond(self, domain: Domain, rollouts: list[Rollout]) -> None:
        """Append this speaker's next message to each rollout."""


def play(
    domain: Domain,
    scenarios: list[Scenario],
    agent: Speaker,
    user: Speaker,
    *,
    max_turns: int,
    max_tool_rounds: int = episode.MAX_TOOL_ROUNDS,
    redraw: random.Random | None = None,
    on_finished: Callable[[int, int], None] | None = None,
    first: int = 0,
) -> list[Rollout]:
    """Run one conversation per scenario to its end and score it with the Domain.

    With `redraw`, a conversation that ended on a user choice turn is also scored with that
    choice drawn a second time from the same distribution (`redraw_reward`): two simulator
    draws per agent message, which split the reward's variance into the simulator's part and
    the agent's (training/measures/collapse.py). `on_finished` gets the count of conversations that
    have ended and of the turns taken in them, after every speaker's turn (the run page's
    progress within a step: the G conversations of a task move together and end together, so
    the ended count alone stood at 0 for minutes). `first`: the group position of the first
    scenario (a group played in parts, rollouts_at_once: an Ensemble's member is drawn from it)."""
    max_turns = episode.turn_limit(domain, max_turns)
    rollouts = [Rollout.begin(domain, s) for s in scenarios]
    for i, r in enumerate(rollouts):
        r.max_turns, r.index = max_turns, first + i
    turns = 0
    while any(r.end_reason is None for r in rollouts):
        for speaker in (user, agent):
            waiting = [
                r
                for r in rollouts
                if r.end_reason is None and r.next_speaker(domain) == speaker.role
            ]
            if waiting:
                speaker.respond(domain, waiting)
                for r in waiting:
                    r.check_end(domain, max_turns, max_tool_rounds)
                    if r.end_reason is not None:  # its speakers' keys and values are done with
                        r.agent.cache.clear()
                        r.user.cache.clear()
                turns += len(waiting)
                if on_finished is not None:
                    on_finished(sum(r.end_reason is not None for r in rollouts), turns)
    for r in rollouts:
        r.outcome = domain.score(r.conversation, r.state, r.end_reason)
        last = r.decision(USER)
        if (
            redraw is not None
            and last
            and r.conversation[-1].get("content") == last.texts[last.index]
        ):
            again = {"role": "user", "content": last.texts[last.redraw(redraw)]}
            other = domain.score([*r.conversation[:-1], again], r.state, r.end_reason)
            r.redraw_reward = other.reward
    return rollouts
