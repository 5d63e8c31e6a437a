import math
import types

import pytest
import torch

from training.rl.grpo import group_advantages, grpo_loss
from training.rl.logprobs import TokenBatch, token_logprobs

LN = math.log


def fixed_batch():
    """Two sequences, three tokens each; the last token of each is not the policy's (mask 0)
    and carries absurd values that must not leak into the loss."""
    old = torch.zeros(2, 3)
    logp = torch.tensor([[LN(1.5), LN(0.5), 50.0], [LN(1.5), LN(0.5), -50.0]])
    adv = torch.tensor([1.0, -2.0])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    return logp, old, adv, mask


def test_loss_equals_hand_computed_value():
    logp, old, adv, mask = fixed_batch()
    # ratios 1.5 and 0.5, clip range [0.8, 1.2]:
    #   A=+1: -min(1.5, 1.2) = -1.2     -min(0.5, 0.8) = -0.5
    #   A=-2: -min(-3.0, -2.4) = 3.0    -min(-1.0, -1.6) = 1.6
    # mean over the 4 policy tokens: (-1.2 - 0.5 + 3.0 + 1.6) / 4 = 0.725
    loss, stats = grpo_loss(logp, old, None, adv, mask, eps=0.2)
    assert math.isclose(float(loss), 0.725, rel_tol=1e-6)
    # the clip removed the gradient of tokens 1 (A>0, ratio>1.2) and 4 (A<0, ratio<0.8)
    assert stats["clip_frac"] == 0.5
    assert stats["tokens"] == 4
    assert stats["kl"] == 0.0


def test_kl_term_is_k3_times_beta():
    logp, old, adv, mask = fixed_batch()
    ref = logp + LN(2.0)  # ref - logp = ln 2 everywhere: k3 = 2 - ln 2 - 1
    k3 = 1.0 - LN(2.0)
    loss, stats = grpo_loss(logp, old, ref, adv, mask, eps=0.2, beta=0.1)
    assert math.isclose(float(loss), 0.725 + 0.1 * k3, rel_tol=1e-6)
    assert math.isclose(stats["kl"], k3, rel_tol=1e-6)


def test_asymmetric_clip_uses_eps_high():
    logp, old, adv, mask = fixed_batch()
    # eps_high = 0.6: the A=+1, ratio 1.5 token is no longer clipped: -1.5 instead of -1.2
    loss, _ = grpo_loss(logp, old, None, adv, mask, eps=0.2, eps_high=0.6)
    assert math.isclose(float(loss), (-1.5 - 0.5 + 3.0 + 1.6) / 4, rel_tol=1e-6)


def test_masked_tokens_get_no_gradient():
    logp, old, adv, mask = fixed_batch()
    logp.requires_grad_(True)
    loss, _ = grpo_loss(logp, old, logp.detach() + 1.0, adv, mask, eps=0.2, beta=0.5)
    loss.backward()
    assert torch.all(logp.grad[:, 2] == 0)  # not the policy's tokens
    assert torch.all(logp.grad[mask > 0] != 0)


def test_group_advantages():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5]])
    std = math.sqrt(1 / 3)  # unbiased std of (1, 0, 0, 1)
    adv = group_advantages(rewards)
    expected = 0.5 / (std + 1e-4)
    assert torch.allclose(adv[0], torch.tensor([expected, -expected, -expected, expected]))
    assert torch.all(adv[1] == 0)  # no spread, no signal
    assert torch.equal(
        group_advantages(rewards, scale_std=False)[0], torch.tensor([0.5, -0.5, -0.5, 0.5])
    )


def test_raw_reward_advantages_as_slime_without_rewards_normalization():
    """center=False: the advantage is the reward itself (no group mean, no std), as Slime gives
    with --disable-rewards-normalization, so an all-success group still pushes its tokens up."""
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5]])
    assert torch.equal(group_advantages(rewards, scale_std=False, center=False), rewards)
    with pytest.raises(ValueError, match="scale_std needs center"):
        group_advantages(rewards, scale_std=True, center=False)


def test_token_logprobs_match_full_softmax(tiny_model):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    ids = [[5, 17, 300, 42, 9, 2], [7, 8, 1000, 2]]
    masks = [[0, 0, 1, 1, 0, 1], [0, 1, 1, 0]]
    batch = TokenBatch.from_lists(ids, masks, pad_id=2)
    with torch.no_grad():
        logp, entropy = token_logprobs(model, batch, with_entropy=True)
        full = torch.log_softmax(model(batch.ids, attention_mask=batch.attention).logits, -1)
    for b, (seq, m) in enumerate(zip(ids, masks, strict=True)):
        for t in range(1, len(seq)):
            if m[t]:
                expected = full[b, t - 1, seq[t]]
                assert torch.isclose(logp[b, t], expected, atol=1e-5)
                h = -(full[b, t - 1].exp() * full[b, t - 1]).sum()
                assert torch.isclose(entropy[b, t], h, atol=1e-4)
            else:
                assert logp[b, t] == 0


def test_zero_advantage_rows_are_skipped_exactly(tiny_model):
    from transformers import AutoModelForCausalLM

    from training.rl.grpo import update

    ids = [[5, 17, 300, 42, 9, 2], [7, 8, 1000, 11, 12, 2]]
    masks = [[0, 0, 1, 1, 1, 1], [0, 1, 1, 1, 0, 0]]
    batch = TokenBatch.from_lists(ids, masks, pad_id=2)

    def step(adv):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(tiny_model)
        sgd = torch.optim.SGD(model.parameters(), lr=1.0)
        stats = update(
            model, sgd, batch, torch.tensor(adv), eps=0.2, eps_high=0.2, beta=0.0, micro_batch=1
        )
        return stats, dict(model.named_parameters())

    skipped, a = step([1.0, 0.0])
    computed, b = step([1.0, 1e-30])  # a non-zero advantage is back-propagated
    assert skipped["trained_sequences"] == 1 and computed["trained_sequences"] == 2
    assert all(torch.allclose(a[n], b[n], atol=1e-6) for n in a)
    # the skipped row's entropy is measured without a graph, the other's with one: float32 sums
    # in another order (and over however many threads the machine gives each call) differ by
    # about 2e-5 of it; a row left out or counted twice moves it by far more
    assert skipped["entropy"] == pytest.approx(computed["entropy"], rel=1e-4)

    idle, c = step([0.0, 0.0])  # no signal at all: no optimizer step
    fresh = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert idle["trained_sequences"] == 0 and idle["entropy"] > 0
    assert all(torch.equal(p, c[n]) for n, p in fresh.named_parameters())


def test_rows_without_policy_tokens_take_no_step(tiny_model):
    """A conversation the policy never spoke in (its partner's decision ended it) has an
    advantage but nothing to train: no step, no error."""
    from transformers import AutoModelForCausalLM

    from training.rl.grpo import update

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    batch = TokenBatch.from_lists([[5, 17, 300], [7, 8, 1000]], [[0, 0, 0], [0, 0, 0]], pad_id=2)
    sgd = torch.optim.SGD(model.parameters(), lr=1.0)
    stats = update(
        model, sgd, batch, torch.tensor([1.0, -1.0]), eps=0.2, eps_high=0.2, beta=0.0, micro_batch=2
    )
    assert stats["trained_sequences"] == 0 and stats["grad_norm"] == 0


class CacheOnly(torch.nn.Module):
    """A model with the forward of transformers >= 5.40: the KV cache goes in and comes out as
    `cache`; `past_key_values` is no longer a keyword or an output."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids,
        attention_mask=None,
        position_ids=None,
        cache=None,
        use_cache=None,
        logits_to_keep=0,
    ):
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=use_cache,
            logits_to_keep=logits_to_keep,
        )
        return types.SimpleNamespace(logits=out.logits, cache=out.cache)


def test_shared_prefix_passes_the_kv_cache_as_cache(tiny_model):
    """The rows' common prompt runs once and reaches the rest through the `cache` keyword, so
    log-probs match a full pass per row with a transformers that has dropped `past_key_values`."""
    from transformers import AutoModelForCausalLM

    from training.rl.choices import Choices, choice_logprobs
    from training.rl.logprobs import SHARED_PREFIX_MIN

    lm = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    model = CacheOnly(lm)
    prompt = list(range(10, 10 + SHARED_PREFIX_MIN + 4))
    ids = [prompt + [5, 17, 300, 2], prompt + [7, 8, 1000, 2]]
    masks = [[0] * len(prompt) + [1, 1, 0, 1], [0] * len(prompt) + [1, 0, 1, 1]]
    batch = TokenBatch.from_lists(ids, masks, pad_id=2)
    with torch.no_grad():
        logp, _ = token_logprobs(model, batch)
        full = torch.log_softmax(lm(batch.ids, attention_mask=batch.attention).logits, -1)
    for b, (seq, m) in enumerate(zip(ids, masks, strict=True)):
        for t in range(1, len(seq)):
            expected = full[b, t - 1, seq[t]] if m[t] else torch.tensor(0.0)
            assert torch.isclose(logp[b, t], expected, atol=1e-4)

    # choice turns share the prompts' prefix the same way
    choices = Choices.build(["yes", "no"], {"yes": [40, 41], "no": [40, 42]}.get, stop_id=2)
    prompts = [prompt + [50], prompt + [51, 52]]
    got = choice_logprobs(model, prompts, choices, temperature=1.0, pad_id=2)
    with torch.no_grad():
        for i, p in enumerate(prompts):
            logits = lm(input_ids=torch.tensor([p + [40, 41, 2]])).logits[0]
            # "yes" and "no" share token 40 (forced); they differ at the second token only
            row = logits[len(p)]
            expected = float(row[41] - torch.logsumexp(row[[41, 42]], 0))
            assert got[i, 0] == pytest.approx(expected, abs=1e-4)


def unequal_batch():
    """Sequence 0 has three policy tokens, sequence 1 one: ratios 1.5, 0.5, 1.5 and 1.5."""
    old = torch.zeros(2, 3)
    logp = torch.tensor([[LN(1.5), LN(0.5), LN(1.5)], [LN(1.5), 50.0, -50.0]])
    adv = torch.tensor([1.0, -2.0])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    return logp, old, adv, mask


def test_the_two_loss_reductions_differ_on_unequal_lengths_and_agree_on_equal_ones():
    # per token (clip [0.8, 1.2]): sequence 0 (A=+1) -1.2, -0.5, -1.2; sequence 1 (A=-2) 3.0
    logp, old, adv, mask = unequal_batch()
    token, _ = grpo_loss(logp, old, None, adv, mask, eps=0.2, reduction="token")
    sample, stats = grpo_loss(logp, old, None, adv, mask, eps=0.2, reduction="sample")
    assert math.isclose(float(token), (-1.2 - 0.5 - 1.2 + 3.0) / 4, rel_tol=1e-6)  # 0.025
    assert math.isclose(float(sample), ((-1.2 - 0.5 - 1.2) / 3 + 3.0) / 2, rel_tol=1e-6)  # 1.017
    assert stats["samples"] == 2 and stats["tokens"] == 4
    # the same number of tokens in every sequence: the two means are one
    logp, old, adv, mask = fixed_batch()
    token, _ = grpo_loss(logp, old, None, adv, mask, eps=0.2, reduction="token")
    sample, _ = grpo_loss(logp, old, None, adv, mask, eps=0.2, reduction="sample")
    assert math.isclose(float(token), 0.725, rel_tol=1e-6)
    assert math.isclose(float(sample), 0.725, rel_tol=1e-6)
    with pytest.raises(ValueError, match="reduction must be one of token, sample"):
        grpo_loss(logp, old, None, adv, mask, reduction="sum")


def test_the_sample_mean_is_over_the_whole_batch_whatever_the_micro_batches(tiny_model):
    """update() splits the batch into micro-batches and rows without signal: under "sample"
    each sequence still weighs 1 / (the batch's sequences), idle ones included, so the step
    is the same at any micro_batch, and not the token mean's step."""
    from transformers import AutoModelForCausalLM

    from training.rl.grpo import update

    ids = [[5, 17, 300, 42, 9, 2], [7, 8, 1000, 11, 12, 2], [6, 9, 40, 2, 2, 2]]
    masks = [[0, 0, 1, 1, 1, 1], [0, 0, 1, 0, 0, 0], [0, 1, 1, 0, 0, 0]]
    batch = TokenBatch.from_lists(ids, masks, pad_id=2)

    def step(reduction, micro_batch):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(tiny_model)
        sgd = torch.optim.SGD(model.parameters(), lr=1.0)
        stats = update(
            model,
            sgd,
            batch,
            torch.tensor([1.0, -0.5, 0.0]),
            eps=0.2,
            eps_high=0.2,
            beta=0.0,
            micro_batch=micro_batch,
            loss_reduction=reduction,
        )
        return stats, dict(model.named_parameters())

    # one epoch: every ratio is 1, so a token's loss is -A. Sequence means -1, 0.5 and 0 (the
    # third has no signal and is not back-propagated, but it is one of the batch's three)
    one, a = step("sample", 1)
    whole, b = step("sample", 3)
    assert one["loss"] == pytest.approx((-1 + 0.5 + 0) / 3, abs=1e-6)
    assert whole["loss"] == pytest.approx(one["loss"], abs=1e-6)
    assert all(torch.allclose(a[n], b[n], atol=1e-6) for n in a)
    token, c = step("token", 3)  # 4, 1 and 2 tokens
    assert token["loss"] == pytest.approx((4 * -1 + 0.5) / 7, abs=1e-6)
    assert not all(torch.allclose(a[n], c[n], atol=1e-6) for n in a)
