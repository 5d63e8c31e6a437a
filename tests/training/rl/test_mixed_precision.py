"""mixed_precision: float32 master weights, gradients and AdamW state for the models that learn,
their passes in `dtype` (here bfloat16, on CPU under autocast), frozen copies in `dtype`; a full
fine-tuning step at the paper's lr 1e-6 then moves the weights, which plain bfloat16 rounds
away; and a checkpoint (float32 weights) resumes exactly."""

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from training.config import parse_config
from training.rl.grpo import update
from training.rl.logprobs import TokenBatch
from training.rl.policy import Policy
from training.trainer import checkpoint
from training.trainer.loop import train


def batch(policy):
    ids = [[1, 5, 6, 7, 8, 9, 10, 11], [1, 5, 6, 7, 12, 13, 14, 15]]
    return TokenBatch.from_lists(ids, [[0, 0, 0, 0, 1, 1, 1, 1]] * 2, policy.pad_id)


def one_update(policy):
    """One GRPO update (KL to the reference copy included) on two rows of different rewards."""
    return update(
        policy.model,
        policy.optimizer,
        batch(policy),
        torch.tensor([1.0, 0.5]),
        eps=0.2,
        eps_high=0.2,
        beta=0.05,
        micro_batch=2,
        reference=policy.reference_logprobs,
        autocast=policy.compute,
    )


def passes_dtypes(policy):
    """The dtypes of a projection's outputs in every forward pass (a forward hook)."""
    seen = []
    layer = policy.model.get_base_model() if policy.finetune == "lora" else policy.model
    layer.model.layers[0].self_attn.q_proj.register_forward_hook(
        lambda module, args, out: seen.append(out.dtype)
    )
    return seen


def test_trained_weights_and_adam_are_float32_while_the_passes_run_in_bfloat16(
    smooth_tiny_model,
):
    policy = Policy(
        smooth_tiny_model,
        finetune="full",
        lr=1e-6,
        beta=0.05,
        dtype="bfloat16",
        mixed_precision=True,
    )
    seen = passes_dtypes(policy)
    assert {p.dtype for p in policy.model.parameters()} == {torch.float32}
    assert {p.dtype for p in policy.reference_model.parameters()} == {torch.bfloat16}  # frozen
    policy.sample([[1, 5, 6, 7]], temperature=1.0, max_new_tokens=3)
    assert seen and set(seen) == {torch.bfloat16}  # sampling
    seen.clear()
    one_update(policy)
    assert seen and set(seen) == {torch.bfloat16}  # the update's passes
    assert {p.grad.dtype for p in policy.model.parameters()} == {torch.float32}
    moments = [t for s in policy.optimizer.state.values() for k, t in s.items() if k != "step"]
    assert moments and {t.dtype for t in moments} == {torch.float32}

    # LoRA: the adapter and its base float32 (one dtype per FSDP unit), passes in bfloat16
    lora = Policy(smooth_tiny_model, lr=1e-6, dtype="bfloat16", mixed_precision=True)
    seen = passes_dtypes(lora)
    assert {p.dtype for p in lora.model.parameters()} == {torch.float32}
    lora.choice_probs([[1, 5, 6, 7]], ["yes", "no"], temperature=1.0)
    assert seen and set(seen) == {torch.bfloat16}
    # float32 has nothing to mix: the flag changes nothing
    plain = Policy(smooth_tiny_model, finetune="full", dtype="float32", mixed_precision=True)
    seen = passes_dtypes(plain)
    plain.sample([[1, 5, 6, 7]], temperature=1.0, max_new_tokens=2)
    assert plain.compute_dtype is None and set(seen) == {torch.float32}


def test_a_step_at_lr_1e_6_moves_bfloat16_weights_only_with_master_weights(smooth_tiny_model):
    moved = {}
    for mixed in (False, True):
        torch.manual_seed(0)
        policy = Policy(
            smooth_tiny_model,
            finetune="full",
            lr=1e-6,
            beta=0.05,
            dtype="bfloat16",
            mixed_precision=mixed,
        )
        before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
        one_update(policy)
        after = dict(policy.model.named_parameters())
        changed = sum(int((before[n] != after[n]).sum()) for n in before)
        norms = [n for n in before if "norm" in n]  # weights of 1.0: bf16's spacing there is 8e-3
        moved[mixed] = (
            changed / sum(t.numel() for t in before.values()),
            sum(int(torch.equal(before[n], after[n])) for n in norms),
            len(norms),
        )
    share, still, norms = moved[False]
    assert share < 0.1 and still == norms  # bfloat16 alone: most steps round away
    share, still, norms = moved[True]
    assert share > 0.99 and still == 0  # float32 master weights keep them


def run_config(tiny_model, tmp_path, **extra):
    data = {
        "name": "mixed",
        "domain": "letters",
        "base_model": str(tiny_model),
        "steps": 2,
        "group_size": 2,
        "lr": 1e-4,
        "beta": 0.05,
        "finetune": "full",
        "dtype": "bfloat16",
        "mixed_precision": True,
        "max_new_tokens": 4,
        "max_turns": 2,
        "micro_batch": 4,
        "save_every": 1,
        "simulator": {"max_new_tokens": 3},
        "tasks": {"max_train": 2, "max_eval": 1},
        "heldout": [],
        "output_dir": str(tmp_path / "run"),
        "threads": 1,
    }
    data.update(extra)
    return parse_config(data)


def weights(folder):
    state = {}
    for shard in sorted(Path(folder).glob("*.safetensors")):
        state.update(load_file(shard))
    return state


def test_a_mixed_precision_checkpoint_resumes_exactly(smooth_tiny_model, tmp_path, letters):
    straight = run_config(smooth_tiny_model, tmp_path / "straight")
    train(straight, domain=letters, show_progress=False)
    halves = run_config(smooth_tiny_model, tmp_path / "halves", steps=1)
    train(halves, domain=letters, show_progress=False)
    first = checkpoint.checkpoint_dir(halves.run_dir(), 1)
    saved = weights(first)
    assert {t.dtype for t in saved.values()} == {torch.float32}  # the master weights
    # served in the dtype it computes in (vLLM / transformers with dtype "auto")
    assert json.loads((first / "config.json").read_text())["dtype"] == "bfloat16"
    train(run_config(smooth_tiny_model, tmp_path / "halves"), domain=letters, show_progress=False)

    a = weights(checkpoint.checkpoint_dir(straight.run_dir(), 2))
    b = weights(checkpoint.checkpoint_dir(halves.run_dir(), 2))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], saved[k]) for k in a)  # step 2 did move them


def test_sampling_keeps_keys_and_values_in_the_compute_dtype(smooth_tiny_model):
    """Under mixed precision the passes run in bfloat16 but autocast leaves the keys (after the
    float32 rotary embedding) and values float32: the carried caches of every open transcript
    would take twice the memory the dry run counts. They are kept in bfloat16, both after a
    first turn (prefill and decoding) and after a turn started from the carried cache."""
    from training.rl.sampling import KVCache

    policy = Policy(smooth_tiny_model, finetune="full", dtype="bfloat16", mixed_precision=True)
    caches = [KVCache(), KVCache()]
    prompts = [[1, 5, 6, 7, 8, 9, 10, 11, 12, 13], [1, 5, 6, 7, 8, 9, 10, 11, 12, 14]]
    policy.sample(prompts, 1.0, 6, caches=caches)
    for _ in range(2):
        dtypes = {t.dtype for cache in caches for layer in cache.layers for t in layer}
        assert dtypes == {torch.bfloat16}
        policy.sample([c.ids + [20, 21] for c in caches], 1.0, 6, caches=caches)
