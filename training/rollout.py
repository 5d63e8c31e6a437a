"""Rollouts: conversations between the agent and a user simulator on Domain tasks.

`play` runs a batch of conversations in lockstep: every conversation waiting for the agent gets
its next turn from one batched generate call, then every one waiting for the user likewise. The
agent's tool calls (the JSON format of agents.llm.tool_format) run through the Domain's
execute_tool; the Domain decides when a conversation is over and scores it.

Speakers in this process keep a Transcript per conversation (training/tokens.py). The agent's is
always tracked (its sampled ids are recorded and trained on); a trained simulator's too. A frozen
simulator is untracked: its history is the text it said, as with a simulator on an endpoint.
"""

from __future__ import annotations

import asyncio
import copy
import random
from dataclasses import dataclass, field
from typing import Any, Protocol

from agents.domains.base import Domain, Message, Outcome, Scenario
from agents.llm.tool_format import messages_for_json_tools, parse_tool_calls
from agents.simulators import (
    OPENING,
    PlainSimulator,
    VerbalizedSimulator,
    draw,
    parse_verbalized,
    user_view,
    verbalized_schema,
)
from training.config import SimulatorSpec
from training.policy import LocalModel
from training.tokens import Transcript

AGENT, USER = "agent", "user"


@dataclass
class Rollout:
    """One conversation, its two token transcripts, and how it ended."""

    scenario: Scenario
    state: Any
    tools: list[dict]
    conversation: list[Message] = field(default_factory=list)
    agent: Transcript = field(default_factory=Transcript)
    user: Transcript = field(default_factory=Transcript)
    end_reason: str | None = None
    outcome: Outcome | None = None
    tool_rounds: int = 0  # consecutive agent turns that called tools
    fallbacks: int = 0  # verbalized replies that fell back to raw text

    @classmethod
    def begin(cls, domain: Domain, scenario: Scenario) -> Rollout:
        rollout = cls(scenario, domain.new_state(scenario), domain.tools(scenario))
        greeting = domain.greeting(scenario)
        if greeting:
            rollout.conversation.append({"role": "assistant", "content": greeting})
        return rollout

    @property
    def reward(self) -> float:
        return self.outcome.reward if self.outcome else 0.0

    def next_speaker(self) -> str:
        last = self.conversation[-1] if self.conversation else None
        if last is None or (last["role"] == "assistant" and not last.get("tool_calls")):
            return USER
        return AGENT

    def add_agent_reply(self, domain: Domain, text: str) -> None:
        content, calls = parse_tool_calls(text) if self.tools else (text.strip(), [])
        calls = calls[: domain.max_tool_calls_per_turn]
        message: Message = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        self.conversation.append(message)
        for call in calls:
            name, arguments = call["function"]["name"], call["function"]["arguments"]
            result = domain.execute_tool(self.state, name, arguments)
            self.conversation.append(
                {"role": "tool", "tool_call_id": call["id"], "name": name, "content": str(result)}
            )
        self.tool_rounds = self.tool_rounds + 1 if calls else 0

    def add_user_reply(self, text: str) -> None:
        self.conversation.append({"role": "user", "content": text})

    def check_end(self, domain: Domain, max_turns: int, max_tool_rounds: int) -> None:
        turns = sum(
            1 for m in self.conversation if m["role"] in ("user", "assistant") and m.get("content")
        )
        self.end_reason = (
            domain.is_done(self.conversation)
            or ("max_turns" if turns >= max_turns else None)
            or ("max_tool_rounds" if self.tool_rounds >= max_tool_rounds else None)
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
    max_tool_rounds: int = 4,
) -> list[Rollout]:
    """Run one conversation per scenario to its end and score it with the Domain."""
    max_turns = min(max_turns, domain.max_turns)
    rollouts = [Rollout.begin(domain, s) for s in scenarios]
    while any(r.end_reason is None for r in rollouts):
        for speaker in (user, agent):
            waiting = [
                r for r in rollouts if r.end_reason is None and r.next_speaker() == speaker.role
            ]
            if waiting:
                speaker.respond(domain, waiting)
                for r in waiting:
                    r.check_end(domain, max_turns, max_tool_rounds)
    for r in rollouts:
        r.outcome = domain.score(r.conversation, r.state, r.end_reason)
    return rollouts


# -- the views each side's model sees ----------------------------------------------------------


def agent_messages(domain: Domain, rollout: Rollout) -> list[Message]:
    """The agent's new messages since its transcript last grew (system prompt first time)."""
    new = rollout.conversation[rollout.agent.consumed :]
    if rollout.agent.ids:
        return messages_for_json_tools(new, None)
    system = {"role": "system", "content": domain.agent_system_prompt(rollout.scenario)}
    return messages_for_json_tools([system, *new], rollout.tools)


def user_messages(system_prompt: str, rollout: Rollout) -> list[Message]:
    """The simulator's new messages (roles flipped by agents.simulators.user_view)."""
    new = user_view(rollout.conversation[rollout.user.consumed :])
    if rollout.user.ids:
        if new == [{"role": "user", "content": OPENING}]:
            new = [{"role": "user", "content": ""}]  # the agent said nothing visible
        return new
    return [{"role": "system", "content": system_prompt}, *new]


def with_persona(prompt: str, persona: str) -> str:
    """A simulator's system prompt with the extra persona text of its SimulatorSpec."""
    return f"{prompt}\n\n{persona}" if persona else prompt


# -- speakers in this process ------------------------------------------------------------------


class LocalAgent:
    """The agent as a LocalModel (the Policy being trained, or a frozen model in evaluation)."""

    role = AGENT

    def __init__(self, lm: LocalModel, temperature: float, max_new_tokens: int):
        self.lm, self.temperature, self.max_new_tokens = lm, temperature, max_new_tokens

    def respond(self, domain: Domain, rollouts: list[Rollout]) -> None:
        prompts = [r.agent.prompt(self.lm.fmt, agent_messages(domain, r)) for r in rollouts]
        samples = self.lm.sample(prompts, self.temperature, self.max_new_tokens)
        for r, ids in zip(rollouts, samples, strict=True):
            r.agent.record(self.lm.fmt, ids)
            # its own message is now in its ids; the tool results that follow it are not
            r.agent.consumed = len(r.conversation) + 1
            r.add_agent_reply(domain, self.lm.decode(ids))


class LocalUser:
    """A simulator as a LocalModel: plain or Verbalized Sampling; `tracked` when it is trained."""

    role = USER

    def __init__(
        self,
        lm: LocalModel,
        spec: SimulatorSpec,
        tracked: bool = False,
        rng: random.Random | None = None,
    ):
        self.lm, self.spec, self.tracked = lm, spec, tracked
        self.rng = rng or random.Random(0)
        self.verbalizer = None
        if spec.kind == "verbalized":
            # used for its system prompt, k, draw mode and retries; the model call is ours
            self.verbalizer = VerbalizedSimulator(
                None, "", k=spec.k, mode=spec.draw, retries=spec.retries, rng=self.rng
            )
        self._grammar = None

    def system_prompt(self, domain: Domain, scenario: Scenario) -> str:
        if self.verbalizer is not None:
            base = self.verbalizer.system_prompt(domain, scenario)
        else:
            base = domain.simulator_system_prompt(scenario)
        return with_persona(base, self.spec.persona)

    def respond(self, domain: Domain, rollouts: list[Rollout]) -> None:
        prompts = []
        for r in rollouts:
            messages = user_messages(self.system_prompt(domain, r.scenario), r)
            prompts.append(r.user.prompt(self.lm.fmt, messages))
            r.user.consumed = len(r.conversation)
        if self.verbalizer is not None:
            texts = self._verbalized(rollouts, prompts)
        else:
            samples = self.lm.sample(prompts, self.spec.temperature, self.spec.max_new_tokens)
            texts = []
            for r, ids in zip(rollouts, samples, strict=True):
                if self.tracked:
                    r.user.record(self.lm.fmt, ids)
                texts.append(self.lm.decode(ids).strip())
        for r, text in zip(rollouts, texts, strict=True):
            r.add_user_reply(text)
            if self.tracked:
                r.user.consumed = len(r.conversation)

    def _verbalized(self, rollouts: list[Rollout], prompts: list[list[int]]) -> list[str]:
        """k candidates per reply, one drawn; malformed output is re-asked `retries` times, then
        the raw text is used (the reference README's rule)."""
        texts: dict[int, str] = {}
        raw: dict[int, str] = {}
        pending = list(range(len(prompts)))
        for _ in range(self.verbalizer.retries + 1):
            samples = self.lm.sample(
                [prompts[i] for i in pending],
                self.spec.temperature,
                self.spec.max_new_tokens,
                self._constraint(),
            )
            failed = []
            for i, ids in zip(pending, samples, strict=True):
                raw[i] = self.lm.decode(ids)
                try:
                    candidates = parse_verbalized(raw[i], self.verbalizer.k)
                except ValueError:
                    failed.append(i)
                    continue
                texts[i] = draw(candidates, self.rng, self.verbalizer.mode).text
            pending = failed
            if not pending:
                break
        for i in pending:
            texts[i] = raw[i].strip()
            rollouts[i].fallbacks += 1
        return [texts[i] for i in range(len(prompts))]

    def _constraint(self) -> Any:
        """xgrammar's logits processor for the k-candidate schema (one per generate call), or
        None when xgrammar is not installed (then only retries and the fallback apply)."""
        try:
            import xgrammar
            from xgrammar.contrib.hf import LogitsProcessor
        except ImportError:
            return None
        if self._grammar is None:
            info = xgrammar.TokenizerInfo.from_huggingface(
                self.lm.tokenizer, vocab_size=self.lm.model.config.vocab_size
            )
            compiler = xgrammar.GrammarCompiler(info)
            # compact JSON and texts short enough that k of them fit in max_new_tokens: a small
            # model otherwise spends its budget on indentation and is cut off mid-object
            schema = copy.deepcopy(verbalized_schema(self.verbalizer.k))
            item = schema["properties"]["responses"]["items"]["properties"]
            item["text"]["maxLength"] = candidate_chars(self.spec.max_new_tokens, self.verbalizer.k)
            item["probability"].update(minimum=0, maximum=1)
            self._grammar = compiler.compile_json_schema(
                schema, any_whitespace=False, separators=(",", ":")
            )
        return LogitsProcessor(self._grammar)


def candidate_chars(max_new_tokens: int, k: int) -> int:
    """The longest candidate text (characters) such that k of them, with their JSON around them
    (about 12 tokens each), fit in max_new_tokens at about 3 characters per token."""
    return max(16, 3 * ((max_new_tokens - 8) // k - 12))


# -- a simulator on an endpoint ----------------------------------------------------------------


class EndpointUser:
    """A frozen simulator served over the OpenAI API (another model, a hosted API, vLLM), through
    agents.simulators and agents.llm. Its turns are not trained, so only text comes back."""

    role = USER

    def __init__(self, spec: SimulatorSpec, rng: random.Random | None = None):
        self.spec = spec
        self.rng = rng or random.Random(0)

    def _simulator(self, client: Any) -> Any:
        params = {"temperature": self.spec.temperature, "max_tokens": self.spec.max_new_tokens}
        if self.spec.kind == "verbalized":
            return VerbalizedSimulator(
                client, self.spec.model, k=self.spec.k, mode=self.spec.draw,
                retries=self.spec.retries, rng=self.rng, **params,
            )  # fmt: skip
        return PlainSimulator(client, self.spec.model, **params)

    def respond(self, domain: Domain, rollouts: list[Rollout]) -> None:
        turns = asyncio.run(self._replies(domain, rollouts))
        for r, turn in zip(rollouts, turns, strict=True):
            r.fallbacks += int(turn.fell_back)
            r.add_user_reply(turn.text)

    async def _replies(self, domain: Domain, rollouts: list[Rollout]) -> list[Any]:
        from agents.llm import LLMClient

        client = LLMClient(self.spec.endpoint)
        try:
            simulator = self._simulator(client)
            base = simulator.system_prompt  # the same prompt as in-process, persona included
            simulator.system_prompt = lambda d, s: with_persona(base(d, s), self.spec.persona)
            return await asyncio.gather(
                *(simulator.reply(domain, r.scenario, r.conversation) for r in rollouts)
            )
        finally:
            close = getattr(client, "aclose", None)
            if close is not None:
                await close()


# -- the agent on a vLLM server ----------------------------------------------------------------


class EndpointAgent:
    """The agent's turns sampled by a vLLM server from this process's token ids, so transcripts
    keep the exact sampled ids: `/v1/completions` with a token-id prompt and `return_token_ids`
    (LLMClient.complete). After each update the trainer saves the LoRA adapter and
    `load(folder, name)` makes the server sample from it (vLLM needs --enable-lora,
    VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and the folder on a filesystem it sees)."""

    role = AGENT

    def __init__(self, base_url: str, lm: LocalModel, temperature: float, max_new_tokens: int):
        self.base_url, self.lm = base_url, lm
        self.temperature, self.max_new_tokens = temperature, max_new_tokens
        self.model = ""  # the served adapter's name; set by load()

    def load(self, folder: str, name: str) -> None:
        asyncio.run(self._load(str(folder), name))

    async def _load(self, folder: str, name: str) -> None:
        from agents.llm import LLMClient

        async with LLMClient(self.base_url, timeout=120) as client:
            # replace: a resumed run may name an adapter its previous process already loaded
            await client.load_lora_adapter(name, folder, replace=True)
            previous, self.model = self.model, name
            if previous and previous != name:
                await client.unload_lora_adapter(previous)

    def respond(self, domain: Domain, rollouts: list[Rollout]) -> None:
        if not self.model:
            raise RuntimeError("EndpointAgent.load() must name the served adapter first")
        prompts = [r.agent.prompt(self.lm.fmt, agent_messages(domain, r)) for r in rollouts]
        samples = asyncio.run(self._complete_all(prompts))
        for r, ids in zip(rollouts, samples, strict=True):
            r.agent.record(self.lm.fmt, ids)
            r.agent.consumed = len(r.conversation) + 1
            r.add_agent_reply(domain, self.lm.decode(ids))

    async def _complete_all(self, prompts: list[list[int]]) -> list[list[int]]:
        from agents.llm import LLMClient

        async with LLMClient(self.base_url, timeout=600) as client:
            return await asyncio.gather(*(self._complete(client, p) for p in prompts))

    async def _complete(self, client: Any, prompt: list[int]) -> list[int]:
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
