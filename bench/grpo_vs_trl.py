"""One GRPO update of ours (training.rl.grpo.update) against TRL's GRPOTrainer loss and update, on
the same tiny model, batch and lengths, in one run. Prints both losses (they must agree: both
are the token-level mean, TRL's loss_type="bnpo") and the time ratio, for two batches: every
row with a prompt of its own ("distinct"), and groups of --group rows sharing one prompt, as a
GRPO group's rollouts do ("shared"; ours runs each group's prompt once, TRL runs every row).

    .venv/bin/python bench/grpo_vs_trl.py [--batch 8] [--group 4] [--prompt 256] [--completion 64]
                                          [--repeat 5]

Needs `trl` (the test extra) and the prepared SmolLM2 folder for its tokenizer. It imports the
checkout it lives in (a worktree's bench measures that worktree's code).
"""

from __future__ import annotations

import argparse
import copy
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's training/, not the one the venv was installed from


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def commit() -> str:
    found = subprocess.run(
        ["git", "describe", "--always", "--dirty"], capture_output=True, text=True, cwd=REPO
    )
    return found.stdout.strip() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--group", type=int, default=4, help="rows per prompt in the shared batch")
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--completion", type=int, default=64)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    from agents.serving.prepare import ensure_base_model
    from training.tools.tiny import build_tiny_model

    print(f"commit {commit()}; torch threads {torch.get_num_threads()}")
    print(f"uptime before: {uptime()}")
    work = Path(tempfile.mkdtemp(prefix="grpo-bench-"))
    try:
        path = build_tiny_model(
            work / "model",
            ensure_base_model(),
            layers=args.layers,
            hidden=args.hidden,
            init_range=0.02,
        )
        b, p, c = args.batch, args.prompt, args.completion
        g = torch.Generator().manual_seed(0)
        prompt_ids = torch.randint(3, 49152, (b, p), generator=g)
        completion_ids = torch.randint(3, 49152, (b, c), generator=g)
        completion_mask = torch.ones(b, c, dtype=torch.long)
        completion_mask[: b // 2, c * 3 // 4 :] = 0  # some completions ended early
        advantages = torch.randn(b, generator=g)
        shared = prompt_ids[:: args.group].repeat_interleave(args.group, 0)[:b]
        print(
            f"batch {b} x (prompt {p} + completion {c}) tokens, {args.layers} layers, "
            f"hidden {args.hidden}, vocab 49152; shared: {b // args.group} prompts x "
            f"{args.group} rows"
        )
        for name, prompts in (("distinct", prompt_ids), ("shared", shared)):
            compare(name, path, work, prompts, completion_ids, completion_mask, advantages, args)
        print(f"uptime after: {uptime()}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def compare(
    name: str,
    path: Path,
    work: Path,
    prompt_ids: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    advantages: torch.Tensor,
    args: argparse.Namespace,
) -> None:
    """Ours and TRL's update on this batch, each on a fresh copy of the model, timed in turn."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from training.rl.grpo import update
    from training.rl.logprobs import TokenBatch
    from training.rl.policy import adamw

    b, p = prompt_ids.shape
    c = completion_ids.shape[1]
    # ours: one sequence per row, mask 1 on the completion tokens
    ours_model = AutoModelForCausalLM.from_pretrained(path)
    ids = torch.cat([prompt_ids, completion_ids], 1)
    mask = torch.cat([torch.zeros(b, p), completion_mask.float()], 1)
    batch = TokenBatch(ids, torch.ones_like(ids), mask)
    ours_opt = adamw(list(ours_model.parameters()), lr=1e-6)  # as Policy builds it

    # TRL: the trainer built as for a run, its loss and an optimizer step timed alone
    trl_model = AutoModelForCausalLM.from_pretrained(path)
    config = GRPOConfig(
        output_dir=str(work / "trl"),
        per_device_train_batch_size=b,
        num_generations=b,
        max_completion_length=c,
        learning_rate=1e-6,
        beta=0.0,
        epsilon=0.2,
        loss_type="bnpo",
        use_cpu=True,
        report_to=[],
        logging_steps=1000,
        save_strategy="no",
        bf16=False,  # ours runs float32 on CPU: compare like with like
        gradient_checkpointing=False,
    )
    data = Dataset.from_dict({"prompt": ["hi"] * b})
    trainer = GRPOTrainer(
        model=trl_model,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=config,
        train_dataset=data,
    )
    trainer.create_optimizer()
    trainer.current_gradient_accumulation_steps = 1  # set by its training loop otherwise
    inputs = {
        "prompt_ids": prompt_ids,
        "prompt_mask": torch.ones_like(prompt_ids),
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": advantages,
        "num_items_in_batch": completion_mask.sum(),
    }

    def ours_step() -> float:
        stats = update(
            ours_model,
            ours_opt,
            batch,
            advantages,
            eps=0.2,
            eps_high=0.2,
            beta=0.0,
            micro_batch=b,
        )
        return stats["loss"]

    def trl_step() -> float:
        trl_model.train()
        trainer.optimizer.zero_grad()
        loss = trainer._compute_loss(trl_model, copy.copy(inputs))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trl_model.parameters(), 1.0)
        trainer.optimizer.step()
        return loss.item()

    # warm-up, and the losses must agree. With one epoch the ratio is 1 and the loss is
    # -sum(A * mask) / tokens whatever the log-probs, so the gradients (both clipped to norm 1,
    # left in .grad by the step) are compared too: they carry the log-probs' derivatives.
    ours_loss, trl_loss = ours_step(), trl_step()
    trl_grads = dict(trl_model.named_parameters())
    grad_diff = max(
        float((p.grad - trl_grads[n].grad).abs().max()) for n, p in ours_model.named_parameters()
    )
    grad_max = max(float(p.grad.abs().max()) for p in trl_model.parameters())
    times = {"ours": [], "trl": []}
    for _ in range(args.repeat):
        for who, step in (("ours", ours_step), ("trl", trl_step)):
            t0 = time.perf_counter()
            step()
            times[who].append(time.perf_counter() - t0)
    ours_t, trl_t = statistics.median(times["ours"]), statistics.median(times["trl"])
    print(
        f"[{name}] trl settings: bf16={config.bf16} "
        f"gradient_checkpointing={config.gradient_checkpointing} optim={config.optim}; "
        f"ours: AdamW fused={ours_opt.defaults['fused']}"
    )
    print(
        f"[{name}] first-step loss: ours {ours_loss:.6f}  trl {trl_loss:.6f}  "
        f"(|diff| {abs(ours_loss - trl_loss):.2e}); gradients: max |diff| {grad_diff:.2e} "
        f"(largest entry {grad_max:.2e})"
    )
    print(
        f"[{name}] update time (median of {args.repeat}): ours {ours_t:.3f}s  trl {trl_t:.3f}s  "
        f"(ours {' '.join(f'{t:.2f}' for t in times['ours'])}; "
        f"trl {' '.join(f'{t:.2f}' for t in times['trl'])})"
    )
    print(f"[{name}] time ratio ours / trl: {ours_t / trl_t:.2f}   uptime: {uptime()}")


if __name__ == "__main__":
    main()
