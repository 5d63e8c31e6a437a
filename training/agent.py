"""The agent as a Speaker: a model in this process (the Policy being trained, or a frozen one in
evaluation), or the Policy's adapter sampled by a vLLM server. Its replies' tool calls are run by
the Domain.
"""

from __future__ import annotations

from agents.domains.base import Domain, Message
from agents.llm.tool_format import messages_for_json_tools, parse_tool_calls
from training.endpoint import ServedAdapter
from training.policy import LocalModel
from training.rollout import AGENT, Rollout
from training.turns import speak


def agent_messages(domain: Domain, rollout: Rollout) -> list[Message]:
    """The agent's new messages since its transcript last grew (system prompt first time)."""
    new = rollout.conversation[rollout.agent.consumed :]
    if rollout.agent.ids:
        return messages_for_json_tools(new, None)
    system = {"role": "system", "content": domain.agent_system_prompt(rollout.scenario)}
    return messages_for_json_tools([system, *new], rollout.tools)


def add_agent_reply(domain: Domain, rollout: Rollout, text: str) -> None:
    """The agent's text as its message; its tool calls (the JSON format of
    agents.llm.tool_format, at most the Domain's max_tool_calls_per_turn) are run by the
    Domain's execute_tool and their results follow it."""
    content, calls = parse_tool_calls(text) if rollout.tools else (text.strip(), [])
    calls = calls[: domain.max_tool_calls_per_turn]
    message: Message = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    rollout.conversation.append(message)
    for call in calls:
        name, arguments = call["function"]["name"], call["function"]["arguments"]
        result = domain.execute_tool(rollout.state, name, arguments)
        rollout.conversation.append(
            {"role": "tool", "tool_call_id": call["id"], "name": name, "content": str(result)}
        )
    rollout.tool_rounds = rollout.tool_rounds + 1 if calls else 0


class LocalAgent:
    """The agent as a LocalModel (the Policy being trained, or a frozen model in evaluation)."""

    role = AGENT

    def __init__(self, lm: LocalModel, temperature: float, max_new_tokens: int):
        self.lm, self.temperature, self.max_new_tokens = lm, temperature, max_new_tokens

    def respond(self, domain: Domain, rollouts: list[Rollout]) -> None:
        prompts = [r.agent.prompt(self.lm.fmt, agent_messages(domain, r)) for r in rollouts]
        allowed = [domain.agent_choices(r.scenario, r.conversation) for r in rollouts]
        turns = speak(self.lm, AGENT, rollouts, prompts, allowed, self.temperature,
                      self.max_new_tokens, None)  # fmt: skip
        for r, (ids, positions, text) in zip(rollouts, turns, strict=True):
            r.agent.record(self.lm.fmt, ids, positions)
            # its own message is now in its ids; the tool results that follow it are not
            r.agent.consumed = len(r.conversation) + 1
            add_agent_reply(domain, r, text)


class EndpointAgent(ServedAdapter):
    """The agent's turns sampled by a vLLM server from this process's token ids, from the
    adapter the trainer publishes before each step (training/endpoint.py's ServedAdapter)."""

    role = AGENT

    def respond(self, domain: Domain, rollouts: list[Rollout]) -> None:
        if any(domain.agent_choices(r.scenario, r.conversation) for r in rollouts):
            raise ValueError(
                f"{domain.name} constrains the agent's turns to fixed choices, which need the "
                "agent in this process: leave rollout_endpoint empty"
            )
        prompts = [r.agent.prompt(self.lm.fmt, agent_messages(domain, r)) for r in rollouts]
        samples = self.sample(prompts)
        for r, ids in zip(rollouts, samples, strict=True):
            r.agent.record(self.lm.fmt, ids)
            r.agent.consumed = len(r.conversation) + 1
            add_agent_reply(domain, r, self.lm.decode(ids))
