"""The trainer, top to bottom: rollouts, GRPO step, the regime's own step, evaluation, checkpoint.

    from training.config import load_config
    from training.trainer.loop import train
    checkpoints = train(load_config("training/configs/p4g-single-cpu.toml"), progress_callback=print)

Running it again with the same output folder resumes from the last checkpoint.
`progress_callback` gets a dict after every step:
    {"step", "total_steps", "reward", "heldout_success", "eta_seconds", "metrics", "checkpoint",
     "warnings"}
`warnings` lists the run's collapse warnings so far (training/measures/diversity.py), each printed once
when its threshold is first crossed. `within_step` gets, while a step runs (rank 0), the last
step's dict with `current`: {"step", "phase": rollouts | update | evaluation, "rollouts_done",
"rollouts_total"} (rank 0's share of the step's rollouts), so a long step shows it is moving.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from agents.domains.base import Domain, Scenario
from training.config import RunConfig, TaskSpec
from training.measures.collapse import (
    load_or_find_exploit,
    mixture_exploit,
    simulator_exploit,
    step_metrics,
)
from training.measures.diversity import Embedder, Warnings, step_diversity
from training.measures.held_out import HeldOutPanel
from training.measures.metrics import MetricsLog, plot
from training.regimes.regime import ModelCache, frozen_simulator, make_regime
from training.rl.distributed import Ranks
from training.rl.grpo import group_advantages
from training.rl.policy import Policy
from training.rollouts.agent import EndpointAgent, LocalAgent, agent_tool_format
from training.rollouts.rollout import play
from training.trainer import checkpoint

Progress = Callable[[dict[str, Any]], None]


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
    except Exception as exc:
        # the launcher stops the other ranks; this file says which one failed and why
        ranks.record_failure(config.run_dir(), exc)
        raise
    finally:
        torch.set_num_threads(threads)
        ranks.close()


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
    domain = domain or _domain(config.domain, config.domain_data)
    train_tasks = select_tasks(domain, config.tasks, "train")
    eval_tasks = select_tasks(domain, config.tasks, "eval")
    torch.manual_seed(config.seed)

    models = ModelCache(config)
    agent = Policy.for_run(config, lr=config.agent_lr, ranks=ranks)
    panel = HeldOutPanel(config, domain, eval_tasks, models)
    if config.steps == 0:  # a base evaluation: no regime, no simulator loaded, no step taken
        return _evaluate_start(config, run_dir, agent, panel, ranks)
    regime = make_regime(config, run_dir, models, ranks)
    # every rank loads the same global checkpoint (adapter, optimizer, RNG), so a run resumes at
    # any process count
    start = checkpoint.resume(run_dir, config, agent, regime)
    main = ranks.main  # rank 0 alone writes the run's files
    log = MetricsLog(run_dir / "metrics.jsonl", resume_step=start) if main else None
    samples = MetricsLog(run_dir / "samples.jsonl", resume_step=start) if main else None
    if main:
        (run_dir / "config.json").write_text(_json(config.to_dict()))
    # the optimizers' rates as set (LoRA scales them: lora.lr_scale), in every metrics row
    rates = {"lr": config.agent_lr} | ({"sim/lr": config.sim_lr} if config.trains_simulator else {})
    # the frozen simulator's dominant mode, where the task makes it exact (training/measures/collapse.py):
    # the training simulator as it starts, plain (a Verbalized one's underlying model); an
    # Ensemble's is that of the even mixture of its members, which the rotation makes it
    base_users = [
        dataclasses.replace(s, kind="plain") if s.kind == "verbalized" else s
        for s in config.training_simulators()
    ]
    exploit = None
    if main and domain.first_speaker == "agent" and not any(s.endpoint for s in base_users):
        exploit = load_or_find_exploit(
            run_dir,
            lambda: mixture_exploit(
                [
                    simulator_exploit(domain, train_tasks, frozen_simulator(s, models, config.seed))
                    for s in base_users
                ]
            ),
        )

    tool_format = agent_tool_format(config.tool_format, agent)  # "json" | "native"
    speaker = LocalAgent(agent, config.temperature, config.max_new_tokens, tool_format)
    if config.rollout_endpoint:
        speaker = EndpointAgent(
            config.rollout_endpoint, agent, config.temperature, config.max_new_tokens
        )
        speaker.tool_format = tool_format
    rows = log.rows() if main else []
    warnings = Warnings(config.collapse, rows)  # a resumed run keeps the warnings it gave
    # rank 0 alone measures the step's diversity (every rank has the gathered rollouts)
    embed = None
    if main and config.collapse.embedding_model:
        embed = Embedder(config.collapse.embedding_model)
    heldout: dict[str, float] | None = _last_heldout(rows)
    optimizer_steps = int(sum(r.get("optimizer_step", 0) for r in rows))
    started, saved = time.monotonic(), checkpoint.list_checkpoints(run_dir)
    show_progress = show_progress and main
    bar = tqdm(total=config.steps, initial=start, desc=config.name, disable=not show_progress)
    last: dict[str, Any] = {"total_steps": config.steps}  # the last step's progress, as sent
    for step in range(start + 1, config.steps + 1):
        t0 = time.monotonic()
        # 1. rollouts: G conversations for each of this rank's share of the step's tasks
        tasks = draw_tasks(train_tasks, config.batch_tasks, random.Random(f"{config.seed}-{step}"))
        share = ranks.share(list(enumerate(tasks)))
        within = _within_step(within_step if main else None, last, step, share, config)
        within("rollouts", 0)
        if config.rollout_endpoint:  # the server samples from the adapter as it is now
            live = run_dir / "live" / f"step-{step - 1:06d}"
            with agent.gathered():  # FSDP: the adapter is gathered by every rank
                speaker.publish(agent, live, f"{config.name}-live-{step - 1}", ranks)
        mine = []
        # FSDP: the models sampling in this process do so on their full weights, gathered once
        # for the whole phase by every rank (generation itself then makes no collectives)
        sampling = agent.gathered() if not config.rollout_endpoint else nullcontext()
        with sampling, regime.gathered(), regime.simulator(step) as user:
            for index, task in share:
                done = len(mine)
                ended = lambda n, done=done, within=within: within("rollouts", done + n)  # noqa: E731
                mine += _play_task(config, domain, task, index, step, speaker, user, ended)
        rewards = torch.tensor([r.reward for r in mine]).view(-1, config.group_size)
        t_rollout = time.monotonic() - t0
        within("update", len(mine))

        # 2. the agent's GRPO step on its own tokens (data-parallel: this rank's rows, the
        # gradients summed over the ranks)
        adv = group_advantages(rewards, config.scale_std, config.center_rewards).flatten()
        stats = agent.learn(
            [r.agent for r in mine],
            adv,
            config,
            temperature=config.temperature,
            beta=config.beta,
            ranks=ranks,
        )
        # 3. the regime's own step (co-training: the simulator learns on this rank's rollouts,
        # data-parallel like the agent; population: rank 0 adds to the pool)
        stats.update(regime.learn(step, mine))
        rollouts = ranks.gather(mine)  # the whole step, in task order, on every rank
        rewards = torch.tensor([r.reward for r in rollouts]).view(len(tasks), config.group_size)
        row = {
            "step": step,
            "reward_mean": float(rewards.mean()),
            "reward_std": float(rewards.std()) if rewards.numel() > 1 else 0.0,
            "success": statistics.fmean(bool(r.outcome.success) for r in rollouts),
            "turns": statistics.fmean(len(r.conversation) for r in rollouts),
            "fallbacks": sum(r.fallbacks for r in rollouts),
            "optimizer_step": float(stats.get("trained_sequences", 0) > 0),
            **rates,
            **stats,
            **regime.metrics(step, rollouts),
            **step_metrics(rollouts, exploit),
            **(step_diversity([r.conversation for r in rollouts], embed) if main else {}),
            "time_rollout": t_rollout,
        }

        optimizer_steps += int(row["optimizer_step"])
        row["optimizer_steps"] = optimizer_steps  # so far: 0 means the adapter is still the base

        # 4. held-out evaluation every eval_every steps and at the end (rank 0, on the agent's
        # full weights under FSDP; the others wait at the next step's first collective)
        if panel and _due(step, config.eval_every, config.steps):
            within("evaluation", len(mine))
            with agent.gathered():
                if main:
                    heldout = panel.evaluate(agent, step)
                    row.update(heldout)
        row["time_step"] = time.monotonic() - t0
        # tests: a rank dies after the step's update, as rank 0 is about to write its checkpoint
        ranks.check_injected_failure(step)
        if not main:
            if _due(step, config.save_every, config.steps):  # its part of the gathering
                checkpoint.save(run_dir, step, config, agent, regime, row, ranks=ranks)
            continue
        log.write(row)
        for warning in warnings.check(row):  # once per threshold, when first crossed
            tqdm.write(f"collapse warning: {warning['message']}", file=sys.stderr)
        samples.write_many(
            {"step": step, "task": r.scenario.id, "reward": r.reward, "end_reason": r.end_reason,
             "conversation": r.conversation}
            for r in rollouts[:: config.group_size]
        )  # fmt: skip

        # 5. checkpoint every save_every steps and at the end, with the plots beside it
        folder = None
        if _due(step, config.save_every, config.steps):
            folder = checkpoint.save(run_dir, step, config, agent, regime, row, ranks=ranks)
            saved = checkpoint.list_checkpoints(run_dir)
            plot(log.rows(), run_dir)

        bar.update(1)
        bar.set_postfix(reward=f"{row['reward_mean']:.3f}", entropy=f"{row['entropy']:.2f}")
        if progress_callback is not None:
            done = step - start
            eta = (time.monotonic() - started) / done * (config.steps - step)
            last = {
                "step": step,
                "total_steps": config.steps,
                "reward": row["reward_mean"],
                "heldout_success": _heldout_summary(heldout),
                "eta_seconds": eta,
                "metrics": row,
                "checkpoint": str(folder) if folder else None,
                "warnings": list(warnings.seen),
            }
            progress_callback(last)
    bar.close()
    return saved


def _evaluate_start(
    config: RunConfig, run_dir: Path, agent: Policy, panel: HeldOutPanel, ranks: Ranks
) -> list[Path]:
    """`steps = 0`: the starting policy against the held-out panel, written as metrics row 0
    (the release measures its Base rows the same way: the evaluation at rollout 0, before any
    update; cmd/slime/eval_base.sh). Nothing else is written: there is no checkpoint."""
    if not panel:
        raise ValueError("steps = 0 evaluates the held-out panel, and this config has none")
    with agent.gathered():  # FSDP: rank 0 evaluates on the full weights, as after a step
        if ranks.main:
            (run_dir / "config.json").write_text(_json(config.to_dict()))
            row = {"step": 0, "optimizer_steps": 0, **panel.evaluate(agent, 0)}
            metrics = run_dir / "metrics.jsonl"
            metrics.unlink(missing_ok=True)  # evaluated again: the new figures replace the old
            MetricsLog(metrics).write(row)
    return []


def _within_step(
    callback: Progress | None, last: dict, step: int, share: list, config: RunConfig
) -> Callable[[str, int], None]:
    """Sends the last step's progress with where this step is (`current`), or nothing."""
    total = len(share) * config.group_size
    # the last step's checkpoint stays: a reader of the progress file may not have seen it
    before = dict(last)

    def within(phase: str, rollouts_done: int) -> None:
        if callback is not None:
            current = {"step": step, "phase": phase, "rollouts_done": rollouts_done,
                       "rollouts_total": total}  # fmt: skip
            callback({**before, "current": current})

    return within


def _play_task(config, domain, task, index, step, speaker, user, on_finished=None) -> list[Any]:
    """The G conversations of the step's task number `index`. Torch's and the simulator's
    generators are seeded from (seed, step, index), so a task's rollouts are the same whichever
    rank plays it: a run gives the same result at any process count."""
    torch.manual_seed(_task_seed(config.seed, step, index))
    if isinstance(getattr(user, "rng", None), random.Random):
        user.rng.seed(f"{config.seed}-{step}-{index}-user")
    if hasattr(user, "begin_task"):  # an Ensemble draws each rollout's member from its position
        user.begin_task(index)
    return play(
        domain, [task] * config.group_size, speaker, user,
        max_turns=config.max_turns, max_tool_rounds=config.max_tool_rounds,
        redraw=random.Random(f"{config.seed}-{step}-{index}-redraw"), on_finished=on_finished,
    )  # fmt: skip


def _task_seed(seed: int, step: int, index: int) -> int:
    return random.Random(f"{seed}-{step}-{index}-torch").getrandbits(63)


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
