"""GRPO: group-relative advantages, the clipped token-level loss, and one policy update.

Shapes: B sequences of T tokens. `mask[b, t]` is 1 where token t of sequence b was sampled by the
model being trained (see training/rl/tokens.py), so every sum below runs over those tokens only.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from training.rl.distributed import Ranks, full_weights
from training.rl.logprobs import TokenBatch, token_logprobs

STD_EPS = 1e-4


def group_advantages(
    rewards: torch.Tensor, scale_std: bool = True, center: bool = True
) -> torch.Tensor:
    """A_i = (r_i - mean(r)) / (std(r) + 1e-4) within each group (rows of `rewards`, [groups, G]).

    std is the unbiased sample std, as in DeepSeekMath and TRL. scale_std=False gives r_i - mean(r)
    (Dr. GRPO), which does not up-weight groups whose rewards barely differ. center=False gives
    A_i = r_i, the raw reward: what Slime computes with --disable-rewards-normalization, which
    every launcher of the paper's release passes (THUDM/slime slime/ray/rollout.py
    `_post_process_rewards` at 00de6b00714ea329e8f82a24340ac7f27ea63087: without
    rewards_normalization the raw rewards are returned as the advantages).
    """
    rewards = rewards.float()
    if not center:
        if scale_std:
            raise ValueError("scale_std needs center: raw rewards are not scaled")
        return rewards.clone()
    adv = rewards - rewards.mean(dim=-1, keepdim=True)
    if scale_std:
        adv = adv / (rewards.std(dim=-1, keepdim=True) + STD_EPS)
    return adv


# Per-token estimators of KL(pi || pi_ref) from the sampled token's d = ref_logp - logp (Schulman,
# "Approximating KL Divergence", 2020), as Slime's compute_approx_kl names them (the release's
# --kl-loss-type low_var_kl is k3; Slime also clamps low_var_kl to [-10, 10]: parley's kl_clamp,
# 0 = unclamped by default, as TRL's k3, which bench/grpo_vs_trl.py compares against).
KL_ESTIMATORS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "k1": lambda d: -d,  # log pi - log pi_ref: unbiased, can be negative, high variance
    "k2": lambda d: 0.5 * d * d,  # biased, >= 0; its gradient is that of the true KL
    "k3": lambda d: torch.exp(d) - d - 1.0,  # unbiased, >= 0, low variance
}


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: torch.Tensor | None,
    adv: torch.Tensor,
    mask: torch.Tensor,
    eps: float = 0.2,
    eps_high: float | None = None,
    beta: float = 0.0,
    kl_estimator: str = "k3",
    reduction: str = "token",
    kl_clamp: float = 0.0,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The GRPO loss over the policy's own tokens, reduced as `reduction` says (config:
    loss_reduction):

        ratio_t = exp(logp_t - old_logp_t)
        L_t     = -min(ratio_t * A, clip(ratio_t, 1 - eps, 1 + eps_high) * A) + beta * KL_t
        d_t     = ref_t - logp_t
        KL_t    = k1: -d_t                     (the log ratio logp - ref)
                  k2: d_t^2 / 2
                  k3: exp(d_t) - d_t - 1       (the default, >= 0; the release's low_var_kl)
        kl_clamp > 0: KL_t = clamp(KL_t, -kl_clamp, kl_clamp)   (Slime clamps low_var_kl at 10:
                the k3 of one token whose probability fell e^10-fold under the reference's
                would be ~e^10; clamped, its gradient is 0 there)
        weights: L_bt <- w_b * L_bt   (a per-sequence weight, [curation]: the advantage A is
                untouched and the denominators below are not weighted, so w_b = 1 is today's
                loss bit for bit and w_b = 0 drops sequence b as an advantage of 0 would)
        token:  loss = sum_{b,t} mask_bt * L_bt / sum_{b,t} mask_bt        (one token mean)
        sample: loss = 1/B sum_b (sum_t mask_bt * L_bt / max(sum_t mask_bt, 1))
                (each sequence's token mean, then the mean over sequences: Slime's
                sum_of_sample_mean, its default without --calculate-per-token-loss)

    logp/old_logp/ref_logp/mask: [B, T]; adv: [B] (one advantage per sequence); weights: [B]
    or None (training/measures/curation.py; mean 1 over the batch's kept sequences).
    Returns the loss and stats: kl, clip_frac (tokens whose gradient the clip removed), tokens,
    samples (B), each stat reduced as the loss is.
    """
    if kl_estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl_estimator must be one of {', '.join(KL_ESTIMATORS)}")
    if reduction not in REDUCERS:
        raise ValueError(f"reduction must be one of {', '.join(REDUCERS)}")
    eps_high = eps if eps_high is None else eps_high
    mask = mask.to(logp.dtype)
    adv = adv.to(logp.dtype).unsqueeze(-1)
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - eps, 1.0 + eps_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    kl = torch.zeros_like(logp)
    if ref_logp is not None and beta > 0:
        kl = KL_ESTIMATORS[kl_estimator](ref_logp - logp)
        if kl_clamp > 0:
            kl = torch.clamp(kl, min=-kl_clamp, max=kl_clamp)
        per_token = per_token + beta * kl
    if weights is not None:  # x * 1.0 == x exactly: weights of 1 leave the loss as it was
        per_token = per_token * weights.to(logp.dtype).unsqueeze(-1)
    reduce = REDUCERS[reduction]
    loss = reduce(per_token, mask)
    with torch.no_grad():
        stats = {
            "kl": float(reduce(kl, mask)),
            "clip_frac": float(reduce((clipped < unclipped).to(logp.dtype), mask)),
            "tokens": float(mask.sum()),
            "samples": float(mask.shape[0]),
        }
    return loss, stats


def _token_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def _sample_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    per_sample = (values * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1.0)
    return per_sample.mean()


# How the per-token losses of a batch become one number (config: loss_reduction). `token`
# weighs every token alike, so a long conversation counts more; `sample` weighs every sequence
# alike, as Slime does by default (THUDM/slime get_sum_of_sample_mean, the release's trainer).
REDUCERS = {"token": _token_mean, "sample": _sample_mean}


def update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: TokenBatch,
    adv: torch.Tensor,
    *,
    eps: float,
    eps_high: float,
    beta: float,
    micro_batch: int,
    epochs: int = 1,
    grad_clip: float = 1.0,
    reference: Callable[..., torch.Tensor] | None = None,
    reference_weights: Callable[[], Any] | None = None,
    temperature: float = 1.0,
    ranks: Any = None,
    kl_estimator: str = "k3",
    autocast: Callable[[], Any] = nullcontext,
    loss_reduction: str = "token",
    kl_clamp: float = 0.0,
    weights: torch.Tensor | None = None,
) -> dict[str, float]:
    """One GRPO step on `batch`: old and reference log-probs, then `epochs` optimizer steps.

    `reference(rows)` gives the reference policy's log-probs (Policy.reference_logprobs); it is
    needed when beta > 0. It runs on `model`'s gathered weights (LoRA: the adapter disabled),
    unless `reference_weights()` is given: the context in which a separate reference model's
    weights are whole (FSDP full fine-tuning: its frozen shards gathered by every rank), entered
    once for all of this rank's reference passes. With epochs == 1 the old log-probs are the
    current ones detached (ratio 1), which saves a forward pass, as in TRL. `autocast()` is the
    context every forward pass runs in (Policy.compute: mixed precision's 16-bit passes over
    float32 weights); the losses, backward passes and the optimizer step stay outside it.

    With beta = 0 a sequence whose advantage is 0 adds exactly 0 to the loss and its gradient,
    so it is not back-propagated (its entropy is still measured); a batch with no signal at all
    (every group's rewards equal) takes no optimizer step, since Adam's momentum alone would
    still move the weights.

    `weights` ([B] or None): each sequence's loss term times its weight (grpo_loss), the
    advantages untouched; a sequence of weight 0 (gated by [curation]) is skipped like one of
    advantage 0 and still counts in the batch's token or sequence count.
    """
    if beta > 0 and reference is None:
        raise ValueError("beta > 0 needs a reference model")
    if weights is not None and weights.shape != adv.shape:
        raise ValueError(f"weights {tuple(weights.shape)} must be one per sequence, as adv is")
    # a row without tokens of this policy (it never spoke) has nothing to train
    live = ((adv != 0) | (beta > 0)) & (batch.mask.sum(dim=-1) > 0)
    if weights is not None:
        live = live & (weights != 0)
    order = torch.cat([live.nonzero().squeeze(-1), (~live).nonzero().squeeze(-1)])
    batch = batch.select(order)
    adv, n_live = adv[order], int(live.sum())
    weights = weights[order] if weights is not None else None
    chunks = [(i, min(i + micro_batch, n_live)) for i in range(0, n_live, micro_batch)]
    # Data-parallel (`ranks`, training/rl/distributed.py): each rank holds its own tasks' rows. The
    # loss is a mean over the GLOBAL batch (of tokens, or of sequences with loss_reduction
    # "sample"), so every rank divides by that count summed over all ranks, and the gradients are
    # then summed (not averaged as DDP does): sum over ranks of (rank's sum / global count) is
    # exactly the 1-process loss over the whole batch. Whether to step at all is decided on the global count of live rows, so every rank
    # steps (or skips) together and the weights stay identical.
    #
    # FSDP (`model` an FSDP wrapper, training/rl/distributed.py): every pass through the wrapper is
    # a collective, so every rank makes the same passes: the gradient-free ones (old, reference,
    # idle rows) run on the full weights gathered once, without collectives, and the ranks agree
    # on the number of micro-batches, a rank with fewer making zero-weight passes. FSDP averages
    # gradients over the ranks where the sum above is wanted: the loss is scaled by the world.
    ranks = ranks or Ranks()
    sharded = isinstance(model, FSDP)
    full = model.module if sharded else model
    global_live = ranks.total(n_live)
    total_tokens = max(ranks.total(float(batch.mask.sum())), 1.0)
    # loss_reduction "sample": each micro-batch's mean of sequence means, weighted by its share
    # of the GLOBAL sequence count (every row, idle ones too: they add 0, as in one process)
    total_samples = max(ranks.total(float(len(batch))), 1.0)
    share = "samples" if loss_reduction == "sample" else "tokens"
    denominator = total_samples if loss_reduction == "sample" else total_tokens
    passes = ranks.most(len(chunks)) if sharded else len(chunks)
    scale = ranks.world if sharded else 1
    totals = {"loss": 0.0, "kl": 0.0, "clip_frac": 0.0, "entropy": 0.0, "grad_norm": 0.0}
    old, ref = {}, {}
    if beta > 0 and reference_weights is not None:  # a model of its own: gathered on its own
        with torch.no_grad(), reference_weights():
            for c in chunks:
                ref[c] = reference(batch.rows(*c), temperature)
    with torch.no_grad(), full_weights(model if sharded else None):
        for c in chunks:
            if epochs > 1:
                with autocast():
                    old[c] = token_logprobs(full, batch.rows(*c), temperature=temperature)[0]
            if beta > 0 and reference_weights is None:
                ref[c] = reference(batch.rows(*c), temperature)
        for i in range(n_live, len(batch), micro_batch):  # idle rows: entropy only
            rows = batch.rows(i, min(i + micro_batch, len(batch)))
            with autocast():
                entropy = token_logprobs(full, rows, with_entropy=True, temperature=temperature)
            entropy = entropy[1]
            totals["entropy"] += float((entropy * rows.mask).sum()) / total_tokens

    model.train()
    for _ in range(epochs if global_live else 0):
        optimizer.zero_grad(set_to_none=True)
        for c in chunks:
            rows = batch.rows(*c)
            with autocast():
                logp, entropy = token_logprobs(
                    model, rows, with_entropy=True, temperature=temperature
                )
            old_logp = old[c] if epochs > 1 else logp.detach()
            loss, stats = grpo_loss(
                logp,
                old_logp,
                ref.get(c),
                adv[c[0] : c[1]],
                rows.mask,
                eps,
                eps_high,
                beta,
                kl_estimator,
                loss_reduction,
                kl_clamp,
                None if weights is None else weights[c[0] : c[1]],
            )
            weight = stats[share] / denominator  # this chunk's part of the whole batch's mean
            (loss * weight * scale).backward()
            totals["loss"] += loss.item() * weight / epochs
            totals["kl"] += stats["kl"] * weight / epochs
            totals["clip_frac"] += stats["clip_frac"] * weight / epochs
            totals["entropy"] += float((entropy * rows.mask).sum()) / total_tokens / epochs
        for _ in range(passes - len(chunks)):  # FSDP: the other ranks' extra micro-batches
            with autocast():
                logits = model(input_ids=batch.ids[:1, :1]).logits
            _idle_backward(logits)
        params = [p for p in model.parameters() if p.requires_grad]
        limit = grad_clip if grad_clip > 0 else float("inf")
        if sharded:  # gradients already reduced; the norm is over every rank's shard
            norm = model.clip_grad_norm_(limit)
        else:
            ranks.sum_gradients(params)
            norm = torch.nn.utils.clip_grad_norm_(params, limit)
        totals["grad_norm"] += float(norm) / epochs
        optimizer.step()
    model.eval()
    for key in ("loss", "kl", "clip_frac", "entropy"):  # each rank's share of the global mean
        totals[key] = ranks.total(totals[key])
    totals["tokens"] = ranks.total(float(batch.mask.sum()))
    totals["trained_sequences"] = global_live
    return totals


def _idle_backward(logits: torch.Tensor) -> None:
    """The backward pass of an idle forward pass, which adds 0 to every gradient: under FSDP, a
    rank with fewer micro-batches than another still makes the collectives of that one's passes."""
    (logits.sum() * 0.0).backward()
