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

import torch

from agents.domains.base import Domain, Message, Outcome, Scenario, count_turns
from agents.domains.p4g.donation import marker
from agents.llm.tool_format import messages_for_json_tools, parse_tool_calls
from agents.simulators import (
    OPENING,
    PlainSimulator,
    VerbalizedSampling,
    VerbalizedSimulator,
    user_view,
)
from agents.simulators.scripted import ScriptedPersuadee
from training.choices import entropy
from training.config import SimulatorSpec
from training.policy import LocalModel
from training.tokens import Transcript

AGENT, USER = "agent", "user"


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
    conversation: list[Message] = field(default_factory=list)
    agent: Transcript = field(default_factory=Transcript)
    user: Transcript = field(default_factory=Transcript)
    end_reason: str | None = None
    outcome: Outcome | None = None
    tool_rounds: int = 0  # consecutive agent turns that called tools
    fallbacks: int = 0  # verbalized replies that fell back to raw text
    agent_first: bool = False
    max_turns: int = 0  # set by play(): the user's last message is its `final` one
    decisions: list[Decision] = field(default_factory=list)
    index: int = 0  # position in play()'s batch
    member: str = "current"  # population: which simulator played the user
    redraw_reward: float | None = None  # the reward had the user's last choice been redrawn

    @classmethod
    def begin(cls, domain: Domain, scenario: Scenario) -> Rollout:
        rollout = cls(scenario, domain.new_state(scenario), domain.tools(scenario))
        rollout.agent_first = domain.first_speaker == AGENT
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
        return count_turns(self.conversation) + 1 >= self.max_turns

    @property
    def reward(self) -> float:
        return self.outcome.reward if self.outcome else 0.0

    def next_speaker(self) -> str:
        last = self.conversation[-1] if self.conversation else None
        if last is None:
            return AGENT if self.agent_first else USER
        if last["role"] == "assistant" and not last.get("tool_calls"):
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
        self.end_reason = (
            domain.is_done(self.conversation)
            or ("max_turns" if count_turns(self.conversation) >= max_turns else None)
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
    redraw: random.Random | None = None,
) -> list[Rollout]:
    """Run one conversation per scenario to its end and score it with the Domain.

    With `redraw`, a conversation that ended on a user choice turn is also scored with that
    choice drawn a second time from the same distribution (`redraw_reward`): two simulator
    draws per agent message, which split the reward's variance into the simulator's part and
    the agent's (training/collapse.py)."""
    max_turns = min(max_turns, domain.max_turns)
    rollouts = [Rollout.begin(domain, s) for s in scenarios]
    for i, r in enumerate(rollouts):
        r.max_turns, r.index = max_turns, i
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
        allowed = [domain.agent_choices(r.scenario, r.conversation) for r in rollouts]
        turns = speak(self.lm, AGENT, rollouts, prompts, allowed, self.temperature,
                      self.max_new_tokens, None)  # fmt: skip
        for r, (ids, positions, text) in zip(rollouts, turns, strict=True):
            r.agent.record(self.lm.fmt, ids, positions)
            # its own message is now in its ids; the tool results that follow it are not
            r.agent.consumed = len(r.conversation) + 1
            r.add_agent_reply(domain, text)


def speak(
    lm: LocalModel,
    role: str,
    rollouts: list[Rollout],
    prompts: list[list[int]],
    allowed: list[list[str] | None],
    temperature: float,
    max_new_tokens: int,
    rng: random.Random | None,
) -> list[tuple[list[int], list[list[int]] | None, str]]:
    """Each rollout's next turn from `lm`: sampled text, or a choice among `allowed[i]` drawn
    from its exact distribution (recorded on the rollout as a Decision). Returns (sampled ids,
    per-position allowed ids for a choice, text)."""
    turns: list[Any] = [None] * len(rollouts)
    free = [i for i, texts in enumerate(allowed) if not texts]
    if free:
        samples = lm.sample([prompts[i] for i in free], temperature, max_new_tokens)
        for i, ids in zip(free, samples, strict=True):
            turns[i] = (ids, None, lm.decode(ids).strip())
    groups: dict[tuple[str, ...], list[int]] = {}
    for i, texts in enumerate(allowed):
        if texts:
            groups.setdefault(tuple(texts), []).append(i)
    for texts, members in groups.items():
        choices, dists = lm.choice_probs([prompts[i] for i in members], list(texts), temperature)
        for i, probs in zip(members, dists, strict=True):
            n = sample_index(probs, rng)
            rollouts[i].decisions.append(Decision(role, list(texts), probs, n))
            turns[i] = (choices.ids[n], choices.allowed(n), texts[n])
    return turns


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
        self.sampling = (
            VerbalizedSampling(spec.k, spec.draw, spec.retries)
            if spec.kind == "verbalized"
            else None
        )
        self._grammars: dict[tuple[str, ...] | None, Any] = {}

    def system_prompt(self, domain: Domain, scenario: Scenario) -> str:
        base = domain.simulator_system_prompt(scenario)
        if self.sampling is not None:
            base = self.sampling.system_prompt(base)
        return with_persona(base, self.spec.persona)

    def respond(self, domain: Domain, rollouts: list[Rollout]) -> None:
        prompts = []
        for r in rollouts:
            messages = user_messages(self.system_prompt(domain, r.scenario), r)
            prompts.append(r.user.prompt(self.lm.fmt, messages))
            r.user.consumed = len(r.conversation)
        allowed = [domain.user_choices(r.scenario, r.conversation, r.user_final) for r in rollouts]
        if self.sampling is not None:
            texts = self._verbalized(rollouts, prompts, allowed)
        else:
            turns = speak(self.lm, USER, rollouts, prompts, allowed, self.spec.temperature,
                          self.spec.max_new_tokens, self.rng)  # fmt: skip
            texts = []
            for r, (ids, positions, text) in zip(rollouts, turns, strict=True):
                if self.tracked:
                    r.user.record(self.lm.fmt, ids, positions)
                texts.append(text)
        for r, text in zip(rollouts, texts, strict=True):
            r.add_user_reply(text)
            if self.tracked:
                r.user.consumed = len(r.conversation)

    def _verbalized(
        self, rollouts: list[Rollout], prompts: list[list[int]], allowed: list[list[str] | None]
    ) -> list[str]:
        """k candidates per reply, one drawn, by agents.simulators' VerbalizedSampling (its
        retries and raw-text fallback too). On a choice turn every candidate's text is
        constrained to the allowed texts (the P4G markers), and the distribution the simulator
        wrote is recorded as its Decision."""
        answers = [self.sampling.answer(self.rng, options) for options in allowed]
        groups: dict[tuple[str, ...] | None, list[int]] = {}
        for i, options in enumerate(allowed):
            groups.setdefault(tuple(options) if options else None, []).append(i)
        for options, pending in groups.items():
            while pending:  # one generate call per attempt, for every answer still unread
                samples = self.lm.sample(
                    [prompts[i] for i in pending],
                    self.spec.temperature,
                    self.spec.max_new_tokens,
                    self._constraint(options),
                )
                for i, ids in zip(pending, samples, strict=True):
                    answers[i].take(self.lm.decode(ids))
                pending = [i for i in pending if not answers[i].done]
        for r, answer, options in zip(rollouts, answers, allowed, strict=True):
            turn = answer.turn
            if turn.fell_back:
                r.fallbacks += 1
            elif options:
                probs = self.sampling.distribution(turn.candidates, options)
                r.decisions.append(Decision(USER, list(options), probs, options.index(turn.text)))
        return [answer.turn.text for answer in answers]

    def _constraint(self, options: tuple[str, ...] | None = None) -> Any:
        """xgrammar's logits processor for the k-candidate schema (one per generate call), or
        None when xgrammar is not installed (then only retries and the fallback apply)."""
        try:
            import xgrammar
            from xgrammar.contrib.hf import LogitsProcessor
        except ImportError:
            return None
        if options not in self._grammars:
            info = xgrammar.TokenizerInfo.from_huggingface(
                self.lm.tokenizer, vocab_size=self.lm.model.config.vocab_size
            )
            compiler = xgrammar.GrammarCompiler(info)
            # compact JSON and texts short enough that k of them fit in max_new_tokens: a small
            # model otherwise spends its budget on indentation and is cut off mid-object
            schema = copy.deepcopy(self.sampling.schema(options))
            item = schema["properties"]["responses"]["items"]["properties"]
            if not options:
                item["text"]["maxLength"] = candidate_chars(
                    self.spec.max_new_tokens, self.sampling.k
                )
            item["probability"].update(minimum=0, maximum=1)
            self._grammars[options] = compiler.compile_json_schema(
                schema, any_whitespace=False, separators=(",", ":")
            )
        return LogitsProcessor(self._grammars[options])


class ScriptedUser:
    """A scripted persuadee type (agents/simulators/scripted.py) as a Speaker: a held-out user
    that shares no weights with anything trained. Its choice turns record their exact
    distribution."""

    role = USER

    def __init__(self, spec: SimulatorSpec, rng: random.Random | None = None):
        self.spec = spec
        self.rng = rng or random.Random(0)
        self.persuadee = ScriptedPersuadee(spec.script, self.rng)

    def respond(self, domain: Domain, rollouts: list[Rollout]) -> None:
        for r in rollouts:
            options = domain.user_choices(r.scenario, r.conversation, r.user_final)
            text = self.persuadee.reply(r.conversation, options)
            if options:
                dist = self.persuadee.decision(r.conversation)
                probs = [sum(p for a, p in dist.items() if marker(a) == o) for o in options]
                r.decisions.append(Decision(USER, list(options), probs, options.index(text)))
            r.add_user_reply(text)


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

        client = LLMClient(self.spec.endpoint, api_key=self.spec.api_key())
        try:
            simulator = self._simulator(client)
            base = simulator.system_prompt  # the same prompt as in-process, persona included
            simulator.system_prompt = lambda d, s: with_persona(base(d, s), self.spec.persona)
            return await asyncio.gather(
                *(
                    simulator.reply(
                        domain, r.scenario, r.conversation,
                        domain.user_choices(r.scenario, r.conversation, r.user_final),
                    )
                    for r in rollouts
                )
            )  # fmt: skip
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
        if any(domain.agent_choices(r.scenario, r.conversation) for r in rollouts):
            raise ValueError(
                f"{domain.name} constrains the agent's turns to fixed choices, which need the "
                "agent in this process: leave rollout_endpoint empty"
            )
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
