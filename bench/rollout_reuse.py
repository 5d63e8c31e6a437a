"""One P4G CPU training step (rollouts and the agent's update), sampled two ways in one run:

    old   transformers' generate: every turn prefills each row's whole conversation again
    new   training/rl/sampling.py: a group's shared prefix prefilled once, each speaker's keys
          and values carried from turn to turn (LocalModel.reuse_kv)

Both start from the same adapter and optimizer state and the same seeds (the trainer seeds each
task's rollouts), so they should sample the same tokens: the bench says whether they did. It
prints each path's seconds (rollouts, update, step), the prompt tokens run in prefill passes
(agent and simulator together; the old path's count includes its left padding), the ratio,
and `uptime` beside each figure (the machine is shared: only figures within a run compare).

    .venv/bin/python bench/rollout_reuse.py [--config training/configs/p4g-single-cpu.toml]
                                            [--order new,old,old,new] [--json OUT]

The default order (new, old, old, new) charges any first-call warm-up to the new path and
cancels a load that drifts steadily over the run; the ratios are of the paths' mean times.
About 5 minutes on 2 shared cores with the defaults.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from training.config import load_config
from training.regimes.choose import make_regime
from training.regimes.regime import ModelCache
from training.rl.distributed import Ranks
from training.rl.policy import LocalModel, Policy
from training.trainer.loop import Run, _domain, _speaker, select_scenarios, train_step


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="training/configs/p4g-single-cpu.toml")
    parser.add_argument("--order", default="new,old,old,new")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="rollout-reuse-"))
    config = load_config(args.config, {"output_dir": str(out)})
    if config.threads:
        torch.set_num_threads(config.threads)
    ranks = Ranks.start(config)
    domain = _domain(config.domain, config.domain_data)
    torch.manual_seed(config.seed)
    models = ModelCache(config)
    agent = Policy.for_run(config, lr=config.agent_lr, ranks=ranks)
    regime = make_regime(config, out, models, ranks)
    tasks = select_scenarios(domain, config.tasks, "train")
    # no held-out panel, exploit or embedder: the step's rollouts and update only
    run = Run(
        config, out, domain, tasks, agent, _speaker(config, agent), regime, None, ranks, None, None
    )
    lms = {id(m): m for m in [agent, *models._models.values()]}.values()
    weights, optimizer = agent.adapter_state(), agent.optimizer.state_dict()
    runs: dict[str, list[dict]] = {}
    seen: dict[str, list] = {}
    for path in args.order.split(","):
        LocalModel.reuse_kv = path == "new"
        agent.load_adapter_state(weights)
        agent.optimizer.load_state_dict(optimizer)
        for lm in lms:
            lm.counts["prefilled"] = 0
            lm._remembered.clear()  # a frozen model's choice distributions: computed each run
        before = uptime()
        t0 = time.monotonic()
        row, rollouts = train_step(run, 1, lambda *a: None)
        seconds = time.monotonic() - t0
        figure = {
            "step_s": round(seconds, 1),
            "rollout_s": round(row["time_rollout"], 1),
            "update_s": round(seconds - row["time_rollout"], 1),
            "prefilled_tokens": sum(lm.counts["prefilled"] for lm in lms),
            "turns": row["turns"],
            "uptime_before": before,
            "uptime_after": uptime(),
        }
        runs.setdefault(path, []).append(figure)
        seen.setdefault(path, []).append([(r.agent.ids, r.conversation) for r in rollouts])
        print(path, json.dumps(figure), flush=True)
    figures: dict = {"runs": runs}
    if "old" in runs and "new" in runs:
        mean = {
            p: {k: sum(f[k] for f in runs[p]) / len(runs[p]) for k in ("step_s", "rollout_s")}
            for p in ("old", "new")
        }
        old, new = mean["old"], mean["new"]
        figures["ratio_step"] = round(old["step_s"] / new["step_s"], 2)
        figures["ratio_rollout"] = round(old["rollout_s"] / new["rollout_s"], 2)
        every = [s for p in ("old", "new") for s in seen[p]]
        figures["same_tokens"] = all(s == every[0] for s in every)
        print(
            f"mean step: old {old['step_s']:.1f} s, new {new['step_s']:.1f} s, "
            f"{figures['ratio_step']}x; rollouts {old['rollout_s']:.1f} s vs "
            f"{new['rollout_s']:.1f} s, {figures['ratio_rollout']}x; prefilled tokens "
            f"{runs['old'][0]['prefilled_tokens']} vs {runs['new'][0]['prefilled_tokens']}; "
            f"same tokens in every run: {figures['same_tokens']}"
        )
    figures["config"] = args.config
    figures["commit"] = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    print(uptime())
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    ranks.close()


if __name__ == "__main__":
    main()
