"""Regimes: which simulator the agent trains against, and whether the simulator learns too.

    single       one frozen simulator
    verbalized   one frozen Verbalized Sampling simulator (k candidates, one drawn)
    cotrain      the simulator is a second LoRA model taking its own GRPO step on its own tokens,
                 rewarded 1 - agent reward (P4G: it resists persuasion) or the agent's reward (tau2)
    population   cotrain, and each step the agent meets a simulator drawn uniformly from a FIFO
                 pool of the simulator's last K snapshots (saved every S steps) plus its current
                 self; the simulator only learns on steps where its current self was drawn, since
                 the other steps' tokens came from a different policy

A regime owns its simulator models; the trainer asks it for the simulator of a step (a context
manager, so a pool snapshot can be swapped in and out) and lets it learn after the agent's step.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from training.config import RunConfig, SimulatorSpec
from training.grpo import group_advantages
from training.policy import LocalModel, Policy
from training.pool import SimulatorPool
from training.rollout import EndpointUser, LocalUser, Rollout


class ModelCache:
    """In-process models by (folder, adapter), so simulators that differ only in prompt or
    temperature share one copy of the weights."""

    def __init__(self, config: RunConfig):
        self.config = config
        self._models: dict[tuple[str, str], LocalModel] = {}

    def get(self, model: str, adapter: str = "") -> LocalModel:
        path = str(Path(model).expanduser()) if model else str(self.config.base_model_path())
        key = (path, adapter)
        if key not in self._models:
            self._models[key] = LocalModel.load(
                path, self.config.dtype, self.config.device, adapter
            )
        return self._models[key]


def frozen_simulator(spec: SimulatorSpec, models: ModelCache, seed: int) -> Any:
    """A Speaker for a simulator that does not learn: on its endpoint, or in this process."""
    rng = random.Random(seed)
    if spec.endpoint:
        return EndpointUser(spec, rng)
    return LocalUser(models.get(spec.model, spec.adapter), spec, tracked=False, rng=rng)


class Single:
    name = "single"

    def __init__(self, config: RunConfig, run_dir: Path, models: ModelCache):
        self.config = config
        self.user = frozen_simulator(config.simulator, models, config.seed)

    @contextmanager
    def simulator(self, step: int) -> Iterator[Any]:
        self.user.rng.seed(f"{self.config.seed}-{step}-user")
        yield self.user

    def learn(self, step: int, rollouts: list[Rollout]) -> dict[str, float]:
        return {}

    def save(self, folder: Path) -> dict[str, Any]:
        """Write this regime's state into a checkpoint folder; returns what goes in trainer_state."""
        return {}

    def load(self, folder: Path, state: dict[str, Any], step: int) -> None:
        pass


class Verbalized(Single):
    name = "verbalized"


class CoTrain(Single):
    name = "cotrain"

    def __init__(self, config: RunConfig, run_dir: Path, models: ModelCache):
        self.config = config
        self.policy = Policy.for_run(config, lr=config.sim_lr)
        self.user = LocalUser(
            self.policy, config.simulator, tracked=True, rng=random.Random(config.seed)
        )
        self.learning = True  # False while a pool snapshot plays

    def simulator_rewards(self, agent_rewards: torch.Tensor) -> torch.Tensor:
        return 1.0 - agent_rewards if self.config.adversarial_simulator else agent_rewards

    def learn(self, step: int, rollouts: list[Rollout]) -> dict[str, float]:
        """The simulator's GRPO step on its own sampled tokens, grouped like the agent's."""
        if not self.learning:
            return {"sim/learned": 0.0}
        g = self.config.group_size
        rewards = torch.tensor([r.reward for r in rollouts]).view(-1, g)
        sim_rewards = self.simulator_rewards(rewards)
        adv = group_advantages(sim_rewards, self.config.scale_std).flatten()
        stats = self.policy.learn([r.user for r in rollouts], adv, self.config)
        out = {f"sim/{k}": v for k, v in stats.items()}
        out["sim/reward_mean"] = float(sim_rewards.mean())
        out["sim/learned"] = 1.0
        return out

    def save(self, folder: Path) -> dict[str, Any]:
        self.policy.save(folder / "simulator")
        return {"simulator_optimizer": self.policy.optimizer.state_dict()}

    def load(self, folder: Path, state: dict[str, Any], step: int) -> None:
        self.policy.load_weights(folder / "simulator")
        self.policy.optimizer.load_state_dict(state["simulator_optimizer"])


class Population(CoTrain):
    name = "population"

    def __init__(self, config: RunConfig, run_dir: Path, models: ModelCache):
        super().__init__(config, run_dir, models)
        self.pool = SimulatorPool(run_dir / "pool", config.pool_size)
        self.drawn = "current"

    @contextmanager
    def simulator(self, step: int) -> Iterator[Any]:
        rng = random.Random(f"{self.config.seed}-{step}-pool")
        self.user.rng.seed(f"{self.config.seed}-{step}-user")
        entry = self.pool.draw(rng)
        self.drawn = entry.name if entry else "current"
        if entry is None:
            self.learning = True
            yield self.user
            return
        current = self.policy.adapter_state()
        self.policy.load_weights(self.pool.path(entry))
        self.learning = False
        try:
            yield self.user
        finally:
            self.policy.load_adapter_state(current)

    def learn(self, step: int, rollouts: list[Rollout]) -> dict[str, Any]:
        stats = super().learn(step, rollouts)
        if step % self.config.pool_every == 0:
            self.pool.add(step, self.policy.save)
        stats["pool/size"] = float(len(self.pool))
        stats["pool/drawn"] = self.drawn
        return stats

    def load(self, folder: Path, state: dict[str, Any], step: int) -> None:
        super().load(folder, state, step)
        self.pool.drop_after(step)


REGIMES = {r.name: r for r in (Single, Verbalized, CoTrain, Population)}


def make_regime(config: RunConfig, run_dir: Path, models: ModelCache) -> Single:
    return REGIMES[config.regime](config, run_dir, models)
