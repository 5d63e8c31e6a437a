"""token_logprobs' fast path (the LM head applied only at the policy tokens, in chunks, with its
own backward) against the straightforward computation: the model's full logits, log_softmax,
gather. The GRPO loss, the entropy and every gradient must agree."""

import pytest
import torch

from training.rl import logprobs
from training.rl.grpo import grpo_loss
from training.rl.logprobs import SHARED_PREFIX_MIN, TokenBatch, token_logprobs

TEMPERATURE = 0.7


def batches() -> dict[str, TokenBatch]:
    """Rows of different lengths with policy tokens in several turns and a restricted choice
    turn: each with a prompt of its own, all after one shared prompt (the KV-cache path), and
    in two interleaved groups that share a prompt each plus a row alone."""
    ids = [[5, 17, 300, 42, 9, 2, 60, 61, 62], [7, 8, 1000, 11, 2], [30, 31, 32, 33, 34, 35, 2]]
    masks = [[0, 0, 1, 1, 1, 0, 0, 1, 1], [0, 0, 1, 1, 1], [0, 0, 0, 1, 0, 1, 1]]
    allowed = [{3: [42, 43, 44]}, {}, {5: [35, 36]}]

    def after(prompts, rows):
        return TokenBatch.from_lists(
            [p + ids[r] for p, r in zip(prompts, rows, strict=True)],
            [[0] * len(p) + masks[r] for p, r in zip(prompts, rows, strict=True)],
            pad_id=2,
            allowed=[
                {len(p) + k: v for k, v in allowed[r].items()}
                for p, r in zip(prompts, rows, strict=True)
            ],
        )

    one = list(range(100, 100 + SHARED_PREFIX_MIN + 3))
    other = list(range(200, 200 + SHARED_PREFIX_MIN + 7))
    return {
        "distinct": after([[]] * 3, [0, 1, 2]),
        "shared": after([one] * 3, [0, 1, 2]),
        "groups": after([one, other, one, other, [400, 401]], [0, 1, 2, 0, 1]),
    }


def straightforward(model, batch: TokenBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """log p and entropy from the model's logits at every position, [B, T] (0 where mask is 0)."""
    logits = model(input_ids=batch.ids, attention_mask=batch.attention).logits.float()
    logits = logits[:, :-1] / TEMPERATURE
    for row, restricted in enumerate(batch.allowed or []):
        for index, ids in restricted.items():
            cut = torch.full_like(logits[row, index - 1], float("-inf"))
            cut[ids] = 0.0
            logits[row, index - 1] = logits[row, index - 1] + cut
    log_probs = torch.log_softmax(logits, -1)
    picked = log_probs.gather(-1, batch.ids[:, 1:, None]).squeeze(-1)
    probs = log_probs.exp()
    entropy = -torch.where(probs > 0, probs * log_probs, torch.zeros_like(probs)).sum(-1)
    zero = torch.zeros(batch.ids.shape[0], 1)
    policy = batch.mask > 0
    return torch.cat([zero, picked], 1) * policy, torch.cat([zero, entropy.detach()], 1) * policy


def loss_and_grads(model, batch, logprobs):
    model.zero_grad(set_to_none=True)
    logp, entropy = logprobs(model, batch)
    adv = torch.linspace(-1.0, 2.0, len(batch))
    # an old policy a little off the current one, so the ratio and the clip both matter
    old = (logp.detach() + 0.3 * torch.sin(torch.arange(logp.numel()).view_as(logp))) * batch.mask
    loss, _ = grpo_loss(logp, old, None, adv, batch.mask, eps=0.2)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), logp.detach(), entropy, grads


def fast(model, batch):
    return token_logprobs(model, batch, with_entropy=True, temperature=TEMPERATURE)


@pytest.mark.parametrize("prompt", ["distinct", "shared", "groups"])
@pytest.mark.parametrize("head", ["kept", "recomputed", "lora"])
def test_fast_head_matches_full_logits(smooth_tiny_model, monkeypatch, prompt, head):
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(logprobs, "HEAD_CHUNK", 4)  # several chunks, the last one partial
    if head == "recomputed":  # the softmax is not kept: the backward recomputes it
        monkeypatch.setattr(logprobs, "HEAD_KEEP_BYTES", 0)
    model = AutoModelForCausalLM.from_pretrained(smooth_tiny_model)
    if head == "lora":  # a frozen head: the gradient w.r.t. the hidden states comes from forward
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
        for name, p in model.named_parameters():
            if "lora_B" in name:  # peft starts B at 0: give the adapter something to differ by
                torch.nn.init.normal_(p, std=0.02)
    assert logprobs._plain_head(model) is not None  # the fast path is the one under test
    batch = batches()[prompt]

    loss, logp, entropy, grads = loss_and_grads(model, batch, fast)
    want_loss, want_logp, want_entropy, want_grads = loss_and_grads(model, batch, straightforward)

    assert float(loss) == pytest.approx(float(want_loss), abs=1e-6)
    assert torch.allclose(logp, want_logp, atol=1e-5)
    assert torch.allclose(entropy, want_entropy, atol=1e-4)
    assert grads.keys() == want_grads.keys() and grads
    for name, grad in grads.items():
        scale = float(want_grads[name].abs().max())
        assert float((grad - want_grads[name]).abs().max()) <= 1e-6 + 1e-5 * scale, name

    with torch.no_grad():  # the passes without a gradient (old, reference, idle rows' entropy)
        logp, entropy = fast(model, batch)
    assert torch.allclose(logp, want_logp, atol=1e-5)
    assert torch.allclose(entropy, want_entropy, atol=1e-4)


@pytest.mark.parametrize("prompt", ["shared", "groups"])
def test_shared_prompts_under_gradient_checkpointing(smooth_tiny_model, prompt):
    """A checkpointed layer drops the KV cache in a training pass (transformers), so the prompt
    cannot be shared there: the rows run whole and the result is still the full-logits one."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(smooth_tiny_model)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    batch = batches()[prompt]
    loss, logp, _, grads = loss_and_grads(model, batch, fast)
    want_loss, want_logp, _, want_grads = loss_and_grads(model, batch, straightforward)
    assert float(loss) == pytest.approx(float(want_loss), abs=1e-6)
    assert torch.allclose(logp, want_logp, atol=1e-5)
    for name, grad in grads.items():
        scale = float(want_grads[name].abs().max())
        assert float((grad - want_grads[name]).abs().max()) <= 1e-6 + 1e-5 * scale, name
