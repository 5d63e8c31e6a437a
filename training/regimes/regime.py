"""Regimes: which simulator the agent trains against, and whether the simulator learns too.

    single       one frozen simulator
    persona      Persona-Guided: one frozen simulator whose system prompt starts with behavioural
                 guidelines (simulator.guidelines, default the Domain's: tau2 the release's text)
    ensemble     K frozen simulators ([[ensemble]]) in rotation: the member that plays a rollout's
                 user is round-robin over the run's rollouts (ensemble_draw = "rollout", the
                 release's P4G rule) or over its tasks ("task"), or with task_draw = "release"
                 the task's position mod K (the release's tau2 runs as they ran); see Ensemble
    verbalized   one frozen Verbalized Sampling simulator (k candidates, one drawn)
    cotrain      the simulator is a LoRA (finetune = "full": every weight) on its own model
                 (simulator.model, default the agent's base) taking its own GRPO step on its own
                 tokens, with its own learning rate (sim_lr) and KL weight to that model
                 (simulator_beta), rewarded as simulator_reward says (training/regimes/sim_rewards.py; by
                 default the Domain's: P4G 1 - the agent's reward, tau2 the curriculum reward)
    population   cotrain, and the agent also meets a FIFO pool of the simulator's last K snapshots
                 (saved every S steps). Draw per rollout: in each task's group, the first
                 ceil(G/2) rollouts meet the current simulator and the others each a snapshot
                 drawn uniformly (all meet the current one while the pool is empty). The current
                 simulator so learns every step, on its own rollouts only (a snapshot's tokens
                 came from another policy).

A regime (a `RegimeRun`, one class per member of training.vocabulary.Regime) owns its simulator models; the trainer asks it for the simulator of a step
(a context manager, so a pool snapshot can be swapped in and out), lets it learn after the
agent's step and adds its `metrics` of the step's rollouts to the step's row.

Data-parallel (training/rl/distributed.py), a learning simulator learns like the agent: each rank
passes `learn` the rollouts of its own share of the step's tasks, the loss is normalised by the
global token count and the gradients are summed over the ranks, so every rank's copy of the
simulator stays identical. Rank 0 alone writes the pool (snapshots and manifest); the other
ranks read the manifest after the barrier that follows each write.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch

from agents.simulators.spec import SimulatorKind, SimulatorSpec
from training.config_schema import RunConfig
from training.regimes.exact_update import learn_exact
from training.regimes.pool import SimulatorPool
from training.regimes.sim_rewards import group_variance, simulator_advantages
from training.rl.distributed import Ranks
from training.rl.policy import LocalModel, Policy
from training.rollouts.rollout import Rollout
from training.rollouts.simulator import EndpointUser, LocalUser, ScriptedUser, ServedUser
from training.vocabulary import Regime


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
    if spec.kind == SimulatorKind.SCRIPTED:
        return ScriptedUser(spec, rng)
    if spec.endpoint:
        return EndpointUser(spec, rng)
    adapter = spec.adapter_path()
    return LocalUser(models.get(spec.model, str(adapter or "")), spec, tracked=False, rng=rng)


class RegimeRun:
    """What every regime does: give the trainer the simulator of a step (reseeded per step)
    and, after the agent's step, let it learn; save and load its state with a checkpoint.
    A subclass sets `self.user`, the Speaker that plays the user."""

    name: str
    user: Any
    # COLLAPSE-AWARE's synthesis supplies (training/regimes/synthesis.py), set by make_regime
    # when [synthesis] has a supply on; None: the regime's own simulator alone, as ever
    synthesis: Any = None
    # the share of each step's tasks the supplies play, read at every step (not the config)
    # so the breaker can raise it while the run goes on; saved with a checkpoint (synthesis on)
    # COLLAPSE-AWARE's breaker (training/measures/breaker.py) raises it at yellow
    synthesis_share: float = 0.0

    def __init__(
        self, config: RunConfig, run_dir: Path, models: ModelCache, ranks: Ranks | None = None
    ):
        self.config = config
        self.ranks = ranks or Ranks()
        self.models = models
        self.synthesis_share = config.synthesis.share

    @contextmanager
    def simulator(self, step: int) -> Iterator[Any]:
        self.user.rng.seed(f"{self.config.seed}-{step}-user")
        yield self.user

    # COLLAPSE-AWARE's behaviour profiles (training/measures/profiles.py) name the simulators:
    # BASE is the frozen base of a co-trained simulator, measured beside the population but
    # never counted in it (the agent does not train against it)
    BASE = "base"

    def behaviour_simulators(self) -> Iterator[tuple[str, Any]]:
        """(name, Speaker) of every simulator to probe, as it is now; a name may come more than
        once (a pool's snapshots are one simulator, the mixture the agent meets)."""
        yield "training", self.user

    def pooled_name(self, member: str) -> str:
        """The behaviour-profile name of a rollout's `member`."""
        return "training"

    def frozen_base(self) -> Any:
        """The co-trained simulator's frozen base, in process (None: nothing learns)."""
        return None

    def gathered(self, writeback: bool = False) -> Any:
        """A learning simulator's full weights under FSDP (Policy.gathered); else nothing."""
        return nullcontext()

    def learn(self, step: int, rollouts: list[Rollout]) -> dict[str, float]:
        return {}

    def metrics(self, step: int, rollouts: list[Rollout]) -> dict[str, float]:
        """Its own measures of the whole step (`rollouts` in task order, every rank's)."""
        return {}

    def save(self, folder: Path | None) -> dict[str, Any]:
        """Write this regime's state into a checkpoint folder (None: another rank than the one
        writing, which still takes part in the gathering); returns what goes in trainer_state."""
        return {}

    def load(self, folder: Path, state: dict[str, Any], step: int) -> None:
        pass

    def observe(self, profiles: Any) -> None:
        """The step's behaviour profiles (training/measures/profiles.py), once measured: what
        the synthesis supplies steer by (Verbalized Sampling's missing clusters)."""

    def rediversify(self) -> str:
        """The breaker's red: make the simulators the agent meets diverse again, before the next
        step; returns what was done (logged). Frozen simulators have nothing that collapsed by
        training: they stay. A co-trained one goes back to its base (CoTrain). With [synthesis]
        the supplies' share goes to 1.0 for synthesis.rediversify_steps steps, then back
        (training/regimes/synthesis.py); without it the share is set all the same (nothing
        plays it)."""
        self.synthesis_share = 1.0
        return "frozen simulators: nothing trained to reset"


class Single(RegimeRun):
    """One frozen simulator, the same every step."""

    name = Regime.SINGLE

    def __init__(
        self, config: RunConfig, run_dir: Path, models: ModelCache, ranks: Ranks | None = None
    ):
        super().__init__(config, run_dir, models, ranks)
        (spec,) = config.training_simulators()
        self.user = frozen_simulator(spec, models, config.seed)


class Persona(Single):
    """Single, on the simulator with its guidelines filled in (RunConfig.training_simulators):
    the prefix reaches the prompt in this process and on an endpoint (agents/simulators/spec.py spec_prompt)."""

    name = Regime.PERSONA


class Verbalized(Single):
    name = Regime.VERBALIZED


class Ensemble(RegimeRun):
    """K frozen simulators in rotation. The member of rollout `j` of the step's task `i`:

    - task_draw = "release": member i mod K, every step. That is what the release's tau2 runs
      did: its data source fell back to index-only samples (usim/slime/data_source.py, commit
      1c268eb026b6eca549e38001ab6805b904c35782: the tau2 task import fails), so a step's 16
      groups carry sample.index = i, the same for the G rollouts of a group, and the rollout
      picks `sample.index % K` (usim/slime/rollout.py `_get_user_model_config`, commit
      9d3a41e26d27a26795fdd3818979f5fd489c17e7). Each task always meets ONE member: GRPO's
      baseline compares rollouts against the same user, and a member's tasks are fixed.
    - otherwise position mod K, position = ((step - 1) * batch_tasks + i) * G + j with
      ensemble_draw = "rollout", (step - 1) * batch_tasks + i with "task". "rollout" is what the
      release's data sources intended (get_samples numbers a step's samples consecutively, a
      task's G together, across the run) and what its P4G runs did (usim/p4g/rollout.py reads
      files and numbers rollouts consecutively): each group meets every member and the shares
      stay even.

    A draw depends on (step, task index, rollout index) only, not on the seed or the process
    count: it is the same whichever rank plays the task."""

    name = Regime.ENSEMBLE

    def __init__(
        self, config: RunConfig, run_dir: Path, models: ModelCache, ranks: Ranks | None = None
    ):
        super().__init__(config, run_dir, models, ranks)
        self.members = {
            spec.name: frozen_simulator(spec, models, config.seed) for spec in config.ensemble
        }
        self.names = list(self.members)
        self.step = 0
        self.user = EnsembleUser(self)

    def member(self, step: int, task: int, rollout: int) -> str:
        """The member that plays rollout `rollout` of the step's task number `task`."""
        cfg = self.config
        if cfg.task_draw == "release":
            return self.names[task % len(self.names)]
        position = (step - 1) * cfg.batch_tasks + task
        if cfg.ensemble_draw == "rollout":
            position = position * cfg.group_size + rollout
        return self.names[position % len(self.names)]

    @contextmanager
    def simulator(self, step: int) -> Iterator[Any]:
        self.step = step
        with super().simulator(step) as user:
            yield user

    def behaviour_simulators(self) -> Iterator[tuple[str, Any]]:
        yield from self.members.items()

    def pooled_name(self, member: str) -> str:
        return member

    def metrics(self, step: int, rollouts: list[Rollout]) -> dict[str, float]:
        """Per member: the share of the step's rollouts it played, their mean reward and
        success rate (no reward or success for a member that played none this step). A
        rollout's member is its position's draw (the one it met, even had the user never
        spoken)."""
        g = self.config.group_size
        drawn = [self.member(step, i // g, i % g) for i in range(len(rollouts))]
        out: dict[str, float] = {}
        for name in self.names:
            mine = [r for r, member in zip(rollouts, drawn, strict=True) if member == name]
            out[f"ensemble/{name}/share"] = len(mine) / len(rollouts)
            if mine:
                out[f"ensemble/{name}/reward"] = sum(r.reward for r in mine) / len(mine)
                out[f"ensemble/{name}/success"] = sum(
                    bool(r.outcome and r.outcome.success) for r in mine
                ) / len(mine)
        return out


class _Reseeding(random.Random):
    """The Ensemble's generator as the trainer sees it: seeding it seeds every member's own
    generator from the same text and the member's name (members then draw independently)."""

    def __init__(self, members: dict[str, Any]):
        self.members = members
        super().__init__(0)

    def seed(self, a: Any = None, version: int = 2) -> None:
        super().seed(a, version)
        for name, user in self.members.items():
            user.rng.seed(f"{a}-{name}")


class EnsembleUser:
    """The Ensemble as one Speaker: each rollout's user is the member its position draws
    (Ensemble.member), which records itself as the rollout's `member`; each member speaks for
    its own rollouts in one batched call."""

    role = "user"

    def __init__(self, regime: Ensemble):
        self.regime = regime
        self.rng = _Reseeding(regime.members)
        self.task = 0

    def begin_task(self, index: int) -> None:
        """The trainer's next rollouts are of the step's task number `index`."""
        self.task = index

    def respond(self, domain: Any, rollouts: list[Rollout]) -> None:
        regime = self.regime
        by_member: dict[str, list[Rollout]] = {}
        for r in rollouts:
            r.member = regime.member(regime.step, self.task, r.index)
            by_member.setdefault(r.member, []).append(r)
        for name in regime.names:  # the declared order: the same calls on every rank
            if name in by_member:
                regime.members[name].respond(domain, by_member[name])


class CoTrain(RegimeRun):
    """The co-trained simulator. `spec`, `reward_mode`, `member` and `saved_as` default to the
    run's own; the adversarial synthesis supply (training/regimes/synthesis.py) is another
    CoTrain on its own spec, rewarded 1 - r, whose rollouts carry its own member name and whose
    weights are saved in its own checkpoint folder."""

    name = Regime.COTRAIN

    def __init__(
        self,
        config: RunConfig,
        run_dir: Path,
        models: ModelCache,
        ranks: Ranks | None = None,
        *,
        spec: SimulatorSpec | None = None,
        reward_mode: str = "",
        member: str = "current",
        saved_as: str = "simulator",
    ):
        super().__init__(config, run_dir, models, ranks)
        self.spec = spec or config.simulator
        # resolved now: a bad one fails at start
        self.reward_mode = reward_mode or config.simulator_reward_mode
        self.member, self.saved_as = member, saved_as
        # "exact" reads config.simulator's temperature: the run's own simulator alone takes it
        self.update = config.simulator_update if spec is None else "sampled"
        self.policy = Policy.for_run(
            config,
            lr=config.sim_lr,
            model=Path(self.spec.model).expanduser()
            if self.spec.model
            else config.base_model_path(),
            beta=config.simulator_beta,
            ranks=self.ranks,
        )
        rng = random.Random(config.seed)
        if self.spec.endpoint:  # sampled by vLLM from the weights published each step
            self.user = ServedUser(
                self.policy, self.spec, rng, config.weight_sync_host, config.weight_sync_backend
            )
        else:
            self.user = LocalUser(self.policy, self.spec, tracked=True, rng=rng)
        self.live = run_dir / "live" / saved_as
        self.domain = None  # the exact update scores every decision text: built when first needed

    @contextmanager
    def simulator(self, step: int) -> Iterator[Any]:
        self.publish(step)
        with super().simulator(step) as user:
            yield user

    def publish(self, step: int) -> None:
        """A served simulator samples the step's turns from its adapter as the last update left
        it (after a resume, as the checkpoint holds it)."""
        if isinstance(self.user, ServedUser):
            name = f"{self.config.name}-simulator-live-{step - 1}"
            folder = self.live / f"step-{step - 1:06d}"
            self.user.server.publish(self.policy, folder, name, self.ranks)

    def gathered(self, writeback: bool = False) -> Any:
        return self.policy.gathered(writeback)

    def behaviour_simulators(self) -> Iterator[tuple[str, Any]]:
        yield self.BASE, self.frozen_base()
        yield "current", self.user

    def pooled_name(self, member: str) -> str:
        return "current" if member == "current" else "pool"

    def frozen_base(self) -> Any:
        """The simulator's model without its training (its LoRA or full weights as loaded),
        sampled in this process, its generator seeded like the run's."""
        if not hasattr(self, "_base"):
            spec = self.config.simulator
            model = self.models.get(str(self.config.simulator_model_path()))
            self._base = LocalUser(model, spec, tracked=False, rng=random.Random(self.config.seed))
        return self._base

    def learn(self, step: int, rollouts: list[Rollout]) -> dict[str, float]:
        """The simulator's GRPO step on its own sampled tokens, grouped like the agent's (only
        the rollouts its current self played). `rollouts`: this rank's share of the step, whole
        groups of its own tasks (ranks.share splits tasks, not rollouts), so a group's
        curriculum reward needs nothing from another rank. Every group has the same members,
        so `per_group` is the same on every rank.

        Population: a snapshot's rollouts count in no group's reward either. The curriculum
        reward scores the split that the current simulator caused; in the release one
        simulator plays every rollout of a group (its pool swaps one checkpoint in per rollout
        batch: CHATS-lab/scope_usim usim/slime/cotrain_loop.py dual_selfplay, commit
        6218b97532dd1c726746840486ef31801ce110e8), so its groups hold no other's rollouts."""
        own = [r for r in rollouts if r.member == self.member]
        per_group = len(own) * self.config.group_size // len(rollouts) if rollouts else 0
        if per_group < 2:
            return {"sim/learned": 0.0}
        mode = self.reward_mode
        rewards = torch.tensor([r.reward for r in own]).view(-1, per_group)
        sim_rewards, adv = simulator_advantages(
            mode, rewards, self.config.scale_std, self.config.center_rewards
        )
        adv = adv.flatten()
        if self.update == "exact":  # every text's reward, per ask (see there)
            if self.domain is None:
                self.domain = self.config.build_domain()
            stats = learn_exact(self.policy, own, self.domain, self.config, mode, self.ranks)
        else:
            stats = self.policy.learn(
                [r.user for r in own],
                adv,
                self.config,
                temperature=self.spec.temperature,
                beta=self.config.simulator_beta,
                ranks=self.ranks,
            )
        out = {f"sim/{k}": v for k, v in stats.items()}
        count = self.ranks.total(sim_rewards.numel())
        out["sim/reward_mean"] = self.ranks.total(float(sim_rewards.sum())) / count
        if mode == "curriculum":  # the release logs it too (user_curriculum/mean_variance)
            groups = self.ranks.total(rewards.shape[0])
            variance = sum(group_variance(row) for row in rewards.tolist())
            out["sim/agent_variance"] = self.ranks.total(variance) / groups
        out["sim/learned"] = float(stats.get("trained_sequences", 0) > 0)
        return out

    def rediversify(self) -> str:
        """The co-trained simulator back to its base (what it was before any training: a LoRA's
        B matrices zero, as PEFT initialises them; full fine-tuning: simulator.model's weights
        read again) with a fresh optimizer, so it starts over from the base's spread."""
        with self.policy.gathered(writeback=True):
            if self.config.finetune == "lora":
                with torch.no_grad():
                    for name, p in self.policy.model.named_parameters():
                        if "lora_B" in name:
                            p.zero_()
            else:
                self.policy.load_weights(self.config.simulator_model_path())
        self.policy.optimizer.state.clear()  # AdamW's moments belong to the collapsed weights
        return "the co-trained simulator reset to its base, its optimizer state cleared"

    def save(self, folder: Path | None) -> dict[str, Any]:
        state = {f"{self.saved_as}_optimizer": self.policy.optimizer_state()}
        with self.policy.gathered():
            if folder is not None:
                self.policy.save(folder / self.saved_as)
        return state

    def load(self, folder: Path, state: dict[str, Any], step: int) -> None:
        with self.policy.gathered(writeback=True):
            self.policy.load_weights(folder / self.saved_as)
        self.policy.load_optimizer_state(state[f"{self.saved_as}_optimizer"])


class Population(CoTrain):
    name = Regime.POPULATION

    def __init__(
        self, config: RunConfig, run_dir: Path, models: ModelCache, ranks: Ranks | None = None
    ):
        super().__init__(config, run_dir, models, ranks)
        self.pool = SimulatorPool(run_dir / "pool", config.pool_size)
        self.members: list[str] = []

    @contextmanager
    def simulator(self, step: int) -> Iterator[Any]:
        self.publish(step)
        self.user.rng.seed(f"{self.config.seed}-{step}-user")
        rng = random.Random(f"{self.config.seed}-{step}-pool")
        g = self.config.group_size
        current = (g + 1) // 2 if len(self.pool) else g
        self.members = [
            "current" if i % g < current else rng.choice(self.pool.entries).name
            for i in range(g * self.config.batch_tasks)
        ]
        yield PoolUser(self)

    def behaviour_simulators(self) -> Iterator[tuple[str, Any]]:
        yield from super().behaviour_simulators()
        for entry in list(self.pool.entries):  # each snapshot: the pool is their even mixture
            yield "pool", _Snapshot(self, entry.name)

    def respond_as(self, member: str, domain: Any, group: list[Rollout]) -> None:
        """Pool snapshot `member` plays the user's turn of `group`: its weights swapped in
        (on a served simulator, its adapter loaded) and the current ones put back after."""
        entry = next(e for e in self.pool.entries if e.name == member)
        current = self.policy.adapter_state()
        folder = self.pool.path(entry)
        self.policy.load_weights(folder)
        # a served simulator samples the snapshot's turns from the snapshot's adapter
        server = self.user.server if isinstance(self.user, ServedUser) else None
        live = server.model if server else ""
        try:
            if server:
                server.load(str(folder), f"{self.config.name}-{member}", keep_previous=True)
            self.user.respond(domain, group)
        finally:
            self.policy.load_adapter_state(current)
            if server and server.model != live:
                server.unload(server.model)
                server.model = live

    def learn(self, step: int, rollouts: list[Rollout]) -> dict[str, Any]:
        stats = super().learn(step, rollouts)
        if step % self.config.pool_every == 0:
            with self.policy.gathered():
                if self.ranks.main:
                    self.pool.add(step, self.policy.save)
            self._synced()
        stats["pool/size"] = float(len(self.pool))
        stats["pool/current_share"] = self.members.count("current") / len(self.members)
        return stats

    def load(self, folder: Path, state: dict[str, Any], step: int) -> None:
        super().load(folder, state, step)
        if self.ranks.main:
            self.pool.drop_after(step)
        self._synced()

    def rediversify(self) -> str:
        """The current simulator back to its base (CoTrain's); the pool's snapshots stay: they
        are the population's history, the earlier (less collapsed) selves it draws from."""
        return super().rediversify() + f"; the pool's {len(self.pool)} snapshots kept"

    def _synced(self) -> None:
        """After rank 0 changed the pool: every rank waits for it, then reads its manifest."""
        self.ranks.barrier()
        if not self.ranks.main:
            self.pool.reload()


class PoolUser:
    """The population as one Speaker: each rollout's user is the member assigned to its
    position; a snapshot's weights are swapped into the simulator model for its turns."""

    role = "user"

    def __init__(self, regime: Population):
        self.regime = regime

    @property
    def rng(self) -> random.Random:
        """The current simulator's generator, so the trainer reseeds it per task (a task's
        rollouts are then the same whichever rank plays it)."""
        return self.regime.user.rng

    def respond(self, domain: Any, rollouts: list[Rollout]) -> None:
        regime = self.regime
        by_member: dict[str, list[Rollout]] = {}
        for r in rollouts:
            r.member = regime.members[r.index]
            by_member.setdefault(r.member, []).append(r)
        for member, group in by_member.items():
            if member == "current":
                regime.user.respond(domain, group)
            else:
                regime.respond_as(member, domain, group)


class _Snapshot:
    """One pool snapshot as a Speaker (the behaviour profiles probe each)."""

    role = "user"

    def __init__(self, regime: Population, member: str):
        self.regime, self.member = regime, member

    @property
    def rng(self) -> random.Random:
        return self.regime.user.rng

    def respond(self, domain: Any, rollouts: list[Rollout]) -> None:
        for r in rollouts:
            r.member = self.member
        self.regime.respond_as(self.member, domain, rollouts)


# each class names its member of the registry (training.vocabulary.Regime): the one place a
# regime's name, label and what it trains are declared
CLASSES = {r.name: r for r in (Single, Persona, Ensemble, Verbalized, CoTrain, Population)}
