"""The trainer, top to bottom: rollouts, GRPO step, the regime's own step, evaluation, checkpoint.
`_train` builds the run once and loops: `train_step` (every rank) returns the step's metrics row,
and a RunWriter (training/trainer/writer.py) writes it, checkpoints and reports progress (rank 0).

    from training.config import load_config
    from training.trainer.loop import train
    checkpoints = train(load_config("training/configs/p4g-single-cpu.toml"), progress_callback=print)

Running it again with the same output folder resumes from the last checkpoint. With [breaker]
on, a red level stops the run after a checkpoint by raising BreakerStopped (training/measures/
breaker.py); running it again resumes it, re-diversifying the simulators first.
`progress_callback` gets a dict after every step:
    {"step", "total_steps", "reward", "heldout_success", "eta_seconds", "metrics", "checkpoint",
     "warnings"}
`warnings` lists the run's collapse warnings so far (training/measures/diversity.py), each
printed once when its threshold is first crossed. `within_step` gets, while a step runs (rank 0), the last
step's dict with `current`: {"step", "phase": rollouts | update | evaluation, "rollouts_done",
"rollouts_total", "turns_done"} (rank 0's share of the step's rollouts; the turns taken in them,
after every turn), so a long step shows it is moving.
"""

from __future__ import annotations

import dataclasses
import functools
import random
import statistics
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from agents.domains.base import Domain, Scenario
from agents.simulators.spec import SimulatorKind
from training.config_schema import RunConfig, ScenarioSpec
from training.layout import METRICS_FILE, RUN_CONFIG_FILE
from training.measures.breaker import Breaker, BreakerStopped, Verdict
from training.measures.breaker import load as breaker_state
from training.measures.collapse import (
    load_or_find_exploit,
    mixture_exploit,
    simulator_exploit,
    step_metrics,
)
from training.measures.curation import Curation
from training.measures.diversity import Embedder, step_diversity
from training.measures.held_out import HeldOutPanel
from training.measures.metrics import MetricsLog
from training.measures.profiles import Profiles, Reply, ask, probe_set, psod_row, rollout_replies
from training.regimes.choose import make_regime
from training.regimes.regime import ModelCache, frozen_simulator
from training.rl.distributed import Ranks
from training.rl.grpo import group_advantages
from training.rl.policy import Policy
from training.rollouts.agent import (
    EndpointAgent,
    LocalAgent,
    WeightSyncedAgent,
    agent_tool_format,
)
from training.rollouts.rollout import Rollout, play
from training.trainer import checkpoint
from training.trainer.memory import PhaseMemory
from training.trainer.writer import Phase, Progress, RunWriter, due, evaluation_due


def train(
    config: RunConfig,
    progress_callback: Progress | None = None,
    *,
    domain: Domain | None = None,
    show_progress: bool = True,
    within_step: Progress | None = None,
) -> list[Path]:
    """Train (or resume) the run `config` describes; returns its checkpoint folders, oldest
    first. `domain` overrides the registry lookup of config.domain (tests use a toy Domain).
    `within_step` gets the progress within each step (the module's docstring)."""
    threads = torch.get_num_threads()
    if config.threads:
        # OpenMP threads spin-wait for each other: on a machine shared with other work, fewer
        # threads than cores is several times faster
        torch.set_num_threads(config.threads)
    ranks = Ranks.start(config)
    try:
        return _train(config, progress_callback, domain, show_progress, ranks, within_step)
    except BreakerStopped:  # not a failure: stopped on purpose, resumable
        raise
    except Exception as exc:
        # the launcher stops the other ranks; this file says which one failed and why
        ranks.record_failure(config.run_dir(), exc)
        raise
    finally:
        torch.set_num_threads(threads)
        ranks.close()


@dataclasses.dataclass
class Run:
    """What every step of a run uses, built once by _train."""

    config: RunConfig
    run_dir: Path
    domain: Domain
    tasks: list[Scenario]  # the training scenarios
    agent: Policy
    speaker: LocalAgent | EndpointAgent | WeightSyncedAgent
    regime: Any
    panel: HeldOutPanel
    ranks: Ranks
    exploit: Any  # the frozen simulator's dominant mode, where the task makes it exact
    embed: Embedder | None  # rank 0's reply embedder for the step's diversity
    memory: PhaseMemory  # this rank's peak memory per phase (<run>/memory/rank-K.json)
    optimizer_steps: int = 0  # so far: 0 means the adapter is still the base
    profiles: Profiles | None = None  # behaviour profiles (rank 0 computes; None: off)
    probes: list = dataclasses.field(default_factory=list)  # the fixed probe set (every rank)
    curation: Curation | None = None  # [curation] (every rank; rank 0 holds its space)


def _train(
    config: RunConfig,
    progress_callback: Progress | None,
    domain: Domain | None,
    show_progress: bool,
    ranks: Ranks,
    within_step: Progress | None = None,
) -> list[Path]:
    run_dir = config.run_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    ranks.clear_failures(run_dir)
    domain = domain or config.build_domain()
    train_scenarios = select_scenarios(domain, config.tasks, "train")
    if config.task_draw == "release":  # the tasks every step plays, as the release's did
        train_scenarios = released_tasks(domain, config, train_scenarios)
    eval_scenarios = select_scenarios(domain, config.tasks, "eval")
    torch.manual_seed(config.seed)

    memory = PhaseMemory(run_dir, ranks.rank, ranks.world, ranks.device)  # before any model
    models = ModelCache(config)
    agent = Policy.for_run(config, lr=config.agent_lr, ranks=ranks)
    panel = HeldOutPanel(config, domain, eval_scenarios, models)
    if config.steps == 0:  # a base evaluation: no regime, no simulator loaded, no step taken
        return _evaluate_start(config, run_dir, agent, panel, ranks)
    regime = make_regime(config, run_dir, models, ranks)
    # every rank loads the same global checkpoint (adapter, optimizer, RNG), so a run resumes at
    # any process count
    start = checkpoint.resume(run_dir, config, agent, regime)
    breaker = None  # [breaker]: every rank holds it; rank 0's judgement is every rank's
    if config.breaker.enabled:
        saved = breaker_state(checkpoint.checkpoint_dir(run_dir, start)) if start else None
        breaker = Breaker(config.breaker, regime.synthesis_share, saved)
        regime.synthesis_share = breaker.share  # a resume keeps what yellow raised
    writer = RunWriter(
        config,
        run_dir,
        start,
        ranks,
        agent,
        regime,
        progress_callback,
        within_step,
        show_progress,
        breaker,
    )
    exploit = _exploit(config, domain, train_scenarios, models) if ranks.main else None
    speaker = _speaker(config, agent)
    embed = None  # rank 0 alone measures the step's diversity (every rank has the rollouts)
    if ranks.main and config.collapse.embedding_model:
        embed = Embedder(config.collapse.embedding_model)
    run = Run(
        config,
        run_dir,
        domain,
        train_scenarios,
        agent,
        speaker,
        regime,
        panel,
        ranks,
        exploit,
        embed,
        memory,
        optimizer_steps=writer.optimizer_steps,
    )
    if config.behaviour.enabled:
        b = config.behaviour
        run.probes = probe_set(domain, train_scenarios, b.probe_tasks, b.probe_opening)
        run.profiles = _profiles(config, run_dir) if ranks.main else None
        regime.observe(run.profiles)  # synthesis steers by the space before the first step too
    if config.curation.enabled:  # rank 0 weighs in the profiles' space (the others are told)
        run.curation = Curation(config.curation, run.profiles and run.profiles.space)
    if breaker is not None and breaker.stopped:  # resumed after a red stop: re-diversify first
        writer.note(breaker.resumed(start, regime.rediversify()))
    memory.loaded()
    writer.begin()
    for step in range(start + 1, config.steps + 1):
        row, rollouts = train_step(run, step, functools.partial(writer.phase, step))
        verdict = _judge(run, breaker, step, row)
        saving = due(step, config.save_every, config.steps) or bool(verdict and verdict.stop)
        with memory.phase("checkpoint") if saving else nullcontext():
            folder = writer.record(step, row, rollouts, verdict)
        if verdict and verdict.stop:  # red: stopped cleanly, the checkpoint resumes it
            writer.close()
            raise BreakerStopped(verdict.stop, step, str(folder or ""))
    return writer.close()


def _judge(run: Run, breaker: Breaker | None, step: int, row: dict[str, Any]) -> Verdict | None:
    """The breaker's judgement of the step (rank 0 holds the behaviour measures, so its
    verdict is every rank's): its fields into the row, the synthesis share into the regime,
    red without a stop re-diversifies now."""
    if breaker is None:
        return None
    mine = [breaker.observe(step, row)] if run.ranks.main else []
    verdict = run.ranks.gather(mine)[0]
    row.update(verdict.row())
    run.regime.synthesis_share = verdict.share
    if verdict.rediversify:
        what = run.regime.rediversify()
        verdict.events.append(
            {
                "event": "rediversify",
                "step": step,
                "rediversified": what,
                "message": f"breaker: re-diversified at step {step}: {what}",
            }
        )
    return verdict


def train_step(run: Run, step: int, phase: Phase) -> tuple[dict[str, Any], list[Rollout]]:
    """One step on every rank: rollouts, the agent's GRPO step, the regime's own step, the
    held-out evaluation when due. Returns the step's metrics row and its rollouts (every rank's,
    in task order). `phase(name, rollouts_done, rollouts_total)` says where the step is."""
    config, agent, regime, ranks = run.config, run.agent, run.regime, run.ranks
    t0 = time.monotonic()
    # 1. rollouts: G conversations for each of this rank's share of the step's tasks
    tasks = step_tasks(config, run.tasks, step)
    share = ranks.share(list(enumerate(tasks)))
    total = len(share) * config.group_size
    phase("rollouts", 0, total)
    if config.rollout_endpoint:  # the server samples from the weights as they are now
        live = run.run_dir / "live" / f"step-{step - 1:06d}"
        with agent.gathered():  # FSDP: the adapter (or every weight) is gathered by every rank
            run.speaker.publish(agent, live, f"{config.name}-live-{step - 1}", ranks)
    mine, turned = [], [0]  # the turns of this rank's tasks played before the one playing
    # FSDP: the models sampling in this process do so on their full weights, gathered once
    # for the whole phase by every rank (generation itself then makes no collectives)
    sampling = agent.gathered() if not config.rollout_endpoint else nullcontext()
    with run.memory.phase("rollouts"), sampling, regime.gathered(), regime.simulator(step) as user:
        for index, task in share:
            done, before = len(mine), turned[0]

            def ended(n, turns, done=done, before=before):
                turned[0] = before + turns
                phase("rollouts", done + n, total, before + turns)

            mine += _play_task(config, run.domain, task, index, step, run.speaker, user, ended)
        # the fixed probe set, answered by every simulator as it played this step (every rank
        # asks the same, so a sharded simulator's generation is the same on every rank)
        probed = _probe(run) if run.probes else {}
    rewards = torch.tensor([r.reward for r in mine]).view(-1, config.group_size)
    t_rollout = time.monotonic() - t0
    phase("update", len(mine), total, turned[0])

    # 2. the agent's GRPO step on its own tokens (data-parallel: this rank's rows, the
    # gradients summed over the ranks)
    adv = group_advantages(rewards, config.scale_std, config.center_rewards).flatten()
    weights, curated = None, {}
    if run.curation:  # the gate, then diversity weights: per-sequence loss weights, adv untouched
        weights, curated = run.curation.step(mine, probed, ranks, regime.pooled_name)
    with run.memory.phase("update"):
        stats = agent.learn(
            [r.agent for r in mine],
            adv,
            config,
            temperature=config.temperature,
            beta=config.beta,
            ranks=ranks,
            weights=weights,
        )
    # 3. the regime's own step (co-training: the simulator learns on this rank's rollouts,
    # data-parallel like the agent; population: rank 0 adds to the pool)
    with run.memory.phase("simulator_update") if config.trains_simulator else nullcontext():
        stats.update(regime.learn(step, mine))
    rollouts = ranks.gather(mine)  # the whole step, in task order, on every rank
    row = _row(run, step, rollouts, len(tasks), stats) | curated | {"time_rollout": t_rollout}
    if run.profiles is not None:
        population = [n for n in probed if n != regime.BASE]
        pooled = rollout_replies(rollouts, regime.pooled_name)
        row.update(run.profiles.row(step, probed, pooled, population))
        regime.observe(run.profiles)
    run.optimizer_steps += int(row["optimizer_step"])
    row["optimizer_steps"] = run.optimizer_steps

    # 4. held-out evaluation every eval_every steps and at the end (eval_at_end): every rank
    # plays its share of the panel (on the agent's full weights under FSDP) and the figures are
    # gathered, so no rank waits out the whole panel in a collective (training/measures/held_out.py)
    if run.panel and evaluation_due(step, config):
        phase("evaluation", len(mine), total)
        with run.memory.phase("evaluation"), agent.gathered():
            row.update(run.panel.evaluate(agent, step, ranks))
            if run.probes and "heldout/reward" in row:
                row.update(_psod(run, step, rollouts, row["heldout/reward"]))
    row["time_step"] = time.monotonic() - t0
    return row, rollouts


def _row(run: Run, step: int, rollouts: list[Rollout], tasks: int, stats: dict) -> dict:
    """The step's metrics, before its timings and evaluation."""
    config = run.config
    rewards = torch.tensor([r.reward for r in rollouts]).view(tasks, config.group_size)
    # the optimizers' rates as set (LoRA scales them: lora.lr_scale), in every metrics row
    rates = {"lr": config.agent_lr} | ({"sim/lr": config.sim_lr} if config.trains_simulator else {})
    return {
        "step": step,
        "reward_mean": float(rewards.mean()),
        "reward_std": float(rewards.std()) if rewards.numel() > 1 else 0.0,
        "success": statistics.fmean(bool(r.outcome.success) for r in rollouts),
        "turns": statistics.fmean(len(r.conversation) for r in rollouts),
        "fallbacks": sum(r.fallbacks for r in rollouts),
        "optimizer_step": float(stats.get("trained_sequences", 0) > 0),
        **rates,
        **stats,
        **run.regime.metrics(step, rollouts),
        **step_metrics(rollouts, run.exploit),
        **(step_diversity([r.conversation for r in rollouts], run.embed) if run.ranks.main else {}),
    }


def _profiles(config: RunConfig, run_dir: Path) -> Profiles:
    """The run's behaviour profiles: its space fit (or loaded) once, at the start."""
    from training.measures.behaviour_space import (
        BehaviourEmbedder,
        load_or_fit,
        p4g_decision_shares,
        p4g_folder,
    )

    b = config.behaviour
    space, people = None, None
    if b.reference:
        folder = b.embedder or str(config.base_model_path())
        embed = BehaviourEmbedder(folder)  # its errors name behaviour.embedder
        settings = b.space_settings(config.seed, folder)
        space = load_or_fit(run_dir, settings, embed, b.corpus, config.domain_data)
    if b.reference == "p4g_corpus":
        people = p4g_decision_shares(p4g_folder(b.corpus, config.domain_data))
    human = b.reference == "p4g_corpus" or b.reference.startswith("texts:")
    return Profiles(space, b.support_share, b.cover_share, b.bootstrap, config.seed, human, people)


def _probe(run: Run) -> dict[str, list[Reply]]:
    """Every simulator's replies to the fixed probe set, by name; the same seeds every step."""
    b, found = run.config.behaviour, {}
    for name, user in run.regime.behaviour_simulators():
        replies = ask(run.domain, run.probes, user, b.probe_samples, f"{run.config.seed}-probe")
        found.setdefault(name, []).extend(replies)
    return found


def _psod(run: Run, step: int, rollouts: list[Rollout], heldout: float) -> dict[str, float]:
    """PSOD for each training simulator the regime names: "training" (every rollout of the
    step, whatever the agent met), each named one it played (ensemble members; co-training's
    "current" and "pool"), and co-training's frozen "base", which the agent plays here on the
    first psod_base_tasks held-out tasks (it never met it in training)."""
    rewards: dict[str, list[float]] = {"training": [r.reward for r in rollouts]}
    for r in rollouts:
        name = run.regime.pooled_name(r.member)
        if name != "training":
            rewards.setdefault(name, []).append(r.reward)
    base = run.regime.frozen_base()
    n = run.config.behaviour.psod_base_tasks
    if base is not None and n and run.panel.tasks:
        torch_state = torch.get_rng_state()  # seeded alone: the run's draws are untouched
        torch.manual_seed(_task_seed(run.config.seed, step, -1))
        base.rng.seed(f"{run.config.seed}-{step}-psod-base")
        cfg = run.config
        speaker = LocalAgent(
            run.agent,
            cfg.temperature,
            cfg.max_new_tokens,
            agent_tool_format(cfg.tool_format, run.agent),
        )
        tasks = [t for t in run.panel.tasks[:n] for _ in range(cfg.group_size)]
        played = play(
            run.domain,
            tasks,
            speaker,
            base,
            max_turns=cfg.max_turns,
            max_tool_rounds=cfg.max_tool_rounds,
        )
        torch.set_rng_state(torch_state)
        rewards[run.regime.BASE] = [r.reward for r in played]
    return psod_row(heldout, rewards)


def _exploit(config: RunConfig, domain: Domain, tasks: list[Scenario], models: ModelCache):
    """The frozen simulator's dominant mode, where the task makes it exact (training/measures/
    collapse.py): the training simulator as it starts, plain (a Verbalized one's underlying
    model); an Ensemble's is that of the even mixture of its members, which the rotation makes
    it. None where it is not exact (the user speaks first, or is on an endpoint)."""
    base_users = [
        dataclasses.replace(s, kind=SimulatorKind.PLAIN)
        if s.kind == SimulatorKind.VERBALIZED
        else s
        for s in config.training_simulators()
    ]
    if domain.first_speaker != "agent" or any(s.endpoint for s in base_users):
        return None
    return load_or_find_exploit(
        config.run_dir(),
        lambda: mixture_exploit(
            [
                simulator_exploit(domain, tasks, frozen_simulator(s, models, config.seed))
                for s in base_users
            ]
        ),
    )


def _speaker(config: RunConfig, agent: Policy) -> LocalAgent | EndpointAgent | WeightSyncedAgent:
    """The agent's side of the rollouts: sampled in this process, or by a vLLM server that
    hot-loads its adapter (LoRA) or takes its pushed weights (full fine-tuning)."""
    tool_format = agent_tool_format(config.tool_format, agent)  # "json" | "native"
    if not config.rollout_endpoint:
        return LocalAgent(agent, config.temperature, config.max_new_tokens, tool_format)
    if config.finetune == "full":
        speaker = WeightSyncedAgent(
            config.rollout_endpoint,
            agent,
            config.temperature,
            config.max_new_tokens,
            backend=config.weight_sync_backend,
            nccl_host=config.weight_sync_host,
        )
    else:
        speaker = EndpointAgent(
            config.rollout_endpoint, agent, config.temperature, config.max_new_tokens
        )
    speaker.tool_format = tool_format
    return speaker


def _evaluate_start(
    config: RunConfig, run_dir: Path, agent: Policy, panel: HeldOutPanel, ranks: Ranks
) -> list[Path]:
    """`steps = 0`: the starting policy against the held-out panel, written as metrics row 0
    (the release measures its Base rows the same way: the evaluation at rollout 0, before any
    update; cmd/slime/eval_base.sh). Nothing else is written: there is no checkpoint."""
    if not panel:
        raise ValueError("steps = 0 evaluates the held-out panel, and this config has none")
    with agent.gathered():  # FSDP: every rank plays its share on the full weights
        row = {"step": 0, "optimizer_steps": 0, **panel.evaluate(agent, 0, ranks)}
        if ranks.main:
            (run_dir / RUN_CONFIG_FILE).write_text(_json(config.to_dict()))
            metrics = run_dir / METRICS_FILE
            metrics.unlink(missing_ok=True)  # evaluated again: the new figures replace the old
            MetricsLog(metrics).write(row)
    return []


def _play_task(config, domain, task, index, step, speaker, user, on_finished=None) -> list[Any]:
    """The G conversations of the step's task number `index`. Torch's and the simulator's
    generators are seeded from (seed, step, index), so a task's rollouts are the same whichever
    rank plays it: a run gives the same result at any process count."""
    torch.manual_seed(_task_seed(config.seed, step, index))
    if isinstance(getattr(user, "rng", None), random.Random):
        user.rng.seed(f"{config.seed}-{step}-{index}-user")
    if hasattr(user, "begin_task"):  # an Ensemble draws each rollout's member from its position
        user.begin_task(index)
    # at most rollouts_at_once conversations open at once (their transcripts' KV caches are
    # the rollout phase's memory, training/tools/dryrun.py): the group in parts, one after the other
    redraw = random.Random(f"{config.seed}-{step}-{index}-redraw")
    at_once = config.rollouts_at_once or config.group_size
    played: list[Any] = []
    taken = [0, 0]  # turns taken in the parts played before, and in the one playing

    def report(n: int, turns: int) -> None:
        taken[1] = turns
        if on_finished is not None:
            on_finished(len(played) + n, taken[0] + turns)

    for first in range(0, config.group_size, at_once):
        size = min(at_once, config.group_size - first)
        taken[0], taken[1] = taken[0] + taken[1], 0
        played += play(
            domain,
            [task] * size,
            speaker,
            user,
            max_turns=config.max_turns,
            max_tool_rounds=config.max_tool_rounds,
            redraw=redraw,
            on_finished=report,
            first=first,
        )
    return played


def _task_seed(seed: int, step: int, index: int) -> int:
    return random.Random(f"{seed}-{step}-{index}-torch").getrandbits(63)


def select_scenarios(domain: Domain, spec: ScenarioSpec, which: str) -> list[Scenario]:
    """The scenarios of the train or eval side: explicit ids, else the split, capped."""
    split = spec.train_split if which == "train" else spec.eval_split
    ids = spec.train_ids if which == "train" else spec.eval_ids
    cap = spec.max_train if which == "train" else spec.max_eval
    if ids:
        by_id = {s.id: s for s in domain.scenarios(None)}
        unknown = [i for i in ids if i not in by_id]
        if unknown:
            raise ValueError(
                f"tasks.{which}_ids: unknown scenario ids {unknown[:5]} in {domain.name}"
            )
        tasks = [by_id[i] for i in ids]
    else:
        tasks = domain.scenarios(split)
    tasks = tasks[:cap] if cap else tasks
    if which == "train" and not tasks:
        raise ValueError(f"no training scenarios in domain {domain.name!r} split {split!r}")
    return tasks


def step_tasks(config: RunConfig, tasks: list[Scenario], step: int) -> list[Scenario]:
    """The step's tasks (config.task_draw): a seeded draw from the train split, or with
    "release" the fixed list released_tasks gave, the same every step."""
    if config.task_draw == "release":
        return list(tasks)
    return draw_tasks(tasks, config.batch_tasks, random.Random(f"{config.seed}-{step}"))


def released_tasks(domain: Domain, config: RunConfig, train: list[Scenario]) -> list[Scenario]:
    """The batch_tasks tasks the release's tau2 runs played every step (TASK_DRAWS["release"]:
    its data source's fallback gave sample indices 0 .. batch_tasks - 1). Frozen-user regimes:
    train task number index, in the data's order (usim/slime/rollout.py@9d3a41e2 tasks[index]).
    Co-training (cotrain, population): the task whose id is str(index) among ALL the Domain's
    tasks, test tasks included (tau2_cotrain_rollout.py@6218b975 task_id = str(sample.index))."""
    n = config.batch_tasks
    if not config.trains_simulator:
        return [train[i % len(train)] for i in range(n)]
    by_id = {s.id: s for s in domain.scenarios(None)}
    missing = [str(i) for i in range(n) if str(i) not in by_id]
    if missing:
        raise ValueError(
            f'task_draw = "release" plays task ids 0..{n - 1}, as the release\'s co-training did;'
            f" {domain.name} has no task {', '.join(missing[:5])}"
        )
    return [by_id[str(i)] for i in range(n)]


def draw_tasks(tasks: list[Scenario], n: int, rng: random.Random) -> list[Scenario]:
    """n distinct tasks when there are enough, else with repeats."""
    return rng.sample(tasks, n) if n <= len(tasks) else [rng.choice(tasks) for _ in range(n)]


def _json(data: Any) -> str:
    import json

    return json.dumps(data, indent=2, default=str)
