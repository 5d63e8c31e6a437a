"""An arm's model in conversation with one of a training run's held-out simulators, through
agents/llm, scored by the Domain: the simulated half of the sim-to-real gap (studies/research/simulator_evaluations.py).

The agent is the arm as people meet it: its endpoint, model, system prompt, greeting, generation
settings and tool format, the Domain's tools run on the conversation's own state. The user is the
held-out simulator as the run's config declares it (`[[heldout]]`): a scripted persuadee type, or
a plain or Verbalized Sampling simulator on its endpoint. The turn rules are the training
rollouts' (training/rollouts/rollout.py): the Domain ends the conversation, else the run's max_turns
(capped by the Domain's) or max_tool_rounds consecutive tool-calling agent turns.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from agents.domains.base import Domain, Message, Outcome, Scenario, count_turns
from agents.llm import LLMClient
from agents.llm.providers import sampling_params
from agents.paths import secret
from agents.simulators import PlainSimulator, VerbalizedSimulator
from agents.simulators.scripted import ScriptedPersuadee

# The run config's defaults (training/config.py RunConfig) when a manifest does not say.
MAX_TURNS = 10
MAX_TOOL_ROUNDS = 4


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
    return int(config.get("max_turns", MAX_TURNS)), int(
        config.get("max_tool_rounds", MAX_TOOL_ROUNDS)
    )


def make_user(spec: dict[str, Any], rng: random.Random) -> User:
    """The simulator a `[[heldout]]` table declares; HeldOutUnavailable when it runs only inside
    the training process (a local model folder, no endpoint)."""
    name, kind = spec.get("name", "?"), spec.get("kind", "plain")
    if kind == "scripted":
        return User(spec, rng, persuadee=ScriptedPersuadee(spec.get("script", ""), rng))
    if not spec.get("endpoint"):
        raise HeldOutUnavailable(
            f"held-out simulator {name!r} runs inside the training process (no endpoint): serve "
            "its model and name the endpoint in the run's config to evaluate against it here"
        )
    key = None
    if spec.get("api_key_env"):
        key = secret(spec["api_key_env"])
        if not key:
            raise HeldOutUnavailable(
                f"held-out simulator {name!r}: environment variable {spec['api_key_env']} is not set"
            )
    # shaped for its provider as in training (agents/simulators/spec.py SimulatorSpec.request_params)
    client = LLMClient(spec["endpoint"], api_key=key, provider=spec.get("provider", "auto"))
    params = sampling_params(
        spec.get("temperature", 0.7),
        spec.get("max_new_tokens", 64),
        spec.get("top_p", 1.0),
        spec.get("reasoning_effort", ""),
    )
    if kind == "verbalized":
        simulator = VerbalizedSimulator(
            client, spec["model"], k=spec.get("k", 5), mode=spec.get("draw", "probability"),
            retries=spec.get("retries", 2), rng=rng, **params,
        )  # fmt: skip
    else:
        simulator = PlainSimulator(client, spec["model"], retries=spec.get("retries", 2), **params)
    persona = spec.get("persona", "")
    if persona:  # the same prompt as the training process gives it (training/rollouts/simulator.py)
        base = simulator.system_prompt
        simulator.system_prompt = lambda d, s: f"{base(d, s)}\n\n{persona}"
    return User(spec, rng, simulator=simulator, clients=[client])


def _next_is_agent(conversation: list[Message], agent_first: bool) -> bool:
    if not conversation:
        return agent_first
    last = conversation[-1]
    return not (last["role"] == "assistant" and not last.get("tool_calls"))


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
    max_turns: int = MAX_TURNS,
    max_tool_rounds: int = MAX_TOOL_ROUNDS,
) -> Played:
    """One conversation to its end, scored by the Domain."""
    max_turns = min(max_turns, domain.max_turns)
    state = domain.new_state(scenario)
    conversation: list[Message] = []
    greeting = agent.greeting or domain.greeting(scenario)
    if greeting:
        conversation.append({"role": "assistant", "content": greeting})
    agent_first, tool_rounds, end = domain.first_speaker == "agent", 0, None
    while end is None:
        if _next_is_agent(conversation, agent_first):
            called = await agent_turn(agent, domain, scenario, state, conversation)
            tool_rounds = tool_rounds + 1 if called else 0
        else:
            final = count_turns(conversation) + 1 >= max_turns
            text = await user.reply(domain, scenario, conversation, final)
            conversation.append({"role": "user", "content": text})
        end = (
            domain.is_done(conversation)
            or ("max_turns" if count_turns(conversation) >= max_turns else None)
            or ("max_tool_rounds" if tool_rounds >= max_tool_rounds else None)
        )
    return Played(conversation, domain.score(conversation, state, end), end)
