"""Per-sequence loss weights ([curation], training/measures/curation.py): each sequence's loss
term times its weight, the advantages untouched; weights of 1 are today's update bit for bit."""

import math

import pytest
import torch

from training.rl.grpo import grpo_loss, update
from training.rl.logprobs import TokenBatch, token_logprobs

LN = math.log


def unequal_batch():
    """Sequence 0 (A=+1) has three policy tokens, sequence 1 (A=-2) one; ratios 1.5, 0.5,
    1.5 and 1.5, so with clip [0.8, 1.2] the per-token losses are -1.2, -0.5, -1.2 and 3.0."""
    old = torch.zeros(2, 3)
    logp = torch.tensor([[LN(1.5), LN(0.5), LN(1.5)], [LN(1.5), 50.0, -50.0]])
    adv = torch.tensor([1.0, -2.0])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    return logp, old, adv, mask


def test_the_weighted_loss_equals_the_hand_computed_one():
    logp, old, adv, mask = unequal_batch()
    w = torch.tensor([0.5, 2.0])
    token, _ = grpo_loss(logp, old, None, adv, mask, eps=0.2, weights=w)
    sample, _ = grpo_loss(logp, old, None, adv, mask, eps=0.2, reduction="sample", weights=w)
    # token: (0.5 x (-1.2 - 0.5 - 1.2) + 2 x 3.0) / 4 tokens (the count is not weighted)
    assert math.isclose(float(token), (0.5 * -2.9 + 2 * 3.0) / 4, rel_tol=1e-6)
    # sample: (0.5 x the mean -2.9/3 + 2 x 3.0) / 2 sequences
    assert math.isclose(float(sample), (0.5 * -2.9 / 3 + 2 * 3.0) / 2, rel_tol=1e-6)
    # the KL term is weighted with its sequence: ref - logp = ln 2, k3 = 1 - ln 2 per token
    ref = logp + LN(2.0)
    k3 = 1.0 - LN(2.0)
    kl, stats = grpo_loss(logp, old, ref, adv, mask, eps=0.2, beta=0.1, weights=w)
    expected = (0.5 * (-2.9 + 3 * 0.1 * k3) + 2 * (3.0 + 0.1 * k3)) / 4
    assert math.isclose(float(kl), expected, rel_tol=1e-6)
    assert math.isclose(stats["kl"], k3, rel_tol=1e-6)  # the diagnostic stays unweighted


def test_weights_of_one_give_exactly_the_unweighted_loss_and_gradient():
    logp, old, adv, mask = unequal_batch()
    ref = logp.detach() + 0.3
    for reduction in ("token", "sample"):
        grads = []
        for weights in (None, torch.ones(2)):
            x = logp.clone().requires_grad_(True)
            loss, stats = grpo_loss(
                x, old, ref, adv, mask, eps=0.2, beta=0.1, reduction=reduction, weights=weights
            )
            loss.backward()
            grads.append((loss.detach(), x.grad, stats))
        (a, ga, sa), (b, gb, sb) = grads
        assert torch.equal(a, b) and torch.equal(ga, gb) and sa == sb


IDS = [[5, 17, 300, 42, 9, 2], [7, 8, 1000, 11, 12, 2], [6, 9, 40, 2, 2, 2]]
MASKS = [[0, 0, 1, 1, 1, 1], [0, 0, 1, 0, 0, 0], [0, 1, 1, 0, 0, 0]]
ADV = [1.0, -0.5, 2.0]


def step(tiny_model, weights, reduction="token", micro_batch=1, epochs=1, grad_clip=1.0):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    sgd = torch.optim.SGD(model.parameters(), lr=0.5)
    batch = TokenBatch.from_lists(IDS, MASKS, pad_id=2)
    stats = update(
        model,
        sgd,
        batch,
        torch.tensor(ADV),
        eps=0.2,
        eps_high=0.2,
        beta=0.0,
        micro_batch=micro_batch,
        epochs=epochs,
        grad_clip=grad_clip,
        loss_reduction=reduction,
        weights=weights,
    )
    return stats, {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize(
    "reduction, micro_batch, epochs", [("token", 1, 1), ("sample", 2, 1), ("token", 3, 2)]
)
def test_weights_of_one_give_exactly_todays_update(tiny_model, reduction, micro_batch, epochs):
    today, a = step(tiny_model, None, reduction, micro_batch, epochs)
    ones, b = step(tiny_model, torch.ones(3), reduction, micro_batch, epochs)
    assert today == ones
    assert all(torch.equal(a[n], b[n]) for n in a)


def test_the_weighted_update_equals_the_hand_computed_one(tiny_model):
    """One epoch, no clip on the gradient: every ratio is 1, so the gradient of the weighted
    token mean is -1/N sum_b w_b A_b sum_t mask_bt grad log p_bt, N the batch's 7 policy
    tokens (the gated first sequence's 4 among them); SGD moves each weight by -lr x that.
    The gated row comes first, so the weights must follow update's reordering of the rows."""
    from transformers import AutoModelForCausalLM

    w = [0.0, 2.0, 1.0]  # the first sequence gated
    stats, trained = step(tiny_model, torch.tensor(w), grad_clip=0.0)
    assert stats["trained_sequences"] == 2

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    batch = TokenBatch.from_lists(IDS, MASKS, pad_id=2)
    logp, _ = token_logprobs(model, batch)
    n = sum(map(sum, MASKS))
    by_hand = -sum(w[b] * ADV[b] * (logp[b] * batch.mask[b]).sum() for b in range(3)) / n
    by_hand.backward()
    for name, p in model.named_parameters():
        expected = p.detach() - 0.5 * (p.grad if p.grad is not None else 0)
        # float32 sums in another order: ~1e-5 of weights near 2; a wrong weight moves far more
        assert torch.allclose(trained[name], expected, atol=2e-5), name
    # the loss itself, at ratio 1: -(0 + 2 x -0.5 x 1 token + 1 x 2 x 2 tokens) / 7
    assert stats["loss"] == pytest.approx(-(-1.0 + 4.0) / 7, abs=1e-6)
    # and it is not the unweighted step
    _, plain = step(tiny_model, None, grad_clip=0.0)
    assert not all(torch.allclose(trained[k], plain[k], atol=1e-6) for k in plain)


def test_every_sequence_gated_takes_no_step(tiny_model):
    from transformers import AutoModelForCausalLM

    stats, after = step(tiny_model, torch.zeros(3))
    fresh = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert stats["trained_sequences"] == 0
    assert all(torch.equal(p, after[n]) for n, p in fresh.named_parameters())


def test_weights_must_be_one_per_sequence(tiny_model):
    with pytest.raises(ValueError, match=r"weights \(2,\) must be one per sequence"):
        step(tiny_model, torch.ones(2))
