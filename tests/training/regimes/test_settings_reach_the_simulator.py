"""Settings the simulator-collapse experiments rest on reach what they set (issue 41, point 0):
the co-trained simulator's loss at its own sampling temperature, its kl_estimator and scale_std,
and a Verbalized run's exploit measured on the plain model under its Verbalized Sampling. Each
is checked on what a co-training step on the P4G decision episode reports, against values
computed here from the simulator's own transcripts."""

import dataclasses

import pytest
import torch

from training.config import parse_config
from training.measures.collapse import simulator_exploit
from training.regimes.choose import make_regime
from training.regimes.regime import ModelCache, frozen_simulator
from training.rl.grpo import KL_ESTIMATORS, group_advantages
from training.rl.logprobs import TokenBatch, token_logprobs
from training.rl.policy import Policy
from training.rollouts.agent import LocalAgent
from training.rollouts.rollout import play
from training.trainer.loop import _exploit

SIM_TEMPERATURE = 2.0  # not 1, so a loss computed at temperature 1 differs


def run_config(tiny_model, tmp_path, **extra):
    settings = {
        "name": "guarded",
        "domain": "p4g-decision",
        "regime": "cotrain",
        "base_model": str(tiny_model),
        "group_size": 4,
        "simulator_lr": 1e-2,
        "max_turns": 2,
        "max_new_tokens": 8,
        "output_dir": str(tmp_path),
        "threads": 1,
        "simulator": {"max_new_tokens": 8, "temperature": SIM_TEMPERATURE},
        **extra,
    }
    return parse_config(settings)


def cotrain_rollouts(tiny_model, tmp_path, **extra):
    """Two tasks' groups of 4 played against the co-trained simulator, as the trainer plays them."""
    torch.manual_seed(0)
    cfg = run_config(tiny_model, tmp_path, **extra)
    regime = make_regime(cfg, cfg.run_dir(), ModelCache(cfg))
    domain = cfg.build_domain()
    agent = LocalAgent(Policy(tiny_model, lr=cfg.lr), 1.0, cfg.max_new_tokens)
    rollouts = []
    with regime.simulator(1) as user:
        for task in domain.scenarios("train")[:2]:
            rollouts += play(domain, [task] * cfg.group_size, agent, user, max_turns=2)
    return cfg, regime, rollouts


def simulator_batch(regime, rollouts) -> TokenBatch:
    users = [r.user for r in rollouts]
    return TokenBatch.from_lists(
        [t.ids for t in users],
        [t.mask for t in users],
        regime.policy.pad_id,
        [t.allowed for t in users],
    )


def token_mean(values, batch) -> float:
    return float((values * batch.mask).sum() / batch.mask.sum())


def test_the_simulators_loss_is_at_its_sampling_temperature(tiny_model, tmp_path):
    """The entropy the update reports is that of the distribution the simulator sampled (at
    simulator.temperature), which at temperature 1 is another number."""
    cfg, regime, rollouts = cotrain_rollouts(tiny_model, tmp_path, simulator_beta=0.0)
    batch = simulator_batch(regime, rollouts)
    with torch.no_grad():
        at = {
            t: token_mean(token_logprobs(regime.policy.model, batch, True, t)[1], batch)
            for t in (SIM_TEMPERATURE, 1.0)
        }
    assert abs(at[SIM_TEMPERATURE] - at[1.0]) > 1e-2  # the two temperatures are told apart
    stats = regime.learn(1, rollouts)
    assert stats["sim/entropy"] == pytest.approx(at[SIM_TEMPERATURE], rel=1e-4)


@pytest.mark.parametrize("estimator", ["k1", "k2"])
def test_the_simulators_kl_is_the_configured_estimator(tiny_model, tmp_path, estimator):
    """With the adapter moved off its base, the KL the update reports is kl_estimator's, token by
    token on the simulator's own tokens (k3 gives another number)."""
    cfg, regime, rollouts = cotrain_rollouts(
        tiny_model, tmp_path, simulator_beta=0.5, kl_estimator=estimator
    )
    torch.manual_seed(1)
    with torch.no_grad():  # LoRA starts at its base (B = 0): move it so the KL is not 0
        for name, p in regime.policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    batch = simulator_batch(regime, rollouts)
    with torch.no_grad():
        logp = token_logprobs(regime.policy.model, batch, temperature=SIM_TEMPERATURE)[0]
        ref = regime.policy.reference_logprobs(batch, SIM_TEMPERATURE)
    each = {k: token_mean(f(ref - logp), batch) for k, f in KL_ESTIMATORS.items()}
    assert abs(each[estimator] - each["k3"]) > 1e-3
    stats = regime.learn(1, rollouts)
    assert stats["sim/kl"] == pytest.approx(each[estimator], rel=1e-4)


@pytest.mark.parametrize("scale_std", [False, True])
def test_the_simulators_advantages_follow_scale_std(tiny_model, tmp_path, scale_std):
    """With one pass and no KL, the loss is minus the token mean of the advantages: those of
    1 - the agent's reward within each group, std-scaled only when scale_std says so."""
    cfg, regime, rollouts = cotrain_rollouts(
        tiny_model, tmp_path, simulator_beta=0.0, scale_std=scale_std
    )
    sim = torch.tensor([1.0 - r.reward for r in rollouts]).view(2, -1)
    assert all(row.std() > 0 and abs(row.std() - 1) > 0.1 for row in sim)  # scaling shows
    adv = group_advantages(sim, scale_std=scale_std).flatten()
    tokens = torch.tensor([float(sum(r.user.mask)) for r in rollouts])
    stats = regime.learn(1, rollouts)
    assert stats["sim/loss"] == pytest.approx(float(-(adv * tokens).sum() / tokens.sum()), rel=1e-4)


def test_a_verbalized_runs_exploit_is_its_plain_models(tiny_model, tmp_path):
    """p(exploit) of a Verbalized run is measured against what its underlying model decides
    plainly (exact), not against the distributions its Verbalized Sampling writes down."""
    cfg = run_config(
        tiny_model,
        tmp_path,
        regime="verbalized",
        simulator={"kind": "verbalized", "k": 2, "max_new_tokens": 16, "retries": 0},
        tasks={"max_train": 2},
    )
    domain = cfg.build_domain()
    tasks = domain.scenarios("train")[:2]
    models = ModelCache(cfg)
    found = _exploit(cfg, domain, tasks, models)
    cfg.run_dir().mkdir(parents=True, exist_ok=True)
    plain = dataclasses.replace(cfg.training_simulators()[0], kind="plain")
    expected = simulator_exploit(domain, tasks, frozen_simulator(plain, models, cfg.seed))
    assert found is not None and expected is not None
    assert found["expected_reward"] == pytest.approx(expected["expected_reward"])
    assert found["exploit"] == expected["exploit"]
