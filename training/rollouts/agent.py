"""The agent as a Speaker: a model in this process (the Policy being trained, or a frozen one in
evaluation), or the Policy's adapter sampled by a vLLM server. Its replies' tool calls are run by
the Domain.

Its tool format (RunConfig.tool_format, resolved by `agent_tool_format`): "json", agents.llm's
JSON `<tool_call>` blocks described in the system prompt (SmolLM2, whose template ignores tools),
or "native", the chat template's own (Qwen3's Hermes style, agents.llm.native_tools): the
opening is rendered with the tools, results are the template's `tool` turns, and a sampled reply
is read by the rule of vLLM's hermes parser, so a call counts here exactly when it would count
served by vLLM.
"""

from __future__ import annotations

from agents.domains import episode
from agents.domains.base import Domain, Message
from agents.domains.episode import AGENT
from agents.llm.native_tools import (
    parse_hermes_tool_calls,
    resolve_tool_format,
    template_messages,
    template_tool_style,
)
from agents.llm.tool_format import messages_for_json_tools, parse_tool_calls
from training.config_keys import ConfigError
from training.rl.policy import LocalModel
from training.rl.tokens import ChatFormat
from training.rollouts.rollout import Rollout
from training.rollouts.served import ServedAdapter
from training.rollouts.turns import speak
from training.rollouts.weight_sync import ServedWeights


def agent_tool_format(tool_format: str, lm: LocalModel) -> str:
    """RunConfig.tool_format for this model's chat template: "json" or "native"."""
    try:
        return resolve_tool_format(tool_format, template_tool_style(lm.tokenizer))
    except ValueError as error:
        raise ConfigError(str(error), "tool_format") from error


def agent_messages(domain: Domain, rollout: Rollout, tool_format: str = "json") -> list[Message]:
    """The agent's new messages since its transcript last grew (system prompt first time). In
    the native format the tools are not among them: `agent_prompt` gives them to the template."""
    new = domain.agent_view(rollout.conversation[rollout.agent.consumed :])
    if not rollout.agent.ids:
        new = [{"role": "system", "content": domain.agent_system_prompt(rollout.scenario)}, *new]
    if tool_format == "native":
        return template_messages(new)
    return messages_for_json_tools(new, None if rollout.agent.ids else rollout.tools)


def agent_prompt(
    fmt: ChatFormat, domain: Domain, rollout: Rollout, tool_format: str = "json"
) -> list[int]:
    """Grow the agent's transcript by its new messages; the ids it samples its turn from."""
    tools = rollout.tools if tool_format == "native" and not rollout.agent.ids else None
    return rollout.agent.prompt(fmt, agent_messages(domain, rollout, tool_format), tools)


def add_agent_reply(domain: Domain, rollout: Rollout, text: str, tool_format: str = "json") -> None:
    """The agent's text as its message; its tool calls (in its tool format, at most the
    Domain's max_tool_calls_per_turn) are run by the Domain's execute_tool and their results
    follow it."""
    parse = parse_hermes_tool_calls if tool_format == "native" else parse_tool_calls
    content, calls = parse(text) if rollout.tools else (text.strip(), [])
    calls = calls[: domain.max_tool_calls_per_turn]
    rollout.add_message(AGENT, content, calls, domain)
    rollout.tool_rounds = episode.tool_rounds_after(rollout.tool_rounds, bool(calls))


class LocalAgent:
    """The agent as a LocalModel (the Policy being trained, or a frozen model in evaluation)."""

    role = AGENT

    def __init__(
        self, lm: LocalModel, temperature: float, max_new_tokens: int, tool_format: str = "json"
    ):
        self.lm, self.temperature, self.max_new_tokens = lm, temperature, max_new_tokens
        self.tool_format = tool_format  # "json" | "native": agent_tool_format's

    def respond(self, domain: Domain, rollouts: list[Rollout]) -> None:
        fmt, tool_format = self.lm.fmt, self.tool_format
        prompts = [agent_prompt(fmt, domain, r, tool_format) for r in rollouts]
        allowed = [domain.agent_choices(r.scenario, r.conversation) for r in rollouts]
        turns = speak(
            self.lm, AGENT, rollouts, prompts, allowed, self.temperature, self.max_new_tokens, None
        )
        for r, (ids, positions, text) in zip(rollouts, turns, strict=True):
            r.agent.record(self.lm.fmt, ids, positions)
            # its own message is now in its ids; the tool results that follow it are not
            r.agent.consumed = len(r.conversation) + 1
            add_agent_reply(domain, r, text, tool_format)


class ServedAgent:
    """The agent's turns sampled by a vLLM server from this process's token ids; its subclasses
    say how the server gets the trainer's weights before each step."""

    role = AGENT
    tool_format = "json"  # "json" | "native": agent_tool_format's, set by its owner

    def respond(self, domain: Domain, rollouts: list[Rollout]) -> None:
        if any(domain.agent_choices(r.scenario, r.conversation) for r in rollouts):
            raise ValueError(
                f"{domain.name} constrains the agent's turns to fixed choices, which need the "
                "agent in this process: leave rollout_endpoint empty"
            )
        prompts = [agent_prompt(self.lm.fmt, domain, r, self.tool_format) for r in rollouts]
        samples = self.sample(prompts)
        for r, ids in zip(rollouts, samples, strict=True):
            r.agent.record(self.lm.fmt, ids)
            r.agent.consumed = len(r.conversation) + 1
            add_agent_reply(domain, r, self.lm.decode(ids), self.tool_format)


class EndpointAgent(ServedAgent, ServedAdapter):
    """LoRA: the adapter the trainer publishes before each step, hot-loaded by the server
    (training/rollouts/served.py's ServedAdapter)."""


class WeightSyncedAgent(ServedAgent, ServedWeights):
    """Full fine-tuning: the weights the trainer pushes into the served model before each
    step through vLLM's weight-transfer API (training/rollouts/weight_sync.py)."""
