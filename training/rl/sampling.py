"""Sampling that reuses what was already computed: LocalModel.sample's own loop.

Transformers' `generate` prefills every prompt whole on every call, so a conversation's turn n
recomputes the keys and values of turns 1..n-1, for each of the group's rows, although the
rows share their opening (the system prompt) and each turn only extends the last. This loop
prefills only what is new:

- a carried cache (KVCache, one per Transcript: one speaker's view of one conversation) keeps
  the keys and values of the ids its model last ran; the next prompt reuses them up to the
  longest common prefix (the whole of it when the transcript only grew; less when an untracked
  simulator's own reply comes back as re-tokenized text), and only the rest is prefilled;
- rows without a usable cache whose prompts share a prefix (the group's rows: one task, one
  system prompt) prefill that prefix once, and each row continues from it.

Then it decodes the rows as one left-padded batch, as `generate` does, and draws each step's
tokens as `generate`'s sampling does (`_sample` in transformers/generation/utils.py): the
logits processor (if any) on the padded ids so far, the temperature, a softmax, and one
`torch.multinomial` over the whole batch, finished rows included, so torch's generator draws
the same numbers in the same order. The tokens are the old path's for the same seed wherever
the recomputed logits (which differ from `generate`'s by float rounding, ~1e-6) do not move a
draw across a boundary: checked on whole conversations in tests/training/rl/test_sampling.py,
not guaranteed for every seed.

A cache is valid for the weights it was computed with: rollouts.play drops a conversation's
caches when it ends, and no weights change while conversations are played.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

SHARED_MIN = 8  # a shared prefix shorter than this is not worth its own forward pass

Layers = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values): [1, heads, len, dim]


class KVCache:
    """The keys and values one model computed for one transcript's ids (`ids`, in order), and
    which model computed them (`owner`): what the next turn's prompt can start from."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.ids: list[int] = []
        self.layers: Layers | None = None
        self.owner: int | None = None

    def reusable(self, owner: int, prompt: list[int]) -> int:
        """How many leading ids of `prompt` this cache holds for `owner`'s model; at least one
        prompt id is always left to run, since its logits are the first draw's."""
        if self.layers is None or self.owner != owner:
            return 0
        return common_prefix(self.ids, prompt, len(prompt) - 1)

    def keep(self, owner: int, ids: list[int], layers: Layers) -> None:
        self.ids, self.layers, self.owner = ids, layers, owner


def common_prefix(a: list[int], b: list[int], limit: int) -> int:
    n = min(len(a), len(b), limit)
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def plain_cache_model(model: Any) -> bool:
    """Whether every layer's cache is a plain growing one (no sliding window), which this loop's
    slicing and padding of keys and values assumes."""
    return all(type(layer) is DynamicLayer for layer in DynamicCache(config=model.config).layers)


def _prefill(model: Any, ids: list[int], start: int, layers: Layers | None, device: Any):
    """Run `ids` (positions start..) after `layers`; the last position's logits and the
    keys and values of everything so far."""
    cache = DynamicCache(ddp_cache_data=layers) if layers else DynamicCache()
    x = torch.tensor([ids], device=device)
    positions = torch.arange(start, start + len(ids), device=device)[None]
    out = model(input_ids=x, position_ids=positions, cache=cache, use_cache=True, logits_to_keep=1)
    kept = [(layer.keys, layer.values) for layer in cache.layers]
    return out.logits[:, -1].to(dtype=torch.float32), kept


def _slice(layers: Layers, row: int, begin: int, end: int) -> Layers:
    return [(k[row : row + 1, :, begin:end], v[row : row + 1, :, begin:end]) for k, v in layers]


def sample_reusing(
    lm: Any,
    prompts: list[list[int]],
    temperature: float,
    max_new_tokens: int,
    logits_processor: Any = None,
    caches: list[KVCache] | None = None,
) -> list[list[int]]:
    """LocalModel.sample's continuations (see the module's docstring), each cut after its first
    stop token; `caches` (one per prompt, or None) are read and then hold the prompt and the
    sampled ids that were run. Counts tokens run in prefill in lm.counts["prefilled"]."""
    model, device, owner = lm.model, lm.device, id(lm)
    rows = len(prompts)
    starts = [
        c.reusable(owner, p) if c is not None else 0
        for c, p in zip(caches or [None] * rows, prompts, strict=True)
    ]
    past: list[Layers | None] = (
        [caches[i].layers if starts[i] else None for i in range(rows)] if caches else [None] * rows
    )
    # the group's rows: a prefix shared by rows that start from nothing is run once
    fresh = [i for i in range(rows) if starts[i] == 0]
    while fresh:
        first = fresh[0]
        shared = [
            i for i in fresh if common_prefix(prompts[first], prompts[i], SHARED_MIN) == SHARED_MIN
        ]
        fresh = [i for i in fresh if i not in shared]
        if len(shared) < 2:
            continue
        length = min(common_prefix(prompts[first], prompts[i], len(prompts[i]) - 1) for i in shared)
        if length < SHARED_MIN:
            continue
        _, layers = _prefill(model, prompts[first][:length], 0, None, device)
        lm.counts["prefilled"] += length
        for i in shared:
            starts[i], past[i] = length, layers
    # each row's own new ids, on top of what it starts from
    logits, full = [], []
    for i, prompt in enumerate(prompts):
        row_logits, layers = _prefill(model, prompt[starts[i] :], starts[i], past[i], device)
        lm.counts["prefilled"] += len(prompt) - starts[i]
        logits.append(row_logits)
        full.append(layers)
    # one left-padded batch, as generate holds it: row i's keys end at column `width`
    lengths = [len(p) for p in prompts]
    width = max(lengths)
    batch = [
        (
            torch.cat([F.pad(full[i][n][0], (0, 0, width - lengths[i], 0)) for i in range(rows)]),
            torch.cat([F.pad(full[i][n][1], (0, 0, width - lengths[i], 0)) for i in range(rows)]),
        )
        for n in range(len(full[0]))
    ]
    del full
    cache = DynamicCache(ddp_cache_data=batch)
    del batch
    mask = torch.zeros((rows, width), dtype=torch.long, device=device)
    ids = torch.full((rows, width), lm.pad_id, dtype=torch.long, device=device)
    for i, prompt in enumerate(prompts):
        mask[i, width - lengths[i] :] = 1
        ids[i, width - lengths[i] :] = torch.tensor(prompt, device=device)
    stops = torch.tensor(lm.stop_ids, device=device)
    unfinished = torch.ones(rows, dtype=torch.long, device=device)
    positions = torch.tensor(lengths, device=device)
    next_logits = torch.cat(logits)
    drawn = 0
    for step in range(max_new_tokens):
        scores = next_logits
        if logits_processor is not None:
            scores = logits_processor(ids, scores)
        if temperature != 1.0:  # generate's TemperatureLogitsWarper, after the processors
            scores = scores / temperature
        tokens = torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)
        tokens = tokens * unfinished + lm.pad_id * (1 - unfinished)
        ids = torch.cat([ids, tokens[:, None]], dim=-1)
        unfinished = unfinished & ~torch.isin(tokens, stops)
        drawn += 1
        if unfinished.max() == 0 or step == max_new_tokens - 1:
            break
        mask = torch.cat([mask, mask.new_ones((rows, 1))], dim=-1)
        out = model(
            input_ids=tokens[:, None],
            attention_mask=mask,
            position_ids=(positions + step)[:, None],
            cache=cache,
            use_cache=True,
        )
        next_logits = out.logits[:, -1].to(dtype=torch.float32)
    samples = []
    for row in ids[:, width:].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in lm.stop_ids), len(row))
        samples.append(row[:cut])
    if caches:
        # what was run for row i: its prompt, then the drawn ids that were fed back (all but
        # the last draw), up to its own stop token
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        for i, (c, sample) in enumerate(zip(caches, samples, strict=True)):
            if c is None:
                continue
            fed = min(len(sample), drawn - 1)
            c.keep(
                owner, prompts[i] + sample[:fed], _slice(layers, i, width - lengths[i], width + fed)
            )
    return samples
