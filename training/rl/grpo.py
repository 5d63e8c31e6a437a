"""GRPO: group-relative advantages, the clipped token-level loss, and one policy update.

Shapes: B sequences of T tokens. `mask[b, t]` is 1 where token t of sequence b was sampled by the
model being trained (see training/rl/tokens.py), so every sum below runs over those tokens only.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from agents.serving.kvcache import cache_arg, cache_of
from training.rl.distributed import Ranks, full_weights

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


@dataclass
class TokenBatch:
    """Right-padded training sequences. mask marks the tokens to train on (policy tokens);
    `allowed[b]` maps a token index of row b to the token ids its sampling was restricted to
    (choice turns, training/rl/choices.py), so the loss uses the distribution that was sampled."""

    ids: torch.Tensor  # [B, T] long
    attention: torch.Tensor  # [B, T] long
    mask: torch.Tensor  # [B, T] float
    allowed: list[dict[int, list[int]]] | None = None

    @classmethod
    def from_lists(
        cls,
        ids: list[list[int]],
        masks: list[list[int]],
        pad_id: int,
        allowed: list[dict[int, list[int]]] | None = None,
    ) -> TokenBatch:
        width = max(len(x) for x in ids)
        out_ids = torch.full((len(ids), width), pad_id, dtype=torch.long)
        attention = torch.zeros((len(ids), width), dtype=torch.long)
        out_mask = torch.zeros((len(ids), width))
        for i, (seq, m) in enumerate(zip(ids, masks, strict=True)):
            out_ids[i, : len(seq)] = torch.tensor(seq)
            attention[i, : len(seq)] = 1
            out_mask[i, : len(m)] = torch.tensor(m, dtype=torch.float)
        allowed = allowed if allowed and any(allowed) else None
        return cls(out_ids, attention, out_mask, allowed)

    def __len__(self) -> int:
        return self.ids.shape[0]

    def rows(self, start: int, stop: int) -> TokenBatch:
        allowed = self.allowed[start:stop] if self.allowed else None
        return TokenBatch(
            self.ids[start:stop], self.attention[start:stop], self.mask[start:stop], allowed
        )

    def select(self, order: torch.Tensor) -> TokenBatch:
        allowed = [self.allowed[i] for i in order.tolist()] if self.allowed else None
        return TokenBatch(self.ids[order], self.attention[order], self.mask[order], allowed)


SHARED_PREFIX_MIN = 16  # tokens: below this, running the rows' common prefix once saves little


# Model types whose causal-LM head is exactly `lm_head(last_hidden_state)` (no softcapping or
# logit scaling, checked in their transformers modeling files), so the log-probs can be computed
# from the decoder's hidden states by `_head_logprobs` without the model's own logits.
PLAIN_HEAD_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "smollm3", "phi3", "olmo2"})
HEAD_CHUNK = 128  # positions per chunk of [chunk, vocab] logits in _HeadLogprobs
HEAD_KEEP_BYTES = 1 << 30  # a trained head keeps its softmax up to this size, else recomputes


def token_logprobs(
    model: torch.nn.Module,
    batch: TokenBatch,
    with_entropy: bool = False,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(token_t | tokens_<t) for every t >= 1, as a [B, T] tensor (0 where mask is 0), from
    logits / temperature (the distribution that was sampled, as TRL does), restricted to
    `batch.allowed` where a choice turn restricted the sampling.

    For a plain-head model (PLAIN_HEAD_TYPES, not under FSDP) the decoder runs once and the LM
    head is applied only at the policy tokens' positions, gathered flat, in chunks that are never
    kept whole (`_head_logprobs`): no [B, T, vocab] or padded logits tensor exists. Other models
    go through their own forward with `logits_to_keep` (`_logits_logprobs`). The rows' common
    prefix (a group's shared prompt) is run once and shared through the KV cache; gradients
    flow through it as through separate copies.
    """
    parts = _plain_head(model)
    if parts is None:
        return _logits_logprobs(model, batch, with_entropy, temperature)
    decoder, head = parts
    b, t = batch.ids.shape
    rows, cols = (batch.mask[:, 1:] > 0).nonzero(as_tuple=True)  # token cols+1 predicted at cols
    logp = torch.zeros((b, t), device=batch.ids.device)
    entropy = torch.zeros((b, t), device=batch.ids.device) if with_entropy else None
    if rows.numel() == 0:
        return logp, entropy
    hidden = _hidden_at(decoder, batch, rows, cols)  # [N, H]
    restricted = []
    if batch.allowed:
        flat = {(int(r), int(c) + 1): k for k, (r, c) in enumerate(zip(rows, cols, strict=True))}
        for row, choices in enumerate(batch.allowed):
            for index, ids in choices.items():
                if (row, index) in flat:  # a token that is not trained needs no log-prob
                    restricted.append((flat[(row, index)], ids))
    device = hidden.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
    grad = torch.is_grad_enabled() and (hidden.requires_grad or head.weight.requires_grad)
    options = (temperature, restricted, dtype, with_entropy, grad)
    flat_logp, flat_entropy = _HeadLogprobs.apply(
        hidden, head.weight, batch.ids[rows, cols + 1], options
    )
    logp = logp.index_put((rows, cols + 1), flat_logp)
    if entropy is not None:
        entropy[rows, cols + 1] = flat_entropy
    return logp, entropy


def _plain_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Linear] | None:
    """(decoder, lm_head) of a model whose logits are lm_head(decoder hidden states), else None.
    Under FSDP every pass must go through the wrapper (it gathers the shards), so never there;
    a head that LoRA or peft wraps is no plain Linear, so its own forward is used."""
    if isinstance(model, FSDP):
        return None
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    if getattr(config, "model_type", None) not in PLAIN_HEAD_TYPES:
        return None
    if not (hasattr(base, "get_decoder") and hasattr(base, "get_output_embeddings")):
        return None
    head = base.get_output_embeddings()
    if type(head) is not torch.nn.Linear or head.bias is not None:
        return None
    return base.get_decoder(), head


def _hidden_at(
    decoder: torch.nn.Module, batch: TokenBatch, rows: torch.Tensor, cols: torch.Tensor
) -> torch.Tensor:
    """The decoder's last hidden states at (rows, cols), [N, H]. Rows that share a prompt (a
    GRPO group) run it once (`_prompt_sets`); each set is cut to its own longest row."""
    out = None
    local = torch.empty(len(batch), dtype=torch.long, device=rows.device)
    whole = [(torch.arange(len(batch), device=rows.device), 0)]
    for members, shared in whole if _drops_cache(decoder) else _prompt_sets(batch):
        real = (batch.attention[members] > 0).any(dim=0).nonzero()
        width = int(real[-1]) + 1  # right-padded: nothing this set attends to lies beyond
        ids, attention = batch.ids[members, :width], batch.attention[members, :width]
        hidden = _decoder_pass(decoder, ids, attention, min(shared, width - 1))
        local[members] = torch.arange(len(members), device=rows.device)
        picked = torch.isin(rows, members).nonzero().squeeze(-1)
        values = hidden[local[rows[picked]], cols[picked]]
        out = values.new_empty((rows.numel(), values.shape[-1])) if out is None else out
        out = out.index_put((picked,), values)
    return out


def _decoder_pass(
    decoder: torch.nn.Module, ids: torch.Tensor, attention: torch.Tensor, shared: int
) -> torch.Tensor:
    """Last hidden states of rows whose first `shared` tokens are the same, [R, T, H]: that
    prefix runs once (with its gradient) and the rest of every row attends to its KV cache."""
    if shared < SHARED_PREFIX_MIN:
        return decoder(input_ids=ids, attention_mask=attention, use_cache=False).last_hidden_state
    prefix = decoder(input_ids=ids[:1, :shared], use_cache=True)
    cache = cache_of(prefix)
    cache.batch_repeat_interleave(ids.shape[0])
    rest = decoder(
        input_ids=ids[:, shared:],
        attention_mask=attention,
        use_cache=False,
        **cache_arg(decoder, cache),
    ).last_hidden_state
    return torch.cat([prefix.last_hidden_state.expand(ids.shape[0], -1, -1), rest], 1)


def _drops_cache(model: torch.nn.Module) -> bool:
    """Whether this pass runs through layers that drop the KV cache: transformers' gradient
    checkpointing does so in a training pass with gradients, so no prompt can be shared there."""
    if not (model.training and torch.is_grad_enabled()):
        return False
    return any(getattr(m, "gradient_checkpointing", False) for m in model.modules())


def _prompt_sets(batch: TokenBatch) -> list[tuple[torch.Tensor, int]]:
    """The rows as (members, shared prefix length) sets: rows whose first SHARED_PREFIX_MIN
    tokens agree form a set with their common prefix; the others one set with 0."""
    starts: dict[tuple[int, ...] | None, list[int]] = {}
    head = batch.ids[:, :SHARED_PREFIX_MIN]
    whole = (batch.attention[:, :SHARED_PREFIX_MIN] > 0).all(dim=-1)
    for i in range(len(batch)):
        key = tuple(head[i].tolist()) if whole[i] and len(batch) > 1 else None
        starts.setdefault(key, []).append(i)
    sets, alone = [], []
    for key, members in starts.items():
        if key is None or len(members) < 2:
            alone += members
        else:
            index = torch.tensor(members, device=batch.ids.device)
            sets.append((index, _shared_prefix(batch.select(index))))
    if alone:
        sets.append((torch.tensor(sorted(alone), device=batch.ids.device), 0))
    return sets


def _chunk_logits(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    start: int,
    temperature: float,
    restricted: list[tuple[int, list[int]]],
) -> torch.Tensor:
    """float32 logits / temperature of hidden rows start.. (already cut to the chunk), with the
    vocabulary of a restricted position cut to its allowed ids."""
    logits = (hidden @ weight.T).float()
    if temperature != 1.0:
        logits = logits / temperature
    for k, ids in restricted:
        if start <= k < start + hidden.shape[0]:
            keep = logits[k - start, ids].clone()
            logits[k - start] = float("-inf")
            logits[k - start, ids] = keep
    return logits


class _HeadLogprobs(torch.autograd.Function):
    """log softmax(hidden @ W.T / T)[target] per row of `hidden` ([N, H]) and, when asked, the
    entropy of that distribution (no gradient), HEAD_CHUNK rows at a time. With p the softmax
    and e = p @ W the expected output embedding ([N, H]):

        d logp / d h = (W[target] - e) / T
        d logp / d W = sum_rows (onehot(target) - p) h^T / T      (only if W is trained)
        entropy      = logsumexp - sum_v p_v logit_v = logsumexp - h . e / T

    The forward computes e (one matmul the backward would otherwise run), so a frozen head
    (LoRA) has a backward without any matmul over the vocabulary and the entropy costs no pass
    over it. A trained head needs p itself: kept when all of it fits HEAD_KEEP_BYTES (as the
    model's own log_softmax would keep it), else recomputed a chunk at a time, so memory stays
    at one chunk of logits. `dtype` is the autocast dtype of the head's matmuls (None: the
    weights' own), as in the model's own forward; the softmax is float32 either way."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, options):
        temperature, restricted, dtype, with_entropy, grad = options
        dtype = dtype or weight.dtype
        h, w = hidden.to(dtype), weight.to(dtype)
        n, vocab = h.shape[0], w.shape[0]
        train_w = grad and weight.requires_grad
        keep = train_w and n * vocab * 4 <= HEAD_KEEP_BYTES
        logp = torch.empty(n, device=h.device)
        entropy = torch.empty(n if with_entropy else 0, device=h.device)
        expected = torch.empty(h.shape, device=h.device, dtype=dtype) if grad else None
        kept = []
        for start in range(0, n, HEAD_CHUNK):
            stop = min(start + HEAD_CHUNK, n)
            logits = _chunk_logits(h[start:stop], w, start, temperature, restricted)
            target = targets[start:stop, None]
            picked = logits.gather(-1, target).squeeze(-1)
            log_probs = torch.log_softmax(logits, -1)  # row by row in cache, one fused kernel
            del logits
            logp[start:stop] = log_probs.gather(-1, target).squeeze(-1)
            if grad:
                probs = log_probs.exp_()  # a cut logit gives p = 0
                expect = probs.to(dtype) @ w
                if expected is not None:
                    expected[start:stop] = expect
                if with_entropy:
                    lse = picked - logp[start:stop]
                    inner = (h[start:stop].float() * expect.float()).sum(-1) / temperature
                    entropy[start:stop] = lse - inner
                if keep:
                    kept.append(probs)
            elif with_entropy:  # no gradient: a pass over p log p is cheaper than p @ W
                probs = log_probs.exp()
                if restricted:  # a cut logit (p = 0, log p = -inf) adds nothing
                    log_probs.masked_fill_(probs == 0, 0.0)
                entropy[start:stop] = -torch.linalg.vecdot(probs, log_probs)
        ctx.save_for_backward(h, w, targets, expected)
        ctx.kept, ctx.temperature, ctx.restricted = kept, temperature, restricted
        ctx.dtypes, ctx.train_w = (hidden.dtype, weight.dtype), train_w
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_logp, _grad_entropy):
        h, w, targets, expected = ctx.saved_tensors
        g = (grad_logp[:, None] / ctx.temperature).to(w.dtype)
        grad_h = ((w[targets] - expected) * g).to(ctx.dtypes[0])
        if not ctx.train_w:
            return grad_h, None, None, None
        # sum_rows g (onehot(target) - p) h^T, without forming it: p enters the matmul as it is
        rows = h * g
        grad_w = torch.zeros_like(w, dtype=ctx.dtypes[1])
        grad_w.index_add_(0, targets, rows.to(grad_w.dtype))
        for i, start in enumerate(range(0, h.shape[0], HEAD_CHUNK)):
            stop = min(start + HEAD_CHUNK, h.shape[0])
            if ctx.kept:
                probs = ctx.kept[i]
            else:
                logits = _chunk_logits(h[start:stop], w, start, ctx.temperature, ctx.restricted)
                probs = torch.softmax(logits, -1)
            if grad_w.dtype == w.dtype:  # accumulate in the matmul, no [V, H] temporary
                grad_w.addmm_(probs.to(w.dtype).T, rows[start:stop], alpha=-1.0)
            else:
                grad_w -= (probs.to(w.dtype).T @ rows[start:stop]).to(grad_w.dtype)
        ctx.kept = None
        return grad_h, grad_w, None, None


def _logits_logprobs(
    model: torch.nn.Module,
    batch: TokenBatch,
    with_entropy: bool = False,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """token_logprobs through the model's own forward: its logits at every position some row
    needs (`logits_to_keep`), [B, positions, vocab]."""
    b, t = batch.ids.shape
    target_mask = batch.mask[:, 1:] > 0  # token t+1 is predicted at position t
    positions = target_mask.any(dim=0).nonzero().squeeze(-1)  # positions any row needs
    logp = torch.zeros((b, t), device=batch.ids.device)
    entropy = torch.zeros((b, t), device=batch.ids.device) if with_entropy else None
    if positions.numel() == 0:
        return logp, entropy
    logits = _logits_at(model, batch, positions).float() / temperature  # [B, P, V]
    if batch.allowed:
        column = {int(p) + 1: k for k, p in enumerate(positions)}
        bias = torch.zeros_like(logits)
        for row, restricted in enumerate(batch.allowed):
            for index, ids in restricted.items():
                bias[row, column[index]] = float("-inf")
                bias[row, column[index], ids] = 0.0
        logits = logits + bias
    targets = batch.ids[:, positions + 1]
    log_probs = F.log_softmax(logits, dim=-1)
    logp[:, positions + 1] = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    policy = batch.mask > 0  # positions kept for another row of the batch stay 0 here
    if entropy is not None:
        with torch.no_grad():
            probs = log_probs.exp()
            terms = torch.where(probs > 0, probs * log_probs, torch.zeros_like(probs))
            entropy[:, positions + 1] = -terms.sum(-1)
        entropy = entropy * policy
    return logp * policy, entropy


def _logits_at(model: torch.nn.Module, batch: TokenBatch, positions: torch.Tensor) -> torch.Tensor:
    """The model's logits at `positions` for every row, [B, P, V]."""
    b, t = batch.ids.shape
    # under FSDP each call is a collective: one pass per micro-batch on every rank, never two
    sharing = b > 1 and not isinstance(model, FSDP) and not _drops_cache(model)
    shared = _shared_prefix(batch) if sharing else 0
    if shared < SHARED_PREFIX_MIN:
        out = model(input_ids=batch.ids, attention_mask=batch.attention, logits_to_keep=positions)
        return out.logits
    early, late = positions[positions < shared], positions[positions >= shared]
    prefix = model(
        input_ids=batch.ids[:1, :shared],
        use_cache=True,
        logits_to_keep=early if early.numel() else 1,
    )
    cache = cache_of(prefix)
    cache.batch_repeat_interleave(b)
    parts = [prefix.logits.expand(b, -1, -1)] if early.numel() else []
    if late.numel():
        rest = model(
            input_ids=batch.ids[:, shared:],
            attention_mask=batch.attention,
            logits_to_keep=late - shared,
            **cache_arg(model, cache),
        )
        parts.append(rest.logits)
    return torch.cat(parts, dim=1)


def _shared_prefix(batch: TokenBatch) -> int:
    """Length of the prefix every row has in common (real tokens only)."""
    same = (batch.ids == batch.ids[:1]) & (batch.attention > 0)
    differs = (~same.all(dim=0)).nonzero()
    return int(differs[0]) if differs.numel() else batch.ids.shape[1] - 1


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
                logp, old_logp, ref.get(c), adv[c[0] : c[1]], rows.mask, eps, eps_high, beta,
                kl_estimator, loss_reduction, kl_clamp,
                None if weights is None else weights[c[0] : c[1]],
            )  # fmt: skip
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
