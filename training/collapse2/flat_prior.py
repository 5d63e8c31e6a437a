"""The flat-prior agent of collapse2: SmolLM2 fine-tuned by imitation until every ask of the P4G
decision episode is about equally likely.

The plain SmolLM2 agent already asks $2 61% of the time, so the collapse experiment had no room
to tell regimes apart. Here the agent's base (and its KL reference: the LoRA adapter disabled) is
SmolLM2 with a LoRA trained to imitate a uniform asker and merged into the weights:

    loss = - (1/8) sum_i log p(ask_i | agent prompt)

p being the exact constrained-choice probability the trainer samples from (training/rl/choices.py;
the same restriction as the GRPO loss, via TokenBatch.allowed), at the agent's temperature. It
stops as soon as every ask's probability lies in [low, high] and saves a Hugging Face model folder
with flat_prior.json (the probabilities, the steps, the source model). A folder whose
flat_prior.json matches the request is reused.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from agents.domains import get_domain
from training.config import LoraSpec
from training.rl.grpo import TokenBatch, token_logprobs
from training.rl.policy import LocalModel, Policy
from training.rollouts.agent import agent_prompt
from training.rollouts.rollout import Rollout

RECORD = "flat_prior.json"


class FlatPriorError(RuntimeError):
    pass


def ask_batch(lm: LocalModel, domain_name: str, temperature: float) -> tuple[list[str], Any]:
    """The asks and one training row per ask: the agent's prompt as the trainer builds it, then
    the ask's tokens (mask 1 where the choice was not forced)."""
    domain = get_domain(domain_name)
    scenario = domain.scenarios("train")[0]
    asks = domain.agent_choices(scenario, [])
    if not asks:
        raise FlatPriorError(f"{domain_name}: the agent's first turn is not a choice turn")
    choices = lm.choices(asks)
    rows = []
    for i in range(len(asks)):
        rollout = Rollout.begin(domain, scenario)
        agent_prompt(lm.fmt, domain, rollout)
        rollout.agent.record(lm.fmt, choices.ids[i], choices.allowed(i))
        rows.append(rollout.agent)
    batch = TokenBatch.from_lists(
        [r.ids for r in rows], [r.mask for r in rows], lm.pad_id, [r.allowed for r in rows]
    )
    return asks, batch


def ask_probs(lm: LocalModel, batch: TokenBatch, temperature: float) -> torch.Tensor:
    """Each ask's exact probability: the product over its chosen tokens of the restricted
    softmax (the rows' log-probs summed under the mask)."""
    with lm.compute():
        logp, _ = token_logprobs(lm.model, batch, temperature=temperature)
    return (logp * batch.mask).sum(-1)


def make(
    base: Path,
    out: Path,
    *,
    domain: str = "p4g-decision",
    low: float = 0.09,
    high: float = 0.16,
    temperature: float = 1.0,
    lr: float = 1e-3,
    max_steps: int = 300,
    lora: LoraSpec | None = None,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """The flat-prior model folder at `out` (made once): returns its flat_prior.json."""
    from tqdm import tqdm

    want = {"base": str(Path(base).resolve()), "domain": domain, "low": low, "high": high,
            "temperature": temperature, "lr": lr, "seed": seed}  # fmt: skip
    record_path = Path(out) / RECORD
    if record_path.is_file():
        done = json.loads(record_path.read_text())
        if {k: done.get(k) for k in want} == want:
            return done
        raise FlatPriorError(f"{out} holds another flat prior ({record_path}); remove it first")
    torch.manual_seed(seed)
    policy = Policy(base, lora=lora or LoraSpec(), lr=lr)
    asks, batch = ask_batch(policy, domain, temperature)
    policy.model.train()
    start = None
    bar = tqdm(total=max_steps, desc="flat prior", unit="step", disable=not progress)
    for step in range(max_steps + 1):
        logp = ask_probs(policy, batch, temperature)
        probs = logp.detach().exp().tolist()
        start = start or probs
        bar.set_postfix(low=f"{min(probs):.3f}", high=f"{max(probs):.3f}")
        if all(low <= p <= high for p in probs):
            break
        if step == max_steps:
            raise FlatPriorError(
                f"not flat after {max_steps} steps: {[round(p, 3) for p in probs]}"
            )
        policy.optimizer.zero_grad()
        (-logp.mean()).backward()
        policy.optimizer.step()
        bar.update(1)
    bar.close()
    policy.model.eval()
    partial = Path(str(out) + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    merged = policy.model.merge_and_unload()
    merged.save_pretrained(partial)
    policy.tokenizer.save_pretrained(partial)
    # what the saved folder gives, measured again from disk: the record says what a run gets
    saved = LocalModel.load(partial)
    final = ask_probs(saved, ask_batch(saved, domain, temperature)[1], temperature).exp().tolist()
    if not all(low <= p <= high for p in final):
        raise FlatPriorError(f"the saved model is not flat: {[round(p, 3) for p in final]}")
    record = {**want, "steps": step, "asks": asks, "probs_before": start, "probs": final}
    (partial / RECORD).write_text(json.dumps(record, indent=1))
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    return record
