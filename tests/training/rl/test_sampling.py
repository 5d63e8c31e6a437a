"""LocalModel.sample through training/rl/sampling.py (reuse_kv): the tokens generate samples for
the same seed, with less prefilled: a carried cache's ids are not run again, a prefix the rows
share is run once.

The two paths' logits differ by float rounding (~1e-6), so equal tokens hold where no draw sits
that close to a boundary: these cases are float32 ones where they do."""

import random

import pytest
import torch

from agents.domains import get_domain
from agents.simulators.spec import SimulatorSpec
from training.rl.policy import LocalModel, Policy
from training.rl.sampling import KVCache
from training.rollouts.agent import LocalAgent
from training.rollouts.rollout import play
from training.rollouts.simulator import LocalUser


@pytest.fixture(scope="module")
def lm(tiny_model):
    return LocalModel.load(tiny_model)


def sampled(lm, reuse, prompts, seed=0, **kw):
    """lm.sample on one path: the samples and the tokens it prefilled."""
    lm.reuse_kv, before = reuse, lm.counts["prefilled"]
    torch.manual_seed(seed)
    try:
        out = lm.sample(prompts, kw.pop("temperature", 1.0), kw.pop("max_new_tokens", 8), **kw)
    finally:
        del lm.reuse_kv  # back to the class's default
    return out, lm.counts["prefilled"] - before


def test_a_carried_cache_is_not_prefilled_again(lm):
    prompt = list(range(100, 140))
    cache = KVCache()
    first, _ = sampled(lm, True, [prompt], caches=[cache])
    assert cache.ids == (prompt + first[0])[: len(cache.ids)] and len(cache.ids) > len(prompt)
    # the next turn extends the transcript: only what the cache lacks is run
    after = prompt + first[0] + [7, 8, 9]
    ran = len(cache.ids)
    new, prefilled = sampled(lm, True, [after], seed=1, caches=[cache])
    assert prefilled == len(after) - ran
    assert new == sampled(lm, False, [after], seed=1)[0]
    # a prompt that leaves the cached ids (an untracked turn re-tokenized) reuses the common part
    other = prompt[:-5] + [11, 12, 13]
    new, prefilled = sampled(lm, True, [other], seed=2, caches=[cache])
    assert prefilled == 3
    assert new == sampled(lm, False, [other], seed=2)[0]


def test_a_shared_prefix_is_prefilled_once(lm):
    shared = list(range(200, 230))
    prompts = [shared + [5, 6], shared + [7], shared + [8, 9, 10], list(range(300, 305))]
    new, prefilled = sampled(lm, True, prompts, caches=[KVCache() for _ in prompts])
    old, padded = sampled(lm, False, prompts)
    assert new == old
    assert prefilled == 30 + 2 + 1 + 3 + 5
    assert padded == 4 * 33  # generate runs every row whole, padding included
    # identical prompts (a group's first turn): one prefill for all of them
    _, prefilled = sampled(lm, True, [shared] * 4)
    assert prefilled == 30


def test_a_logits_processor_sees_what_generate_gives_it(lm):
    seen = {True: [], False: []}

    def odd_only(reuse):
        def process(ids, scores):
            seen[reuse].append(ids.tolist())
            scores = scores.clone()
            scores[:, ::2] = -float("inf")
            return scores

        return process

    prompts = [list(range(10, 25)), list(range(40, 50))]
    new, _ = sampled(lm, True, prompts, logits_processor=odd_only(True))
    old, _ = sampled(lm, False, prompts, logits_processor=odd_only(False))
    assert new == old and all(t % 2 for s in new for t in s)
    assert seen[True] == seen[False]


def test_rows_that_stop_early_draw_as_in_generate(lm):
    """A row that has stopped leaves the decoding batch, but every step still draws for every
    row, as generate does: the rows still going get the same numbers from torch's generator."""
    prompts = [list(range(10, 25)), list(range(40, 50)), list(range(60, 80))]
    width = 20

    def stop_rows(ids, scores):
        scores = scores.clone()
        made = ids.shape[1] - width
        for row, at in ((0, 1), (1, 3)):  # row 0 stops at its 2nd token, row 1 at its 4th
            if made == at:
                scores[row] = -float("inf")
                scores[row, lm.stop_ids[0]] = 0
        return scores

    new, _ = sampled(lm, True, prompts, logits_processor=stop_rows, max_new_tokens=10)
    old, _ = sampled(lm, False, prompts, logits_processor=stop_rows, max_new_tokens=10)
    assert [len(s) for s in new] == [2, 4, 10]
    assert new == old


def play_p4g(agent, user_lm, reuse):
    """Three P4G conversations of 6 messages (the persuadee's last a [DONATE $N] choice)."""
    for m in (agent, user_lm):
        m.reuse_kv, m.counts["prefilled"] = reuse, 0
    domain = get_domain("p4g")
    torch.manual_seed(3)
    user = LocalUser(user_lm, SimulatorSpec(max_new_tokens=10), rng=random.Random(0))
    try:
        rollouts = play(
            domain,
            [domain.scenarios("train")[0]] * 3,
            LocalAgent(agent, 0.7, 10),
            user,
            max_turns=6,
        )
    finally:
        del agent.reuse_kv, user_lm.reuse_kv
    return rollouts, agent.counts["prefilled"] + user_lm.counts["prefilled"]


def test_conversations_are_generates_with_less_prefilled(tiny_model):
    agent = Policy(tiny_model)  # the trained agent: a LoRA model (peft's forward)
    user_lm = LocalModel.load(tiny_model)
    old, old_prefilled = play_p4g(agent, user_lm, False)
    new, new_prefilled = play_p4g(agent, user_lm, True)
    assert [r.conversation for r in new] == [r.conversation for r in old]
    assert [(r.agent.ids, r.agent.mask) for r in new] == [(r.agent.ids, r.agent.mask) for r in old]
    assert [r.user.ids for r in new] == [r.user.ids for r in old]
    decisions = [(d.texts, d.index) for r in new for d in r.decisions]
    assert decisions and decisions == [(d.texts, d.index) for r in old for d in r.decisions]
    for a, b in zip(
        [d.probs for r in new for d in r.decisions],
        [d.probs for r in old for d in r.decisions],
        strict=True,
    ):
        assert a == pytest.approx(b, abs=1e-5)
    assert new_prefilled < old_prefilled / 3
    # a conversation's caches are let go when it ends
    assert all(r.agent.cache.layers is None and r.user.cache.layers is None for r in new)


def test_smollm2_turns_are_generates(base_model):
    """The real model (float32), three turns of four rows, each extending its conversation."""
    lm = LocalModel.load(base_model)
    fmt = lm.fmt
    opening = [
        {"role": "system", "content": "You ask for donations. Be brief."},
        {"role": "user", "content": "Hi, who are you?"},
    ]
    more = fmt.continuation([{"role": "user", "content": "Tell me more."}]) + fmt.generation_prompt
    outs, counts = {}, {}
    for reuse in (False, True):
        prompts = [fmt.encode(fmt.render(opening, True))] * 4
        caches = [KVCache() for _ in prompts]
        outs[reuse], counts[reuse] = [], 0
        for turn in range(3):
            samples, prefilled = sampled(
                lm, reuse, prompts, seed=turn, temperature=0.7, max_new_tokens=12, caches=caches
            )
            outs[reuse].append(samples)
            counts[reuse] += prefilled
            prompts = [
                p + s + fmt.close_turn(s) + more for p, s in zip(prompts, samples, strict=True)
            ]
    assert outs[True] == outs[False]
    assert counts[True] < counts[False] / 3
