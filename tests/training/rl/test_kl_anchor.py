"""The KL anchor of each learning role: its reference is its own base model as loaded from disk,
not the policy as it now is, and its update weighs the KL by its own coefficient (the agent
`beta`, a co-trained simulator `simulator_beta`)."""

import json

import pytest
import torch

from training.config import parse_config
from training.config_schema import RunConfig
from training.regimes.choose import make_regime
from training.regimes.regime import ModelCache
from training.rl.logprobs import TokenBatch, token_logprobs
from training.rl.policy import LocalModel, Policy
from training.rl.tokens import Transcript
from training.trainer.loop import train

TEMPERATURE = 0.7  # not 1, so a reference pass that ignored the temperature would show
ROWS = [[1, 5, 6, 7, 8, 9, 10, 11], [1, 5, 6, 7, 12, 13, 14, 15]]
MASK = [0, 0, 0, 0, 1, 1, 1, 1]


def moved(policy: Policy, config: RunConfig, beta: float) -> TokenBatch:
    """One GRPO update of `policy` on two rows of different advantages, asserted to have moved
    its log-probs away from where they started; returns the batch. Only a moved policy tells a
    reference that follows it from its base (the first update's reference pass precedes its
    step, so its KL statistic cannot)."""
    batch = TokenBatch.from_lists(ROWS, [MASK] * 2, policy.pad_id)
    with torch.no_grad():
        before = token_logprobs(policy.model, batch, temperature=TEMPERATURE)[0]
    stats = policy.learn(
        [Transcript(ids=list(ids), mask=list(MASK)) for ids in ROWS],
        torch.tensor([1.0, -1.0]),
        config,
        temperature=TEMPERATURE,
        beta=beta,
    )
    assert stats["trained_sequences"] == 2
    with torch.no_grad():
        after = token_logprobs(policy.model, batch, temperature=TEMPERATURE)[0]
    assert ((after - before) * batch.mask).abs().max() > 1e-2
    return batch


def assert_is_fresh_base(policy: Policy, batch: TokenBatch, base: str) -> None:
    """The policy's reference log-probs are those of `base` loaded again from disk, and no longer
    the policy's own (the update moved it)."""
    fresh = LocalModel.load(base)
    with torch.no_grad():
        expected = token_logprobs(fresh.model, batch, temperature=TEMPERATURE)[0]
        own = token_logprobs(policy.model, batch, temperature=TEMPERATURE)[0]
    reference = policy.reference_logprobs(batch, TEMPERATURE)
    torch.testing.assert_close(reference, expected, rtol=0, atol=1e-5)
    assert (reference - own).abs().max() > 1e-2


def run_config(tiny_model, tmp_path, **extra) -> RunConfig:
    data = {
        "name": "anchor",
        "domain": "letters",
        "base_model": str(tiny_model),
        "lr": 1e-2,
        "simulator_lr": 1e-2,
        "group_size": 4,
        "max_new_tokens": 6,
        "max_turns": 2,  # the user asks, the agent answers once
        "simulator": {"max_new_tokens": 4},
        "heldout": [],
        "output_dir": str(tmp_path / "run"),
        "threads": 1,
    }
    return parse_config(data | extra)


@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_the_agents_reference_is_its_base_model_after_it_learned(tiny_model, tmp_path, finetune):
    torch.manual_seed(0)
    cfg = run_config(tiny_model, tmp_path, finetune=finetune, beta=0.1)
    agent = Policy.for_run(cfg, lr=cfg.agent_lr)
    batch = moved(agent, cfg, cfg.beta)
    assert_is_fresh_base(agent, batch, str(tiny_model))


@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_the_cotrained_simulators_reference_is_its_own_base_model(
    tiny_model, other_tiny_model, tmp_path, finetune
):
    """The simulator on a model of its own (not the agent's), with the release's Population
    Self-Play weights: no KL for the agent, simulator_beta for the simulator. Full fine-tuning
    makes a reference copy only for a positive weight, so a simulator built with the agent's
    beta has none to anchor it."""
    torch.manual_seed(0)
    cfg = run_config(
        tiny_model,
        tmp_path,
        regime="cotrain",
        finetune=finetune,
        beta=0.0,
        simulator_beta=0.1,
        simulator={"model": str(other_tiny_model), "max_new_tokens": 4},
        simulator_reward="adversarial",
    )
    regime = make_regime(cfg, cfg.run_dir(), ModelCache(cfg))
    batch = moved(regime.policy, cfg, cfg.simulator_beta)
    assert_is_fresh_base(regime.policy, batch, str(other_tiny_model))


@pytest.mark.parametrize(
    ("beta", "simulator_beta"),
    [pytest.param(0.0, 0.1, id="simulator-only"), pytest.param(0.1, 0.0, id="agent-only")],
)
def test_each_role_learns_with_its_own_kl_weight(
    tiny_model, tmp_path, letters, beta, simulator_beta
):
    """One co-training step of two epochs: the first moves each role from its reference (both
    have a reward spread), so in the second the KL term is positive exactly for the role whose
    weight is; a role with weight 0 adds no KL at all. LoRA, the default: its reference (the
    adapter disabled) is there whatever the weight, so only the weight its update is given
    decides."""
    cfg = run_config(
        tiny_model,
        tmp_path,
        regime="cotrain",
        steps=1,
        ppo_epochs=2,
        beta=beta,
        simulator_beta=simulator_beta,
        simulator_reward="adversarial",
        save_every=0,
    )
    train(cfg, domain=letters, show_progress=False)
    (row,) = [json.loads(line) for line in (cfg.run_dir() / "metrics.jsonl").open()]
    assert row["optimizer_step"] == 1.0 and row["sim/learned"] == 1.0
    # k3 >= 0: a role with weight 0 reports exactly 0 (its update made no reference pass)
    assert (row["kl"] > 0, row["sim/kl"] > 0) == (beta > 0, simulator_beta > 0), row
