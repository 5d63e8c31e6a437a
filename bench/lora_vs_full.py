"""LoRA or full fine-tuning, measured: the same GRPO steps on the P4G decision episode of the
collapse experiment (training/configs/experiments/collapse.toml: SmolLM2-135M-Instruct as agent
and frozen persuadee, regime single) for three arms,

    full      finetune = "full", lr = x
    lora      finetune = "lora", lr = x                  (lora.lr_scale 1)
    lora-10x  finetune = "lora", lr = x, lora.lr_scale = 10  (LoRA's rate as "LoRA Without
              Regret" sets it: about 10x full fine-tuning's)

each from the same seed, then for each arm's final policy, exactly (training/rl/choices.py: the
agent's opening ask is one of eight fixed texts, so its distribution is computed, not sampled):

    KL train / KL held-out   mean over tasks of KL(pi_final || pi_base) of the opening-ask
                             distribution, on the training tasks and on the held-out (test)
                             tasks, which the run never trained on
    p(exploit)               the final policy's probability of the frozen simulator's exploit
                             (training/measures/collapse.py: the asks it rewards most, exploit.json), mean
                             over the training tasks; `base` is the starting policy's

and `uptime` before and after (the machine is shared: times are only comparable within a run).

    .venv/bin/python bench/lora_vs_full.py [--steps 2] [--group 4] [--lr 1e-6] [--threads 2]
                                           [--json OUT]

About 10 minutes on 2 shared cores with the defaults (the full arm also computes the exploit).
In this episode the agent's opening prompt carries no task-specific text (the persona is the
user's), so the held-out tasks' KL equals the training tasks': both are printed, as a check.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

ARMS = {
    "full": {"finetune": "full"},
    "lora": {"finetune": "lora"},
    "lora-10x": {"finetune": "lora", "lora.lr_scale": 10.0},
}


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def ask_distributions(lm: Any, domain: Any, tasks: list[Any], temperature: float) -> list[dict]:
    """Each task's exact distribution over the agent's opening asks, {ask: p}."""
    from training.rollouts.agent import agent_messages
    from training.rollouts.rollout import Rollout

    out = []
    for task in tasks:
        rollout = Rollout.begin(domain, task)
        prompt = rollout.agent.prompt(lm.fmt, agent_messages(domain, rollout))
        asks = domain.agent_choices(task, rollout.conversation)
        _, [probs] = lm.choice_probs([prompt], asks, temperature)
        out.append(dict(zip(asks, probs, strict=True)))
    return out


def kl(p: dict[str, float], q: dict[str, float]) -> float:
    return sum(pi * math.log(pi / q[a]) for a, pi in p.items() if pi > 0)


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2)
    # the paper's rate (its launchers' 1e-6, full fine-tuning)
    parser.add_argument("--lr", type=float, default=1e-6, help="x: full's and LoRA's base rate")
    parser.add_argument("--group", type=int, default=4, help="rollouts per task")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default="", help="also write the results here")
    args = parser.parse_args()

    import torch

    from training.config import load_config
    from training.rl.policy import LocalModel
    from training.tools.experiment import EXPERIMENTS
    from training.trainer.loop import _domain, select_scenarios, train

    torch.set_num_threads(args.threads)
    load_before = uptime()
    work = Path(tempfile.mkdtemp(prefix="lora-vs-full-"))
    common = {
        "steps": args.steps,
        "group_size": args.group,
        "lr": args.lr,
        "seed": args.seed,
        "threads": args.threads,
        "heldout": [],  # the held-out panel is not what is measured here
        "eval_every": 0,
        "save_every": args.steps,
    }
    results: dict[str, Any] = {"settings": vars(args), "uptime_before": load_before, "arms": {}}
    try:
        base_config = load_config(EXPERIMENTS["collapse"], {**common, "output_dir": str(work)})
        domain = _domain(base_config.domain, base_config.domain_data)
        train_scenarios = select_scenarios(domain, base_config.tasks, "train")
        eval_scenarios = select_scenarios(domain, base_config.tasks, "eval")
        temperature = base_config.temperature
        base = LocalModel.load(base_config.base_model_path())
        base_train = ask_distributions(base, domain, train_scenarios, temperature)
        base_eval = ask_distributions(base, domain, eval_scenarios, temperature)
        del base
        exploit_file = None
        for arm, changes in ARMS.items():
            out = work / arm
            out.mkdir()
            if exploit_file:  # the same frozen simulator and tasks: computed once
                shutil.copy(exploit_file, out / "exploit.json")
            config = load_config(
                EXPERIMENTS["collapse"],
                {**common, **changes, "name": f"lora-vs-full-{arm}", "output_dir": str(out)},
            )
            started = time.monotonic()
            [*_, final] = train(config, show_progress=False)
            seconds = time.monotonic() - started
            exploit_file = exploit_file or out / "exploit.json"
            exploit = set(json.loads(exploit_file.read_text())["exploit"])
            rows = [json.loads(line) for line in (out / "metrics.jsonl").open()]
            if config.finetune == "full":
                lm = LocalModel.load(final)
            else:
                lm = LocalModel.load(config.base_model_path(), adapter=str(final))
            trained = ask_distributions(lm, domain, train_scenarios, temperature)
            held_out = ask_distributions(lm, domain, eval_scenarios, temperature)
            del lm
            results["arms"][arm] = {
                "finetune": config.finetune,
                "optimizer_lr": rows[0]["lr"],
                "optimizer_steps": rows[-1]["optimizer_steps"],
                "kl_train": mean([kl(p, q) for p, q in zip(trained, base_train, strict=True)]),
                "kl_heldout": mean([kl(p, q) for p, q in zip(held_out, base_eval, strict=True)]),
                "p_exploit": mean([sum(p[a] for a in exploit) for p in trained]),
                "p_exploit_base": mean([sum(p[a] for a in exploit) for p in base_train]),
                "reward_mean_last": rows[-1]["reward_mean"],
                "seconds": seconds,
            }
            print(arm, json.dumps(results["arms"][arm]), flush=True)
        results["exploit"] = sorted(exploit)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results["uptime_after"] = uptime()

    print(f"\nuptime before: {results['uptime_before']}")
    print(f"uptime after:  {results['uptime_after']}")
    print(f"{args.steps} steps x {args.group} rollouts, x = lr {args.lr:g}, seed {args.seed}")
    print(
        "| arm | finetune | optimizer lr | optimizer steps | KL train | KL held-out |"
        " p(exploit) | p(exploit) at start | seconds |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for arm, r in results["arms"].items():
        print(
            f"| {arm} | {r['finetune']} | {r['optimizer_lr']:g} | {r['optimizer_steps']} |"
            f" {r['kl_train']:.2e} | {r['kl_heldout']:.2e} | {r['p_exploit']:.4f} |"
            f" {r['p_exploit_base']:.4f} | {r['seconds']:.0f} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
