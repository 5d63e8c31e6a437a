"""The user as a Speaker: a simulator in this process (plain or Verbalized Sampling; `tracked`
when it is trained), a co-trained simulator sampled on vLLM (ServedUser), a scripted held-out
persuadee, or a frozen simulator on an endpoint (plain or Verbalized Sampling, any
OpenAI-compatible server, hosted ones included).
"""

from __future__ import annotations

import asyncio
import copy
import random
from typing import Any

from agents.domains.base import Domain, Message, Scenario
from agents.domains.episode import USER
from agents.domains.p4g.donation import marker
from agents.llm import LLMClient
from agents.simulators import (
    OPENING,
    Simulator,
    UserTurn,
    VerbalizedSampling,
)
from agents.simulators.spec import SimulatorKind, SimulatorSpec, build, spec_prompt
from training.config_schema import simulator_api_key
from training.rl.policy import LocalModel
from training.rollouts.rollout import Decision, Rollout
from training.rollouts.served import Endpoint, ServedAdapter
from training.rollouts.turns import speak
from training.rollouts.weight_sync import ServedWeights


def user_messages(domain: Domain, system_prompt: str, rollout: Rollout) -> list[Message]:
    """The simulator's new messages, as the Domain's user_view shows them (by default roles
    flipped and tool traffic dropped: agents.messages.user_view)."""
    new = domain.user_view(rollout.conversation[rollout.user.consumed :])
    if rollout.user.ids:
        if new == [{"role": "user", "content": OPENING}]:
            new = [{"role": "user", "content": ""}]  # the agent said nothing visible
        return new
    return [{"role": "system", "content": system_prompt}, *new]


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
            if spec.kind == SimulatorKind.VERBALIZED
            else None
        )
        self._grammars: dict[tuple[str, ...] | None, Any] = {}

    def system_prompt(self, domain: Domain, scenario: Scenario) -> str:
        base = domain.simulator_system_prompt(scenario)
        if self.sampling is not None:
            base = self.sampling.system_prompt(base)
        return spec_prompt(base, self.spec)

    def respond(self, domain: Domain, rollouts: list[Rollout]) -> None:
        prompts = []
        for r in rollouts:
            messages = user_messages(domain, self.system_prompt(domain, r.scenario), r)
            prompts.append(r.user.prompt(self.lm.fmt, messages))
            r.user.consumed = len(r.conversation)
        allowed = [domain.user_choices(r.scenario, r.conversation, r.user_final) for r in rollouts]
        if self.sampling is not None:
            texts = self._verbalized(rollouts, prompts, allowed)
        else:
            turns = self._speak(rollouts, prompts, allowed)
            texts = []
            for r, (ids, positions, text) in zip(rollouts, turns, strict=True):
                if self.tracked:
                    r.user.record(self.lm.fmt, ids, positions)
                texts.append(text)
        for r, text in zip(rollouts, texts, strict=True):
            if self.tracked:  # its message is in its ids now; its tool results are not
                r.user.consumed = len(r.conversation) + 1
            r.add_user_reply(domain, text)

    def _speak(
        self, rollouts: list[Rollout], prompts: list[list[int]], allowed: list[list[str] | None]
    ) -> list[tuple[list[int], list[list[int]] | None, str]]:
        return speak(
            self.lm,
            USER,
            rollouts,
            prompts,
            allowed,
            self.spec.temperature,
            self.spec.max_new_tokens,
            self.rng,
        )

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
                    caches=[rollouts[i].user.cache for i in pending],
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


class ServedUser(LocalUser):
    """A co-trained simulator whose free-text turns a vLLM server samples from its adapter, or
    under full fine-tuning from its weights, as the agent's are (training/rollouts/served.py's
    ServedAdapter: token-id prompts, the exact sampled ids back, the adapter published after
    each update; weight_sync.py's ServedWeights: the weights pushed into the served model
    through vLLM's weight-transfer API). Its choice turns are drawn in this
    process from their exact distribution: the trained weights are here anyway for the update,
    and the loss needs that distribution's restriction."""

    def __init__(
        self,
        lm: LocalModel,
        spec: SimulatorSpec,
        rng: random.Random | None = None,
        nccl_host: str = "127.0.0.1",
        backend: str = "auto",
    ):
        super().__init__(lm, spec, tracked=True, rng=rng)
        args = (spec.endpoint, lm, spec.temperature, spec.max_new_tokens)
        if getattr(lm, "finetune", "lora") == "full":  # its weights pushed after each update
            self.server = ServedWeights(
                *args, api_key=simulator_api_key(spec), backend=backend, nccl_host=nccl_host
            )
        else:  # its adapter hot-loaded after each update
            self.server = ServedAdapter(*args, api_key=simulator_api_key(spec))

    def _speak(
        self, rollouts: list[Rollout], prompts: list[list[int]], allowed: list[list[str] | None]
    ) -> list[tuple[list[int], list[list[int]] | None, str]]:
        return speak(
            self.lm,
            USER,
            rollouts,
            prompts,
            allowed,
            self.spec.temperature,
            self.spec.max_new_tokens,
            self.rng,
            sample=self.server.sample,
        )

    def close(self) -> None:
        self.server.close()


class ScriptedUser:
    """A scripted persuadee type (agents/simulators/scripted.py) as a Speaker: a held-out user
    that shares no weights with anything trained. Its choice turns record their exact
    distribution."""

    role = USER

    def __init__(self, spec: SimulatorSpec, rng: random.Random | None = None):
        self.spec = spec
        self.rng = rng or random.Random(0)
        self.persuadee = build(spec, rng=self.rng)

    def respond(self, domain: Domain, rollouts: list[Rollout]) -> None:
        for r in rollouts:
            options = domain.user_choices(r.scenario, r.conversation, r.user_final)
            text = self.persuadee.reply(r.conversation, options)
            if options:
                dist = self.persuadee.decision(r.conversation)
                probs = [sum(p for a, p in dist.items() if marker(a) == o) for o in options]
                r.decisions.append(Decision(USER, list(options), probs, options.index(text)))
            r.add_user_reply(domain, text)


def candidate_chars(max_new_tokens: int, k: int) -> int:
    """The longest candidate text (characters) such that k of them, with their JSON around them
    (about 12 tokens each), fit in max_new_tokens at about 3 characters per token."""
    return max(16, 3 * ((max_new_tokens - 8) // k - 12))


class EndpointUser:
    """A frozen simulator served over the OpenAI API (another model, a hosted API, vLLM), through
    agents.simulators and agents.llm. Its turns are not trained, so only text comes back. One
    client serves every turn of the run (training/rollouts/served.py)."""

    role = USER

    def __init__(self, spec: SimulatorSpec, rng: random.Random | None = None):
        self.spec = spec
        self.rng = rng or random.Random(0)
        # read now, as the run starts: a missing key fails it before any step, naming the
        # variable (not at the first held-out evaluation, steps later)
        api_key = simulator_api_key(spec)
        self.endpoint = Endpoint(
            lambda: LLMClient(spec.endpoint, api_key=api_key, provider=spec.provider)
        )
        self._simulator: Simulator | None = None

    def _simulator_for(self, client: LLMClient) -> Simulator:
        """The agents.simulators simulator on the endpoint's client, with the same system prompt
        as in this process, guidelines and persona included."""
        if self._simulator is None:
            self._simulator = build(self.spec, client, self.rng)
        return self._simulator

    def respond(self, domain: Domain, rollouts: list[Rollout]) -> None:
        allowed = [domain.user_choices(r.scenario, r.conversation, r.user_final) for r in rollouts]
        turns = self.endpoint.run(lambda client: self._replies(client, domain, rollouts, allowed))
        for r, turn, options in zip(rollouts, turns, allowed, strict=True):
            r.fallbacks += int(turn.fell_back)
            if options and turn.candidates:  # Verbalized: the distribution it wrote, as in-process
                probs = self._simulator.sampling.distribution(turn.candidates, options)
                r.decisions.append(Decision(USER, list(options), probs, options.index(turn.text)))
            r.add_user_reply(domain, turn.text)

    async def _replies(
        self,
        client: LLMClient,
        domain: Domain,
        rollouts: list[Rollout],
        allowed: list[list[str] | None],
    ) -> list[UserTurn]:
        simulator = self._simulator_for(client)
        return await asyncio.gather(
            *(
                simulator.reply(domain, r.scenario, r.conversation, options)
                for r, options in zip(rollouts, allowed, strict=True)
            )
        )

    def close(self) -> None:
        self.endpoint.close()
