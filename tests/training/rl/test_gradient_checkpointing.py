"""gradient_checkpointing: the update recomputes each layer in the backward pass instead of
keeping its activations, and learns exactly what it learns without (LoRA and full fine-tuning);
the dry run then checks the memory figure with checkpointing on."""

import pytest
import torch

from training.rl.grpo import update
from training.rl.logprobs import TokenBatch
from training.rl.policy import Policy


def one_step(policy):
    ids = [[1, 5, 6, 7, 8, 9, 10, 11], [1, 5, 6, 7, 12, 13, 14, 15]]
    batch = TokenBatch.from_lists(ids, [[0, 0, 0, 0, 1, 1, 1, 1]] * 2, policy.pad_id)
    stats = update(
        policy.model,
        policy.optimizer,
        batch,
        torch.tensor([1.0, -0.5]),
        eps=0.2,
        eps_high=0.2,
        beta=0.05,
        micro_batch=2,
        reference=policy.reference_logprobs,
    )
    trained = {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}
    return stats["loss"], trained


def kept_for_backward(policy) -> int:
    """Elements of the activations (tensors other than weights) one training forward pass
    keeps for its backward pass."""
    kept, weights = [0], {p.data_ptr() for p in policy.model.parameters()}

    def pack(tensor):
        kept[0] += 0 if tensor.data_ptr() in weights else tensor.numel()
        return tensor

    policy.model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        policy.model(torch.tensor([[1, 5, 6, 7, 8, 9, 10, 11] * 8]), logits_to_keep=1)
    return kept[0]


@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_checkpointing_recomputes_layers_and_learns_the_same(smooth_tiny_model, finetune):
    results = {}
    for on in (False, True):
        torch.manual_seed(0)
        policy = Policy(
            smooth_tiny_model, finetune=finetune, lr=1e-3, beta=0.05, gradient_checkpointing=on
        )
        kept = kept_for_backward(policy)
        results[on] = (*one_step(policy), kept)
    (loss_off, weights_off, kept_off), (loss_on, weights_on, kept_on) = results.values()
    assert kept_on < kept_off / 2  # the layers' activations are recomputed, not kept
    assert loss_on == pytest.approx(loss_off, abs=1e-6)
    assert weights_on.keys() == weights_off.keys()
    for name, weight in weights_on.items():
        torch.testing.assert_close(weight, weights_off[name], atol=1e-6, rtol=1e-5)
