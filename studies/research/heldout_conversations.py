"""An arm's model in conversation with one of a training run's held-out simulators, through
agents/llm, scored by the Domain: the simulated half of the sim-to-real gap (studies/research/simulator_evaluations.py).

The agent is the arm as people meet it: its endpoint, model, system prompt, greeting, generation
settings and tool format, the Domain's tools run on the conversation's own state. The user is the
held-out simulator as the run's config declares it (`[[heldout]]`): a scripted persuadee type, or
a plain or Verbalized Sampling simulator on its endpoint, made from its table as training makes
it (agents/simulators/spec.py SimulatorSpec and build). The turn rules are the training rollouts'
(agents/domains/episode.py): the Domain says who speaks next and how turns count, and ends the
conversation, else the run's max_turns (capped by the Domain's) or, where the Domain lets them,
max_tool_rounds consecutive tool-calling agent turns.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from agents.domains import episode
from agents.domains.base import Domain, Message, Outcome, Scenario
from agents.llm import LLMClient
from agents.paths import secret
from agents.simulators.scripted import ScriptedPersuadee
from agents.simulators.spec import SimulatorKind, SimulatorSpec, build


class HeldOutUnavailable(ValueError):
    """A held-out simulator this process cannot play (one inside the training process, or an
    endpoint whose key is not set)."""


@dataclass
class Agent:
    """The arm's side of the conversation: what its chat with a person would send."""

    client: LLMClient
    model: str
    system_prompt: str
    greeting: str
    params: dict[str, Any]
    tool_format: str


@dataclass
class Played:
    conversation: list[Message]
    outcome: Outcome
    end_reason: str | None


@dataclass
class User:
    """A held-out simulator: `reply` gives the next user message."""

    spec: dict[str, Any]
    rng: random.Random
    simulator: Any = None
    persuadee: ScriptedPersuadee | None = None
    clients: list[LLMClient] = field(default_factory=list)

    async def reply(
        self, domain: Domain, scenario: Scenario, conversation: list[Message], final: bool
    ) -> str:
        choices = domain.user_choices(scenario, conversation, final)
        if self.persuadee is not None:
            return self.persuadee.reply(conversation, choices)
        turn = await self.simulator.reply(domain, scenario, conversation, choices)
        return turn.text

    async def aclose(self) -> None:
        for client in self.clients:
            await client.aclose()


def heldout_panel(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The held-out simulators a checkpoint's run declared (its manifest's config)."""
    return [dict(spec) for spec in (manifest.get("config") or {}).get("heldout") or []]


def run_limits(manifest: dict[str, Any]) -> tuple[int, int]:
    """(max_turns, max_tool_rounds) of the checkpoint's run, as its held-out panel used them."""
    config = manifest.get("config") or {}
    # a run's defaults when its manifest does not say
    return int(config.get("max_turns", episode.MAX_TURNS)), int(
        config.get("max_tool_rounds", episode.MAX_TOOL_ROUNDS)
    )


def heldout_spec(table: dict[str, Any]) -> SimulatorSpec:
    """A `[[heldout]]` table as the SimulatorSpec training played, validated as training
    validates it (pydantic's ValidationError, a ValueError, for a table it would refuse). What
    studies adds to a table (a human-like simulator's `humanlike`, `imitates`) is not the
    simulator's, and an engine's replicas, a list of URLs, are named in the spec by the first."""
    known = {k: v for k, v in table.items() if k in SimulatorSpec.__dataclass_fields__}
    if isinstance(known.get("endpoint"), list):
        known["endpoint"] = known["endpoint"][0] if known["endpoint"] else ""
    return SimulatorSpec(**known)


def make_user(table: dict[str, Any], rng: random.Random) -> User:
    """The simulator a `[[heldout]]` table declares; HeldOutUnavailable when it runs only inside
    the training process (a local model folder, no endpoint)."""
    spec = heldout_spec(table)
    if spec.kind == SimulatorKind.SCRIPTED:
        return User(table, rng, persuadee=build(spec, rng=rng))
    if not spec.endpoint:
        raise HeldOutUnavailable(
            f"held-out simulator {spec.name!r} runs inside the training process (no endpoint): "
            "serve its model and name the endpoint in the run's config to evaluate against it here"
        )
    key = None
    if spec.api_key_env:
        key = secret(spec.api_key_env)
        if not key:
            raise HeldOutUnavailable(
                f"held-out simulator {spec.name!r}: environment variable {spec.api_key_env} is "
                "not set"
            )
    # every replica the table names (the spec keeps the first, for its provider's shaping)
    client = LLMClient(table["endpoint"], api_key=key, provider=spec.provider)
    return User(table, rng, simulator=build(spec, client, rng), clients=[client])


async def agent_turn(
    agent: Agent, domain: Domain, scenario: Scenario, state: Any, conversation: list[Message]
) -> bool:
    """One agent message (and its tool results) appended; True when it called tools."""
    chat = [*conversation]
    if agent.system_prompt:
        chat.insert(0, {"role": "system", "content": agent.system_prompt})
    tools = domain.tools(scenario) or None
    # Streamed, as the arm answers people: the endpoint is asked exactly as in a study's chat.
    async with agent.client.stream_chat(
        agent.model, chat, tools=tools, tool_format=agent.tool_format, **agent.params
    ) as stream:
        async for _ in stream:
            pass
    result = stream.result
    calls = result.tool_calls[: domain.max_tool_calls_per_turn] if tools else []
    message: Message = {"role": "assistant", "content": result.content}
    if calls:
        message["tool_calls"] = calls
    conversation.append(message)
    for call in calls:
        function = call.get("function", {})
        output = domain.execute_tool(
            state, function.get("name", ""), function.get("arguments") or "{}"
        )
        conversation.append(
            {
                "role": "tool",
                "tool_call_id": call.get("id", ""),
                "name": function.get("name", ""),
                "content": output if isinstance(output, str) else json.dumps(output),
            }
        )
    return bool(calls)


async def play(
    domain: Domain,
    scenario: Scenario,
    agent: Agent,
    user: User,
    max_turns: int = episode.MAX_TURNS,
    max_tool_rounds: int = episode.MAX_TOOL_ROUNDS,
) -> Played:
    """One conversation to its end, scored by the Domain."""
    max_turns = episode.turn_limit(domain, max_turns)
    state = domain.new_state(scenario)
    conversation: list[Message] = []
    greeting = agent.greeting or domain.greeting(scenario)
    if greeting:
        conversation.append({"role": "assistant", "content": greeting})
    agent_first, tool_rounds, end = episode.agent_first(domain), 0, None
    while end is None:
        if domain.next_speaker(conversation, agent_first) == episode.AGENT:
            called = await agent_turn(agent, domain, scenario, state, conversation)
            tool_rounds = episode.tool_rounds_after(tool_rounds, called)
        else:
            final = episode.user_final(conversation, max_turns)
            text = await user.reply(domain, scenario, conversation, final)
            conversation.append({"role": "user", "content": text})
        end = episode.end_reason(domain, conversation, max_turns, tool_rounds, max_tool_rounds)
    return Played(conversation, domain.score(conversation, state, end), end)
