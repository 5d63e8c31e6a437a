"""A model in this process takes its turn: free text sampled, or on a choice turn (a Domain
fixes the allowed texts) one text drawn from its exact distribution (training/rl/choices.py) and
recorded on the rollout as a Decision. The agent and a simulator in this process both speak so.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from training.rl.policy import LocalModel
from training.rollouts.rollout import Decision, Rollout, sample_index


def speak(
    lm: LocalModel,
    role: str,
    rollouts: list[Rollout],
    prompts: list[list[int]],
    allowed: list[list[str] | None],
    temperature: float,
    max_new_tokens: int,
    rng: random.Random | None,
    sample: Callable[[list[list[int]]], list[list[int]]] | None = None,
) -> list[tuple[list[int], list[list[int]] | None, str]]:
    """Each rollout's next turn from `lm`: sampled text, or a choice among `allowed[i]` drawn
    from its exact distribution (recorded on the rollout as a Decision). Returns (sampled ids,
    per-position allowed ids for a choice, text). `sample(prompts)` samples the free turns
    elsewhere (a vLLM server holding the same weights); choice turns stay exact, in `lm`."""
    turns: list[Any] = [None] * len(rollouts)
    free = [i for i, texts in enumerate(allowed) if not texts]
    if free:
        prompted = [prompts[i] for i in free]
        if sample:
            samples = sample(prompted)
        else:  # each speaker's transcript carries its cache from turn to turn
            caches = [getattr(rollouts[i], role).cache for i in free]
            samples = lm.sample(prompted, temperature, max_new_tokens, caches=caches)
        for i, ids in zip(free, samples, strict=True):
            turns[i] = (ids, None, lm.decode(ids).strip())
            if ids and ids[-1] not in lm.stop_ids:  # the budget ended it, not the model
                cut = rollouts[i].cut_turns
                cut[role] = cut.get(role, 0) + 1
    groups: dict[tuple[str, ...], list[int]] = {}
    for i, texts in enumerate(allowed):
        if texts:
            groups.setdefault(tuple(texts), []).append(i)
    for texts, members in groups.items():
        caches = [getattr(rollouts[i], role).cache for i in members]
        choices, dists = lm.choice_probs(
            [prompts[i] for i in members], list(texts), temperature, caches
        )
        for i, probs in zip(members, dists, strict=True):
            n = sample_index(probs, rng)
            rollouts[i].decisions.append(Decision(role, list(texts), probs, n))
            turns[i] = (choices.ids[n], choices.allowed(n), texts[n])
    return turns
