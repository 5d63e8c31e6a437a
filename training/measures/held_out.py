"""Held-out evaluation: the agent against each simulator of a panel none of which it trained
against, on held-out tasks. Reports per simulator the success rate and mean reward, and the
policy's entropy on its own held-out tokens (a collapsing policy's entropy falls).

With several ranks every rank plays its share of the panel's (member, task) pairs and the
results are gathered, so no rank waits in a collective while another plays the whole panel
(a tau2 panel of 6 members x 8 tasks x 4 samples would outlast NCCL's 10-minute timeout). Each
pair's conversations are seeded from (seed, step, member, task), so the figures are the same at
any process count."""

from __future__ import annotations

import random
import statistics
from typing import Any

import torch

from agents.domains.base import Domain, Scenario
from training.config import RunConfig
from training.regimes.regime import ModelCache, frozen_simulator
from training.rl.distributed import Ranks
from training.rl.grpo import TokenBatch, token_logprobs
from training.rl.policy import LocalModel
from training.rollouts.agent import LocalAgent, agent_tool_format
from training.rollouts.rollout import Rollout, play


class HeldOutPanel:
    def __init__(
        self, config: RunConfig, domain: Domain, tasks: list[Scenario], models: ModelCache
    ):
        self.config, self.domain, self.tasks = config, domain, tasks
        self.simulators = {
            spec.name: frozen_simulator(spec, models, config.seed) for spec in config.heldout
        }

    def __bool__(self) -> bool:
        return bool(self.simulators and self.tasks)

    def evaluate(self, agent: LocalModel, step: int, ranks: Ranks | None = None) -> dict[str, Any]:
        """The panel's figures at `step`, on every rank (each plays its share: the module's
        docstring); every rank must call it, on the agent's full weights under FSDP."""
        cfg, ranks = self.config, ranks or Ranks()
        tool_format = agent_tool_format(cfg.tool_format, agent)
        speaker = LocalAgent(agent, cfg.temperature, cfg.max_new_tokens, tool_format)
        pairs = [(name, index) for name in self.simulators for index in range(len(self.tasks))]
        mine = [(pair, self._play(speaker, *pair, step)) for pair in ranks.share(pairs)]
        played = dict(ranks.gather(mine))  # every pair's rollouts, on every rank
        row: dict[str, Any] = {}
        every: list[Rollout] = []
        for name in self.simulators:
            rollouts = [r for index in range(len(self.tasks)) for r in played[(name, index)]]
            row[f"heldout/{name}/success"] = statistics.fmean(
                bool(r.outcome.success) for r in rollouts
            )
            row[f"heldout/{name}/reward"] = statistics.fmean(r.reward for r in rollouts)
            every += rollouts
        row["heldout/success"] = statistics.fmean(
            row[f"heldout/{n}/success"] for n in self.simulators
        )
        row["heldout/reward"] = statistics.fmean(
            row[f"heldout/{n}/reward"] for n in self.simulators
        )
        row["heldout/worst_reward"] = min(row[f"heldout/{n}/reward"] for n in self.simulators)
        # The release's means span its whole panel, training simulators included; the unseen
        # means are the held-out ones proper (written only when the panel has a seen member)
        unseen = [s.name for s in cfg.heldout if not s.seen]
        if unseen and len(unseen) < len(self.simulators):
            for measure in ("success", "reward"):
                row[f"heldout/unseen_{measure}"] = statistics.fmean(
                    row[f"heldout/{n}/{measure}"] for n in unseen
                )
            row["heldout/unseen_worst_reward"] = min(row[f"heldout/{n}/reward"] for n in unseen)
        row["heldout/entropy"] = mean_entropy(agent, every, cfg.micro_batch, cfg.temperature, ranks)
        return row

    def _play(self, speaker: LocalAgent, name: str, index: int, step: int) -> list[Rollout]:
        """Member `name`'s eval_samples conversations on task `index`, seeded from the pair
        alone (torch's generator for both speakers' sampling, the member's own for its draws),
        so they do not depend on which rank plays them or what it played before."""
        cfg, user = self.config, self.simulators[name]
        seed = f"{cfg.seed}-{step}-eval-{name}-{index}"
        torch.manual_seed(random.Random(seed).getrandbits(63))
        user.rng.seed(seed)
        return play(
            self.domain, [self.tasks[index]] * cfg.eval_samples, speaker, user,
            max_turns=cfg.max_turns, max_tool_rounds=cfg.max_tool_rounds,
        )  # fmt: skip


ENTROPY_ROLLOUTS = 32  # the token entropy is a mean: a sample of the panel's conversations


@torch.no_grad()
def mean_entropy(
    agent: LocalModel,
    rollouts: list[Rollout],
    micro_batch: int,
    temperature: float = 1.0,
    ranks: Ranks | None = None,
) -> float:
    """Mean per-token entropy of the agent's distribution at the tokens it sampled, at the
    sampling temperature (on choice turns, of the restricted distribution). With `ranks`
    (every rank holding the same `rollouts`), each rank scores its share of the sample."""
    ranks = ranks or Ranks()
    total, tokens = 0.0, 0.0
    step = max(1, len(rollouts) // ENTROPY_ROLLOUTS)
    rollouts = ranks.share(rollouts[::step][:ENTROPY_ROLLOUTS])
    for i in range(0, len(rollouts), micro_batch):
        chunk = rollouts[i : i + micro_batch]
        batch = TokenBatch.from_lists(
            [r.agent.ids for r in chunk],
            [r.agent.mask for r in chunk],
            agent.pad_id,
            [r.agent.allowed for r in chunk],
        )
        with agent.compute():  # mixed precision: the dtype its turns were sampled in
            _, entropy = token_logprobs(
                agent.model, batch, with_entropy=True, temperature=temperature
            )
        total += float((entropy * batch.mask).sum())
        tokens += float(batch.mask.sum())
    total, tokens = ranks.total(total), ranks.total(tokens)
    return total / tokens if tokens else 0.0
