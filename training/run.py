"""The trainer, top to bottom: rollouts, GRPO step, the regime's own step, evaluation, checkpoint.

    from training.config import load_config
    from training.run import train
    checkpoints = train(load_config("training/configs/p4g-single-cpu.toml"), progress_callback=print)

Running it again with the same output folder resumes from the last checkpoint.
`progress_callback` gets a dict after every step:
    {"step", "total_steps", "reward", "heldout_success", "eta_seconds", "metrics", "checkpoint"}
"""

from __future__ import annotations

import dataclasses
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from agents.domains.base import Domain, Scenario
from training import checkpoint
from training.agent import EndpointAgent, LocalAgent
from training.collapse import load_or_find_exploit, simulator_exploit, step_metrics
from training.config import RunConfig, TaskSpec
from training.eval import HeldOutPanel
from training.grpo import group_advantages
from training.metrics import MetricsLog, plot
from training.policy import Policy
from training.regimes import ModelCache, frozen_simulator, make_regime
from training.rollout import play

Progress = Callable[[dict[str, Any]], None]


def train(
    config: RunConfig,
    progress_callback: Progress | None = None,
    *,
    domain: Domain | None = None,
    show_progress: bool = True,
) -> list[Path]:
    """Train (or resume) the run `config` describes; returns its checkpoint folders, oldest
    first. `domain` overrides the registry lookup of config.domain (tests use a toy Domain)."""
    threads = torch.get_num_threads()
    if config.threads:
        # OpenMP threads spin-wait for each other: on a machine shared with other work, fewer
        # threads than cores is several times faster
        torch.set_num_threads(config.threads)
    try:
        return _train(config, progress_callback, domain, show_progress)
    finally:
        torch.set_num_threads(threads)


def _train(
    config: RunConfig,
    progress_callback: Progress | None,
    domain: Domain | None,
    show_progress: bool,
) -> list[Path]:
    run_dir = config.run_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    domain = domain or _domain(config.domain, config.domain_data)
    train_tasks = select_tasks(domain, config.tasks, "train")
    eval_tasks = select_tasks(domain, config.tasks, "eval")
    torch.manual_seed(config.seed)

    models = ModelCache(config)
    agent = Policy.for_run(config, lr=config.lr, finetune=config.finetune)
    regime = make_regime(config, run_dir, models)
    panel = HeldOutPanel(config, domain, eval_tasks, models)
    start = checkpoint.resume(run_dir, config, agent, regime)
    log = MetricsLog(run_dir / "metrics.jsonl", resume_step=start)
    samples = MetricsLog(run_dir / "samples.jsonl", resume_step=start)  # one conversation per task
    (run_dir / "config.json").write_text(_json(config.to_dict()))
    # the frozen simulator's dominant mode, where the task makes it exact (training/collapse.py):
    # the training simulator as it starts, plain (a Verbalized one's underlying model)
    base_user = dataclasses.replace(config.simulator, kind="plain") if (
        config.simulator.kind == "verbalized") else config.simulator  # fmt: skip
    exploit = None
    if domain.first_speaker == "agent" and not base_user.endpoint:
        exploit = load_or_find_exploit(
            run_dir,
            lambda: simulator_exploit(
                domain, train_tasks, frozen_simulator(base_user, models, config.seed)
            ),
        )

    speaker = LocalAgent(agent, config.temperature, config.max_new_tokens)
    if config.rollout_endpoint:
        speaker = EndpointAgent(
            config.rollout_endpoint, agent, config.temperature, config.max_new_tokens
        )
    heldout: dict[str, float] | None = _last_heldout(log.rows())
    optimizer_steps = int(sum(r.get("optimizer_step", 0) for r in log.rows()))
    started, saved = time.monotonic(), checkpoint.list_checkpoints(run_dir)
    bar = tqdm(total=config.steps, initial=start, desc=config.name, disable=not show_progress)
    for step in range(start + 1, config.steps + 1):
        t0 = time.monotonic()
        # 1. rollouts: G conversations for each of this step's tasks
        tasks = draw_tasks(train_tasks, config.batch_tasks, random.Random(f"{config.seed}-{step}"))
        scenarios = [t for t in tasks for _ in range(config.group_size)]
        if config.rollout_endpoint:  # the server samples from the adapter as it is now
            live = run_dir / "live" / f"step-{step - 1:06d}"
            agent.save(live)
            speaker.load(str(live), f"{config.name}-live-{step - 1}")
            _prune_live(live)
        with regime.simulator(step) as user:
            rollouts = play(
                domain, scenarios, speaker, user,
                max_turns=config.max_turns, max_tool_rounds=config.max_tool_rounds,
                redraw=random.Random(f"{config.seed}-{step}-redraw"),
            )  # fmt: skip
        rewards = torch.tensor([r.reward for r in rollouts]).view(len(tasks), config.group_size)
        t_rollout = time.monotonic() - t0

        # 2. the agent's GRPO step on its own tokens
        adv = group_advantages(rewards, config.scale_std).flatten()
        stats = agent.learn(
            [r.agent for r in rollouts],
            adv,
            config,
            temperature=config.temperature,
            beta=config.beta,
        )

        # 3. the regime's own step (co-training: the simulator learns; population: the pool)
        stats.update(regime.learn(step, rollouts))
        row = {
            "step": step,
            "reward_mean": float(rewards.mean()),
            "reward_std": float(rewards.std()) if rewards.numel() > 1 else 0.0,
            "success": statistics.fmean(bool(r.outcome.success) for r in rollouts),
            "turns": statistics.fmean(len(r.conversation) for r in rollouts),
            "fallbacks": sum(r.fallbacks for r in rollouts),
            "optimizer_step": float(stats.get("trained_sequences", 0) > 0),
            **stats,
            **step_metrics(rollouts, exploit),
            "time_rollout": t_rollout,
        }

        optimizer_steps += int(row["optimizer_step"])
        row["optimizer_steps"] = optimizer_steps  # so far: 0 means the adapter is still the base

        # 4. held-out evaluation every eval_every steps and at the end
        if panel and _due(step, config.eval_every, config.steps):
            heldout = panel.evaluate(agent, step)
            row.update(heldout)
        row["time_step"] = time.monotonic() - t0
        log.write(row)
        samples.write_many(
            {"step": step, "task": r.scenario.id, "reward": r.reward, "end_reason": r.end_reason,
             "conversation": r.conversation}
            for r in rollouts[:: config.group_size]
        )  # fmt: skip

        # 5. checkpoint every save_every steps and at the end, with the plots beside it
        folder = None
        if _due(step, config.save_every, config.steps):
            folder = checkpoint.save(run_dir, step, config, agent, regime, row)
            saved = checkpoint.list_checkpoints(run_dir)
            plot(log.rows(), run_dir)

        bar.update(1)
        bar.set_postfix(reward=f"{row['reward_mean']:.3f}", entropy=f"{row['entropy']:.2f}")
        if progress_callback is not None:
            done = step - start
            eta = (time.monotonic() - started) / done * (config.steps - step)
            progress_callback(
                {
                    "step": step,
                    "total_steps": config.steps,
                    "reward": row["reward_mean"],
                    "heldout_success": _heldout_summary(heldout),
                    "eta_seconds": eta,
                    "metrics": row,
                    "checkpoint": str(folder) if folder else None,
                }
            )
    bar.close()
    return saved


def select_tasks(domain: Domain, spec: TaskSpec, which: str) -> list[Scenario]:
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


def draw_tasks(tasks: list[Scenario], n: int, rng: random.Random) -> list[Scenario]:
    """n distinct tasks when there are enough, else with repeats."""
    return rng.sample(tasks, n) if n <= len(tasks) else [rng.choice(tasks) for _ in range(n)]


def _domain(name: str, data_dir: str) -> Domain:
    from agents.domains import get_domain

    return get_domain(name, data_dir or None)


def _prune_live(current: Path) -> None:
    """Delete the live adapters before `current`: the server has unloaded them, and a long run
    would otherwise keep one adapter per step on disk."""
    import shutil

    for folder in current.parent.glob("step-*"):
        if folder.name < current.name:
            shutil.rmtree(folder, ignore_errors=True)


def _due(step: int, every: int, last: int) -> bool:
    return step == last or (every > 0 and step % every == 0)


def _last_heldout(rows: list[dict[str, Any]]) -> dict[str, float] | None:
    for row in reversed(rows):
        if "heldout/success" in row:
            return {k: v for k, v in row.items() if k.startswith("heldout/")}
    return None


def _heldout_summary(heldout: dict[str, Any] | None) -> dict[str, float] | None:
    """{simulator name: success rate} from the last evaluation."""
    if not heldout:
        return None
    return {
        k.split("/")[1]: v
        for k, v in heldout.items()
        if k.endswith("/success") and k.count("/") == 2
    }


def _json(data: Any) -> str:
    import json

    return json.dumps(data, indent=2, default=str)
