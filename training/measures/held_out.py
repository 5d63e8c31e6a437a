"""Held-out evaluation: the agent against each simulator of a panel none of which it trained
against, on held-out tasks. Reports per simulator the success rate and mean reward, and the
policy's entropy on its own held-out tokens (a collapsing policy's entropy falls)."""

from __future__ import annotations

import statistics
from typing import Any

import torch

from agents.domains.base import Domain, Scenario
from training.config import RunConfig
from training.regimes.regime import ModelCache, frozen_simulator
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

    def evaluate(self, agent: LocalModel, step: int) -> dict[str, Any]:
        cfg = self.config
        scenarios = [t for t in self.tasks for _ in range(cfg.eval_samples)]
        tool_format = agent_tool_format(cfg.tool_format, agent)
        speaker = LocalAgent(agent, cfg.temperature, cfg.max_new_tokens, tool_format)
        row: dict[str, Any] = {}
        every: list[Rollout] = []
        for name, user in self.simulators.items():
            user.rng.seed(f"{cfg.seed}-{step}-eval-{name}")
            # at most rollouts_at_once conversations open at once, as in training (0: all)
            at_once = cfg.rollouts_at_once or len(scenarios)
            rollouts = []
            for first in range(0, len(scenarios), at_once):
                rollouts += play(
                    self.domain, scenarios[first : first + at_once], speaker, user,
                    max_turns=cfg.max_turns, max_tool_rounds=cfg.max_tool_rounds, first=first,
                )  # fmt: skip
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
        row["heldout/entropy"] = mean_entropy(agent, every, cfg.micro_batch, cfg.temperature)
        return row


ENTROPY_ROLLOUTS = 32  # the token entropy is a mean: a sample of the panel's conversations


@torch.no_grad()
def mean_entropy(
    agent: LocalModel, rollouts: list[Rollout], micro_batch: int, temperature: float = 1.0
) -> float:
    """Mean per-token entropy of the agent's distribution at the tokens it sampled, at the
    sampling temperature (on choice turns, of the restricted distribution)."""
    total, tokens = 0.0, 0.0
    step = max(1, len(rollouts) // ENTROPY_ROLLOUTS)
    rollouts = rollouts[::step][:ENTROPY_ROLLOUTS]
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
    return total / tokens if tokens else 0.0
