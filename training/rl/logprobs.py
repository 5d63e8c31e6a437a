"""log pi: the policy's log-probabilities of its own tokens (with their entropy), which GRPO's
loss (training/rl/grpo.py) and the reference, held-out and exact-update passes read.

Shapes: B sequences of T tokens in a right-padded TokenBatch; `mask[b, t]` is 1 where token t of
sequence b was sampled by the model being trained (see training/rl/tokens.py). A group's shared
prompt runs once through the KV cache (`_hidden_at`, `_logits_at`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from agents.serving.kvcache import cache_arg, cache_of


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
