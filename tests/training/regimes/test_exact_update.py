"""simulator_update = "exact" (training/regimes/exact_update.py): on the P4G decision episode the
co-trained simulator learns from the exact expected advantage over the five markers for each ask
played, with that ask's own baseline, plus the exact reverse KL to its base."""

import math

import pytest
import torch

from training.config import parse_config
from training.config_keys import ConfigError
from training.regimes.exact_update import exact_choice_loss, text_rewards
from training.rl.choices import choice_logprobs

from .test_settings_reach_the_simulator import SIM_TEMPERATURE, cotrain_rollouts


def rows():
    """Two asks' rows: logits over 3 texts, their base's, and what each text earns after each."""
    logits = torch.tensor([[0.2, 1.0, -0.5], [1.5, -0.3, 0.1]], requires_grad=True)
    base = torch.log_softmax(torch.tensor([[0.0, 0.3, 0.2], [-0.4, 0.5, 0.0]]), -1)
    rewards = torch.tensor([[1.0, 0.5, 0.0], [0.9, 0.8, 0.7]])  # the first ask pays more spread
    return logits, base, rewards


def test_each_asks_advantage_is_relative_to_its_own_expected_reward():
    """A_i(m) = s_i(m) - sum_m pi(m|x_i) s_i(m): zero-mean under pi for every ask, so the loss's
    value is beta x KL alone (a baseline shared by the asks, as a group mean, leaves neither)."""
    logits, base, rewards = rows()
    logp = torch.log_softmax(logits, -1)
    p = logp.detach().exp()
    loss, stats = exact_choice_loss(logp, base, rewards, beta=0.3)
    value = (p * rewards).sum(-1, keepdim=True)
    assert torch.allclose(stats["advantage"], rewards - value)
    assert torch.allclose((p * stats["advantage"]).sum(-1), torch.zeros(2), atol=1e-6)
    assert float(loss.detach()) == pytest.approx(0.3 * float(stats["kl"].sum()), rel=1e-5)
    # scale_std divides each ask's by its own spread under pi
    sigma = (p * (rewards - value) ** 2).sum(-1, keepdim=True).sqrt()
    scaled = exact_choice_loss(logp, None, rewards, beta=0.0, scale_std=True)[1]["advantage"]
    assert torch.allclose(scaled, (rewards - value) / (sigma + 1e-4))


def test_the_gradient_is_that_of_the_expected_advantage():
    """d/dz of -sum_m pi(m) A(m) for pi = softmax(z): -pi_k (A_k - sum_m pi_m A_m) = -pi_k A_k."""
    logits, _, rewards = rows()
    logp = torch.log_softmax(logits, -1)
    loss, stats = exact_choice_loss(logp, None, rewards, beta=0.0)
    loss.backward()
    p = logp.detach().exp()
    assert torch.allclose(logits.grad, -p * stats["advantage"], atol=1e-6)


def test_the_kl_term_is_the_exact_reverse_kl_and_its_gradient():
    """KL(pi || base) = sum_m pi_m (log pi_m - log base_m), whose gradient in the logits is
    pi_k (log pi_k - log base_k - KL); the forward KL(base || pi) is another number."""
    logits, base, _ = rows()
    logp = torch.log_softmax(logits, -1)
    loss, stats = exact_choice_loss(logp, base, torch.zeros(2, 3), beta=1.0)
    p = logp.detach().exp()
    reverse = (p * (logp.detach() - base)).sum(-1)
    forward = (base.exp() * (base - logp.detach())).sum(-1)
    assert torch.allclose(stats["kl"], reverse, atol=1e-6)
    assert not torch.allclose(reverse, forward, atol=1e-3)
    loss.backward()
    expected = p * (logp.detach() - base - reverse.unsqueeze(-1))
    assert torch.allclose(logits.grad, expected, atol=1e-6)


def exact_probs(regime, rollouts, adapter: bool) -> torch.Tensor:
    """Each rollout's exact marker distribution after its own prompt, from the simulator (or
    its base, `adapter` off), at the sampling temperature."""
    policy = regime.policy
    out = []
    for r in rollouts:
        d = r.decision("user")
        start = min(r.user.allowed) - next(
            j for j, a in enumerate(policy.choices(d.texts).allowed(d.index)) if len(a) > 1
        )
        args = ([r.user.ids[:start]], policy.choices(d.texts), SIM_TEMPERATURE, policy.pad_id)
        if adapter:
            out.append(choice_logprobs(policy.model, *args)[0])
        else:
            with policy.model.disable_adapter():
                out.append(choice_logprobs(policy.model, *args)[0])
    return torch.stack(out)


def moved_off_base(regime):
    torch.manual_seed(1)
    with torch.no_grad():  # LoRA starts at its base (B = 0): move it so the KL is not 0
        for name, p in regime.policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)


def test_a_cotrain_step_reports_the_exact_reverse_kl_over_the_markers(tiny_model, tmp_path):
    cfg, regime, rollouts = cotrain_rollouts(
        tiny_model,
        tmp_path,
        simulator_update="exact",
        simulator_beta=0.5,
        scale_std=True,
        micro_batch=40,  # every rollout's 5 rows in one pass: a baseline across asks would show
    )
    moved_off_base(regime)
    logp = exact_probs(regime, rollouts, adapter=True)
    base = exact_probs(regime, rollouts, adapter=False)
    reverse = float((logp.exp() * (logp - base)).sum(-1).mean())
    assert reverse > 1e-3
    stats = regime.learn(1, rollouts)
    assert stats["sim/kl"] == pytest.approx(reverse, rel=1e-3)
    # each ask's advantages are centred on its own value (and scaled by its own spread), so
    # the advantage term is 0 for every ask: with a baseline shared by the asks it is not
    assert stats["sim/loss"] == pytest.approx(0.5 * reverse, rel=1e-3)
    assert stats["sim/learned"] == 1.0 and stats["sim/trained_sequences"] == len(rollouts)


def test_one_exact_step_raises_the_simulators_expected_reward_over_the_asks_played(
    tiny_model, tmp_path
):
    """The update ascends sum_i sum_m pi(m|x_i) s_i(m): after one step the simulator's exact
    expected reward over this step's asks is higher (adversarial: 1 - the agent's reward)."""
    cfg, regime, rollouts = cotrain_rollouts(
        tiny_model, tmp_path, simulator_update="exact", simulator_beta=0.0, scale_std=False
    )
    domain = cfg.build_domain()
    earned = torch.tensor([text_rewards(domain, r, "adversarial") for r in rollouts])
    assert bool((earned[:, :-1] > earned[:, 1:]).all())  # $0 pays the simulator most, $2 least
    before = (exact_probs(regime, rollouts, adapter=True).exp() * earned).sum(-1).mean()
    regime.learn(1, rollouts)
    after = (exact_probs(regime, rollouts, adapter=True).exp() * earned).sum(-1).mean()
    assert float(after) > float(before) + 1e-3


def test_a_rollout_without_the_simulators_choice_is_refused(tiny_model, tmp_path):
    cfg, regime, rollouts = cotrain_rollouts(tiny_model, tmp_path, simulator_update="exact")
    rollouts[2].decisions = [d for d in rollouts[2].decisions if d.role != "user"]
    with pytest.raises(ValueError, match="rollout 2 has no choice turn of the simulator"):
        regime.learn(1, rollouts)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"domain": "p4g"}, 'domain "p4g" does not give the simulator one choice'),
        ({"regime": "single"}, 'regime "single" trains none'),
        ({"simulator_reward": "curriculum"}, "the curriculum reward is one per group"),
        ({"distributed": {"processes": 2, "strategy": "fsdp"}}, "not implemented under FSDP"),
    ],
)
def test_exact_where_the_decision_is_not_exact_is_refused(settings, message):
    base = {"name": "x", "domain": "p4g-decision", "regime": "cotrain"}
    with pytest.raises(ConfigError, match="simulator_update") as refused:
        parse_config({**base, "simulator_update": "exact", **settings})
    assert message in str(refused.value)
    assert parse_config({**base, **settings}).simulator_update == "sampled"  # the default


def test_exact_is_offered_beside_sampled():
    config = parse_config(
        {"name": "x", "domain": "p4g-decision", "regime": "population", "simulator_update": "exact"}
    )
    assert config.simulator_update == "exact"
    assert math.isfinite(config.simulator_beta)
