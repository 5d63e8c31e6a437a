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
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from agents.serving.kvcache import cache_arg
from training.rl.choices import Choices

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


def kv_dtype(lm: Any) -> torch.dtype | None:
    """The dtype keys and values are kept in: the model's compute dtype under mixed precision
    (autocast leaves the keys float32 after the float32 rotary embedding, and the values with
    them: twice the memory of the 16-bit cache a serving engine keeps); None: as computed (a
    model in its own dtype computes them in it)."""
    return getattr(lm, "compute_dtype", None)


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


def _prefill(
    model: Any, ids: list[int], start: int, layers: Layers | None, device: Any, dtype=None
):
    """Run `ids` (positions start..) after `layers`; the last position's logits and the
    keys and values of everything so far, in `dtype` when given (kv_dtype)."""
    cache = DynamicCache(ddp_cache_data=layers) if layers else DynamicCache()
    x = torch.tensor([ids], device=device)
    positions = torch.arange(start, start + len(ids), device=device)[None]
    out = model(
        input_ids=x,
        position_ids=positions,
        use_cache=True,
        logits_to_keep=1,
        **cache_arg(model, cache),
    )
    kept = [(layer.keys, layer.values) for layer in cache.layers]
    if dtype is not None:  # kept between turns: in the compute dtype, not autocast's float32
        kept = [(k.to(dtype), v.to(dtype)) for k, v in kept]
    return out.logits[:, -1].to(dtype=torch.float32), kept


def _slice(layers: Layers, row: int, begin: int, end: int) -> Layers:
    return [(k[row : row + 1, :, begin:end], v[row : row + 1, :, begin:end]) for k, v in layers]


def _starts(
    lm: Any, prompts: list[list[int]], caches: list[KVCache | None] | None
) -> tuple[list[int], list[Layers | None]]:
    """Where each prompt's own prefill starts, and the keys and values before that: its
    carried cache's; else a prefix it shares with other such prompts, run here once."""
    rows, owner = len(prompts), id(lm)
    caches = caches or [None] * rows
    starts = [
        c.reusable(owner, p) if c is not None else 0 for c, p in zip(caches, prompts, strict=True)
    ]
    # a cache holding more than the common prefix (the prompt left its ids) is cut to it
    past: list[Layers | None] = [
        _slice(c.layers, 0, 0, n) if n else None for c, n in zip(caches, starts, strict=True)
    ]
    fresh = [i for i in range(rows) if starts[i] == 0]
    while fresh:
        first = fresh[0]
        shared = [first] + [
            i
            for i in fresh[1:]
            if common_prefix(prompts[first], prompts[i], SHARED_MIN) == SHARED_MIN
        ]
        fresh = [i for i in fresh if i not in shared]
        if len(shared) < 2:
            continue
        length = min(common_prefix(prompts[first], prompts[i], len(prompts[i]) - 1) for i in shared)
        if length < SHARED_MIN:
            continue
        _, layers = _prefill(lm.model, prompts[first][:length], 0, None, lm.device, kv_dtype(lm))
        lm.counts["prefilled"] += length
        for i in shared:
            starts[i], past[i] = length, layers
    return starts, past


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
    model, device, owner, dtype = lm.model, lm.device, id(lm), kv_dtype(lm)
    rows = len(prompts)
    caches = caches or [None] * rows
    starts, past = _starts(lm, prompts, caches)
    # each row's own new ids, on top of what it starts from (identical rows: once)
    logits, full, done = [], [], {}
    for i, prompt in enumerate(prompts):
        key = (tuple(prompt), starts[i], id(past[i]))
        if key not in done:
            done[key] = _prefill(model, prompt[starts[i] :], starts[i], past[i], device, dtype)
            lm.counts["prefilled"] += len(prompt) - starts[i]
        logits.append(done[key][0])
        full.append(done[key][1])
    del done
    # one left-padded batch, as generate holds it (row i's keys end at column `width`), in
    # buffers with room for the decoding, which writes each step's keys in place
    lengths = [len(p) for p in prompts]
    width = max(lengths)
    cache = DynamicCache()
    cache.layers = [
        _Room(
            [(layers[n], lengths[i]) for i, layers in enumerate(full)], width, max_new_tokens, dtype
        )
        for n in range(len(full[0]))
    ]
    del full
    mask = torch.zeros((rows, width), dtype=torch.long, device=device)
    ids = torch.full((rows, width), lm.pad_id, dtype=torch.long, device=device)
    for i, prompt in enumerate(prompts):
        mask[i, width - lengths[i] :] = 1
        ids[i, width - lengths[i] :] = torch.tensor(prompt, device=device)
    stops = torch.tensor(lm.stop_ids, device=device)
    unfinished = torch.ones(rows, dtype=torch.long, device=device)
    positions = torch.tensor(lengths, device=device)
    alive = list(range(rows))  # the rows in the cache's batch, in its order
    scores = torch.cat(logits)
    for step in range(max_new_tokens):
        if logits_processor is not None:
            scores = logits_processor(ids, scores)
        if temperature != 1.0:  # generate's TemperatureLogitsWarper, after the processors
            scores = scores / temperature
        # one draw over every row, finished ones included, as generate draws: torch's
        # multinomial takes the same numbers from the generator whatever a row's values
        tokens = torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)
        tokens = tokens * unfinished + lm.pad_id * (1 - unfinished)
        ids = torch.cat([ids, tokens[:, None]], dim=-1)
        unfinished = unfinished & ~torch.isin(tokens, stops)
        if unfinished.max() == 0 or step == max_new_tokens - 1:
            break
        ended = [n for n, i in enumerate(alive) if not unfinished[i]]
        if ended:  # finished rows leave the batch (their draws no longer matter)
            layers = [(layer.keys, layer.values) for layer in cache.layers]
            for n in ended:
                _keep(
                    caches[alive[n]],
                    owner,
                    prompts[alive[n]],
                    ids[alive[n], width:],
                    step,
                    layers,
                    n,
                )
            staying = [n for n, i in enumerate(alive) if unfinished[i]]
            cache.batch_select_indices(torch.tensor(staying, device=device))
            mask, positions = mask[staying], positions[staying]
            alive = [alive[n] for n in staying]
        mask = torch.cat([mask, mask.new_ones((len(alive), 1))], dim=-1)
        out = model(
            input_ids=tokens[alive][:, None],
            attention_mask=mask,
            position_ids=(positions + step)[:, None],
            use_cache=True,
            **cache_arg(model, cache),
        )
        # finished rows draw from a stand-in (uniform) distribution: only their count matters
        scores = torch.zeros((rows, out.logits.shape[-1]), dtype=torch.float32, device=device)
        scores[alive] = out.logits[:, -1].to(dtype=torch.float32)
    else:
        step = max_new_tokens
    layers = [(layer.keys, layer.values) for layer in cache.layers]
    for n, i in enumerate(alive):
        _keep(caches[i], owner, prompts[i], ids[i, width:], step, layers, n)
    samples = []
    for row in ids[:, width:].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in lm.stop_ids), len(row))
        samples.append(row[:cut])
    return samples


class _Room(DynamicLayer):
    """A cache layer whose keys and values sit in buffers with room for a turn's decoding: a
    step writes its position in place, where DynamicLayer copies the whole cache (torch.cat)."""

    def __init__(
        self, rows: list[tuple[tuple[torch.Tensor, torch.Tensor], int]], width, room, dtype=None
    ):
        super().__init__()
        (k, _), _ = rows[0]
        shape = (len(rows), k.shape[1], width + room, k.shape[3])
        # in `dtype` (kv_dtype): each step's keys are written into it, cast
        self._k, self._v = k.new_zeros(shape, dtype=dtype), k.new_zeros(shape, dtype=dtype)
        for i, ((keys, values), length) in enumerate(rows):
            self._k[i, :, width - length : width] = keys[0]
            self._v[i, :, width - length : width] = values[0]
        self.device, self.is_initialized, self._n = k.device, True, width
        self._view()

    def _view(self) -> None:
        self.keys, self.values = self._k[:, :, : self._n], self._v[:, :, : self._n]

    def update(self, key_states, value_states, *args, **kwargs):
        end = self._n + key_states.shape[-2]
        self._k[:, :, self._n : end] = key_states
        self._v[:, :, self._n : end] = value_states
        self._n = end
        self._view()
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._k, self._v = self._k[indices], self._v[indices]
        self._view()


def _keep(cache, owner, prompt, drawn, fed, layers, row) -> None:
    """Row `row` of the batch's `layers` into `cache`: its prompt (left-padded to the batch's
    width) and the first `fed` ids it drew, which were run after it."""
    if cache is None:
        return
    width = layers[0][0].shape[-2] - fed
    ran = drawn[:fed].tolist()
    cache.keep(owner, prompt + ran, _slice(layers, row, width - len(prompt), width + fed))


def choice_logprobs_reusing(
    lm: Any,
    prompts: list[list[int]],
    choices: Choices,
    temperature: float,
    caches: list[KVCache | None],
) -> torch.Tensor:
    """training/rl/choices.py's choice_logprobs (the same restricted log-probabilities), with
    each prompt started from its carried cache or a shared prefix; the caches then hold the
    prompts."""
    model, device, owner, dtype = lm.model, lm.device, id(lm), kv_dtype(lm)
    starts, past = _starts(lm, prompts, caches)
    n_texts = len(choices.ids)
    length = max(len(t) for t in choices.ids)
    text_ids = torch.full((n_texts, length), lm.pad_id, dtype=torch.long, device=device)
    text_attention = torch.zeros((n_texts, length), dtype=torch.long, device=device)
    for n, seq in enumerate(choices.ids):
        text_ids[n, : len(seq)] = torch.tensor(seq, device=device)
        text_attention[n, : len(seq)] = 1
    result = torch.zeros((len(prompts), n_texts))
    for i, prompt in enumerate(prompts):
        first, layers = _prefill(model, prompt[starts[i] :], starts[i], past[i], device, dtype)
        lm.counts["prefilled"] += len(prompt) - starts[i]
        first = first[0] / temperature  # predicts each text's token 0
        if caches[i] is not None:
            caches[i].keep(owner, list(prompt), layers)
        every = DynamicCache(
            ddp_cache_data=[
                (k.expand(n_texts, -1, -1, -1), v.expand(n_texts, -1, -1, -1)) for k, v in layers
            ]
        )
        attention = torch.cat([text_attention.new_ones((n_texts, len(prompt))), text_attention], 1)
        out = model(
            input_ids=text_ids,
            attention_mask=attention,
            position_ids=(len(prompt) + torch.arange(length, device=device)).expand(
                n_texts, length
            ),
            **cache_arg(model, every),
        )
        logits = out.logits.float() / temperature  # [texts, length, V]
        for n, seq in enumerate(choices.ids):
            total = 0.0
            for j, (token, allowed) in enumerate(zip(seq, choices.allowed(n), strict=True)):
                if len(allowed) < 2:
                    continue  # forced
                row = first if j == 0 else logits[n, j - 1]
                total += float(row[token] - torch.logsumexp(row[allowed], 0))
            result[i, n] = total
    return result
