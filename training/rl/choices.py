"""Choice turns: a speaker whose next message must be one of a fixed list of texts.

A Domain fixes them where a task is a decision (agents/domains/base.py: agent_choices,
user_choices). Sampling a choice token by token with every other token masked out is the same
distribution as this exact one, computed in one pass:

    p(text_n | prompt) = prod_j softmax(logits_j / T restricted to A_j)[token_j]

where A_j are the tokens that continue some allowed text at position j (the trie of the texts'
token ids, each ending with the stop token). Positions where A_j has one token are forced: the
model chose nothing there, so they are not trained on (mask 0) and carry no log-prob. The same
restriction is applied when the loss recomputes log-probs (training/rl/logprobs.py), so the ratio and
the gradient are those of the distribution that was sampled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from agents.behaviour.measures import shannon
from agents.serving.kvcache import cache_arg, cache_of


@dataclass
class Choices:
    """The allowed texts of one turn as token ids (stop token appended) and their trie."""

    texts: list[str]
    ids: list[list[int]]
    _allowed: list[list[list[int]]] = field(default_factory=list, repr=False)

    @classmethod
    def build(cls, texts: list[str], encode: Any, stop_id: int) -> Choices:
        if not texts:
            raise ValueError("a choice turn needs at least one allowed text")
        if len(set(texts)) != len(texts):
            raise ValueError(f"allowed texts must be distinct: {texts}")
        ids = [list(encode(text)) + [stop_id] for text in texts]
        allowed = [
            [
                sorted({o[j] for o in ids if len(o) > j and o[:j] == seq[:j]})
                for j in range(len(seq))
            ]
            for seq in ids
        ]
        return cls(list(texts), ids, allowed)

    def allowed(self, index: int) -> list[list[int]]:
        """For each token of text `index`: the token ids allowed at that position."""
        return self._allowed[index]

    def index(self, text: str) -> int:
        return self.texts.index(text)


# Shannon entropy (nats) of a discrete distribution, written once with the behaviour measures.
entropy = shannon


@torch.no_grad()
def choice_logprobs(
    model: Any, prompts: list[list[int]], choices: Choices, temperature: float, pad_id: int
) -> torch.Tensor:
    """[len(prompts), len(choices.texts)] exact log-probabilities of each allowed text after each
    prompt under constrained sampling at `temperature`. The prompts' common prefix is run once
    and shared through the KV cache, then each prompt's rest, then every text after each."""
    device = next(model.parameters()).device
    n_prompts, n_texts = len(prompts), len(choices.ids)
    shared = _common_prefix(prompts)
    shared = min(shared, min(len(p) for p in prompts) - 1)  # each prompt keeps one token of its own
    cache = None
    if shared > 0:
        out = model(input_ids=torch.tensor([prompts[0][:shared]], device=device), use_cache=True)
        cache = cache_of(out)
        cache.batch_repeat_interleave(n_prompts)
    rests = [p[shared:] for p in prompts]
    width = max(len(r) for r in rests)
    ids = torch.full((n_prompts, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n_prompts, shared + width), dtype=torch.long)
    attention[:, :shared] = 1
    for i, rest in enumerate(rests):
        ids[i, : len(rest)] = torch.tensor(rest)
        attention[i, shared : shared + len(rest)] = 1
    positions = (shared + torch.arange(width)).expand(n_prompts, width)
    out = model(
        input_ids=ids.to(device),
        attention_mask=attention.to(device),
        position_ids=positions.to(device),
        use_cache=True,
        **cache_arg(model, cache),
    )
    ends = torch.tensor([len(r) - 1 for r in rests])
    first = out.logits[torch.arange(n_prompts), ends].float() / temperature  # predicts token 0
    cache = cache_of(out)
    cache.batch_repeat_interleave(n_texts)  # rows: prompt 0 x every text, prompt 1 x ...
    length = max(len(t) for t in choices.ids)
    text_ids = torch.full((n_texts, length), pad_id, dtype=torch.long)
    text_attention = torch.zeros((n_texts, length), dtype=torch.long)
    for n, seq in enumerate(choices.ids):
        text_ids[n, : len(seq)] = torch.tensor(seq)
        text_attention[n, : len(seq)] = 1
    lengths = torch.tensor([len(p) for p in prompts]).repeat_interleave(n_texts)
    out = model(
        input_ids=text_ids.repeat(n_prompts, 1).to(device),
        attention_mask=torch.cat(
            [attention.repeat_interleave(n_texts, 0), text_attention.repeat(n_prompts, 1)], 1
        ).to(device),
        position_ids=(lengths.unsqueeze(1) + torch.arange(length)).to(device),
        **cache_arg(model, cache),
    )
    logits = out.logits.float() / temperature  # [prompts * texts, length, V]
    result = torch.zeros((n_prompts, n_texts))
    for i in range(n_prompts):
        for n, seq in enumerate(choices.ids):
            total = 0.0
            for j, (token, allowed) in enumerate(zip(seq, choices.allowed(n), strict=True)):
                if len(allowed) < 2:
                    continue  # forced
                row = first[i] if j == 0 else logits[i * n_texts + n, j - 1]
                total += float(row[token] - torch.logsumexp(row[allowed], 0))
            result[i, n] = total
    return result


def _common_prefix(seqs: list[list[int]]) -> int:
    first = seqs[0]
    n = min(len(s) for s in seqs)
    for j in range(n):
        if any(s[j] != first[j] for s in seqs[1:]):
            return j
    return n
