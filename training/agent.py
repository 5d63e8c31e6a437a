"""The agent as a Speaker: a model in this process (the Policy being trained, or a frozen one in
evaluation), or the Policy's adapter sampled by a vLLM server. Its replies' tool calls are run by
the Domain.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agents.domains.base import Domain, Message
from agents.llm import LLMClient
from agents.llm.tool_format import messages_for_json_tools, parse_tool_calls
from training.endpoint import Endpoint
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


class EndpointAgent:
    """The agent's turns sampled by a vLLM server from this process's token ids, so transcripts
    keep the exact sampled ids: `/v1/completions` with a token-id prompt and `return_token_ids`
    (LLMClient.complete). After each update the trainer saves the LoRA adapter and
    `load(folder, name)` makes the server sample from it (vLLM needs --enable-lora,
    VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and the folder on a filesystem it sees). One client
    serves every load and turn of the run (training/endpoint.py)."""

    role = AGENT

    def __init__(self, base_url: str, lm: LocalModel, temperature: float, max_new_tokens: int):
        self.base_url, self.lm = base_url, lm
        self.temperature, self.max_new_tokens = temperature, max_new_tokens
        self.model = ""  # the served adapter's name; set by load()
        self.endpoint = Endpoint(lambda: LLMClient(base_url, timeout=600))

    def load(self, folder: str, name: str) -> None:
        self.endpoint.run(lambda client: self._load(client, str(folder), name))

    async def _load(self, client: LLMClient, folder: str, name: str) -> None:
        # replace: a resumed run may name an adapter its previous process already loaded
        await client.load_lora_adapter(name, folder, replace=True)
        previous, self.model = self.model, name
        if previous and previous != name:
            await client.unload_lora_adapter(previous)

    def respond(self, domain: Domain, rollouts: list[Rollout]) -> None:
        if not self.model:
            raise RuntimeError("EndpointAgent.load() must name the served adapter first")
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

    def sample(self, prompts: list[list[int]]) -> list[list[int]]:
        """Each prompt's turn as the server sampled it (ids, ending with its stop token)."""
        return self.endpoint.run(
            lambda client: asyncio.gather(*(self._complete(client, p) for p in prompts))
        )

    def close(self) -> None:
        self.endpoint.close()

    async def _complete(self, client: LLMClient, prompt: list[int]) -> list[int]:
        result = await client.complete(
            self.model,
            prompt,
            return_token_ids=True,
            max_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_p=1.0,
            top_k=-1,
            stop_token_ids=self.lm.stop_ids,
            skip_special_tokens=False,
        )
        return turn_ids(result, self.lm.stop_ids)


def turn_ids(result: Any, stop_ids: list[int]) -> list[int]:
    """A completion's sampled ids ending with the stop token that ended the turn. vLLM 0.32
    returns it in token_ids; should a server leave it out, it is added back (stop_reason names
    it; None means eos), so the transcript closes the turn as in-process sampling does."""
    ids = list(result.token_ids)
    if result.finish_reason == "stop" and (not ids or ids[-1] not in stop_ids):
        reason = result.stop_reason
        ids.append(reason if isinstance(reason, int) else stop_ids[0])
    return ids
