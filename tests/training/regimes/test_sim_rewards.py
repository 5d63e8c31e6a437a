"""A co-trained simulator's rewards: the release's curriculum formula on hand-made groups, each
Domain's default under "auto", the one declaration the config reads, and a real co-training step
whose simulator learns from the curriculum reward of its own rollouts."""

import json
import math
import statistics
import typing

import pytest
import torch
from safetensors.torch import load_file

from agents.domains import DOMAINS, domain_class
from training.__main__ import vocabularies
from training.config import parse_config
from training.config_keys import ConfigError
from training.config_schema import RunConfig
from training.regimes.choose import make_regime
from training.regimes.regime import ModelCache
from training.regimes.sim_rewards import curriculum_reward, simulator_advantages, simulator_rewards
from training.rl.policy import Policy
from training.rollouts.agent import LocalAgent
from training.rollouts.rollout import play
from training.trainer import checkpoint
from training.trainer.loop import train
from training.vocabulary import SIMULATOR_REWARDS

# exp(-(var - 0.25)^2 / 0.02), worked by hand for each group
ALL_EQUAL = math.exp(-(0.25**2) / 0.02)  # var 0: exp(-3.125) = 0.0439
CURRICULUM = [
    ([1.0, 1.0, 1.0, 1.0], ALL_EQUAL),  # every rollout succeeds
    ([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], ALL_EQUAL),  # none does
    ([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0], 1.0),  # an even split: var 1/4, the peak
    ([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0], 0.822578),  # 6 of 8: var 3/16
    ([0.0, 1.0, 0.0], 0.962154),  # odd G: var 2/9, exp(-(1/36)^2 / 0.02)
    ([0.2, 0.6], 0.110251),  # fractional rewards: var 0.04, exp(-0.21^2 / 0.02) = exp(-2.205)
    ([0.5, 0.5, 0.5, 0.5], ALL_EQUAL),  # all equal, not 0 or 1
    ([1.0], ALL_EQUAL),  # a group of one has variance 0
]


@pytest.mark.parametrize(("rewards", "expected"), CURRICULUM)
def test_curriculum_reward_is_the_releases_formula(rewards, expected):
    assert curriculum_reward(rewards) == pytest.approx(expected, abs=1e-6)
    # every rollout of the group gets the group's reward
    assert simulator_rewards("curriculum", rewards) == pytest.approx(
        [expected] * len(rewards), abs=1e-6
    )


def test_cooperative_and_adversarial_rewards():
    rewards = [0.0, 0.25, 1.0]
    assert simulator_rewards("cooperative", rewards) == [0.0, 0.25, 1.0]
    assert simulator_rewards("adversarial", rewards) == [1.0, 0.75, 0.0]


def test_curriculum_advantage_is_the_reward_others_are_group_relative():
    """A curriculum reward is constant over its group, so a group baseline would cancel it: its
    advantage is the reward itself (the release's raw-reward advantage); the others keep GRPO's."""
    agent = torch.tensor([[1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    sim, adv = simulator_advantages("curriculum", agent, scale_std=False)
    assert sim.flatten().tolist() == pytest.approx([1.0] * 4 + [ALL_EQUAL] * 4)
    assert torch.equal(adv, sim)
    sim, adv = simulator_advantages("adversarial", agent, scale_std=False)
    assert adv.flatten().tolist() == pytest.approx([-0.5, 0.5, -0.5, 0.5] + [0.0] * 4)


def minimal(domain: str, **extra) -> RunConfig:
    return parse_config({"name": "r", "domain": domain, "regime": "cotrain", **extra})


@pytest.mark.parametrize(
    ("domain", "mode"),
    [
        ("p4g", "adversarial"),
        ("p4g-decision", "adversarial"),
        ("retail", "curriculum"),
        ("airline", "curriculum"),
        ("letters", "cooperative"),
    ],
)
def test_auto_is_the_domains_own(domain, mode):
    assert minimal(domain).simulator_reward_mode == mode
    for explicit in ("curriculum", "cooperative", "adversarial"):  # a named mode wins
        assert minimal(domain, simulator_reward=explicit).simulator_reward_mode == explicit


def test_every_domain_declares_a_known_reward():
    for name in DOMAINS:
        assert domain_class(name).simulator_reward in set(SIMULATOR_REWARDS) - {"auto"}, name


def test_config_reads_the_one_declaration():
    info = RunConfig.__pydantic_fields__["simulator_reward"]
    assert typing.get_args(info.annotation) == tuple(SIMULATOR_REWARDS)
    assert set(SIMULATOR_REWARDS) == {"auto", "curriculum", "cooperative", "adversarial"}
    for name, text in SIMULATOR_REWARDS.items():
        assert f"{name}: {text}" in info.description
    assert f"simulator rewards: {', '.join(SIMULATOR_REWARDS)}" in vocabularies()  # CLI help


def test_bad_value_names_the_key():
    with pytest.raises(ConfigError) as error:
        minimal("retail", simulator_reward="curricula")
    assert error.value.key == "simulator_reward"
    assert "must be one of auto, curriculum, cooperative, adversarial" in str(error.value)


def test_domain_with_an_unknown_default_is_refused(monkeypatch):
    monkeypatch.setattr(domain_class("letters"), "simulator_reward", "kind")
    with pytest.raises(ConfigError) as error:
        minimal("letters").simulator_reward_mode  # noqa: B018
    assert error.value.key == "simulator_reward" and "'kind'" in str(error.value)


def by_hand(rewards: list[float]) -> float:
    """The release's formula again, on the standard library's population variance."""
    return math.exp(-((statistics.pvariance(rewards) - 0.25) ** 2) / 0.02)


def cotrain_step(tiny_model, tmp_path, letters, **extra):
    """One co-training step as the trainer takes it: two tasks' groups of 4, then the
    simulator's update."""
    torch.manual_seed(0)
    cfg = parse_config(
        {
            "name": "t-curriculum",
            "domain": "letters",
            "regime": "cotrain",
            "base_model": str(tiny_model),
            "group_size": 4,
            "simulator_lr": 1e-2,
            "max_new_tokens": 6,
            "max_turns": 4,
            "simulator": {"max_new_tokens": 6},
            "output_dir": str(tmp_path),
            "simulator_reward": "curriculum",
            **extra,
        }
    )
    regime = make_regime(cfg, cfg.run_dir(), ModelCache(cfg))
    agent = LocalAgent(Policy(tiny_model, lr=cfg.lr), 1.0, cfg.max_new_tokens)
    rollouts = []
    with regime.simulator(1) as user:
        for task in letters.scenarios("train")[:2]:
            rollouts += play(letters, [task] * cfg.group_size, agent, user, max_turns=4)
    return cfg, regime, rollouts


def test_cotrain_step_learns_from_the_curriculum_reward(tiny_model, tmp_path, letters):
    cfg, regime, rollouts = cotrain_step(tiny_model, tmp_path, letters)
    groups = [[r.reward for r in rollouts[i : i + 4]] for i in (0, 4)]
    assert all(len(set(g)) > 1 for g in groups)  # rewards differ inside each group
    before = {n: p.detach().clone() for n, p in regime.policy.model.named_parameters()}
    stats = regime.learn(1, rollouts)
    assert stats["sim/reward_mean"] == pytest.approx(statistics.fmean(map(by_hand, groups)))
    variances = [statistics.pvariance(g) for g in groups]
    assert stats["sim/agent_variance"] == pytest.approx(statistics.fmean(variances))
    # the advantages were not all 0 (a group baseline would have cancelled them): it learned
    moved = [n for n, p in regime.policy.model.named_parameters() if not torch.equal(before[n], p)]
    assert stats["sim/learned"] == 1.0 and moved


def test_snapshot_rollouts_count_in_no_groups_split(tiny_model, tmp_path, letters):
    """Population: the rollouts a pool snapshot played are left out of their group's split (and
    of the simulator's update); the current simulator's are scored among themselves."""
    cfg, regime, rollouts = cotrain_step(tiny_model, tmp_path, letters)
    for i, r in enumerate(rollouts):
        if i % 4 >= 2:  # as Population draws: the first ceil(G/2) meet the current simulator
            r.member = "sim-step-000002"
    own = [[r.reward for r in rollouts[i : i + 2]] for i in (0, 4)]
    stats = regime.learn(1, rollouts)
    assert stats["sim/reward_mean"] == pytest.approx(statistics.fmean(map(by_hand, own)))
    assert stats["sim/tokens"] == sum(sum(r.user.mask) for r in rollouts if r.member == "current")


def test_a_retail_cotrain_run_rewards_its_simulator_by_the_curriculum(tiny_model, tmp_path):
    """The trainer on tau2 retail with the default (auto): a tiny agent solves nothing, so every
    group's rewards are equal and the simulator's reward is exp(-0.25^2 / 0.02) on every
    rollout; still positive, it is the simulator's advantage, so it moves the simulator."""
    cfg = parse_config(
        {
            "name": "retail-curriculum",
            "domain": "retail",
            "regime": "cotrain",
            "base_model": str(tiny_model),
            "steps": 1,
            "group_size": 2,
            "batch_tasks": 2,
            "max_new_tokens": 6,
            "max_turns": 4,
            "max_tool_rounds": 1,
            "threads": 1,
            "heldout": [],
            "output_dir": str(tmp_path),
            "tasks": {"max_train": 2},
            "simulator": {"max_new_tokens": 6},
        }
    )
    train(cfg, show_progress=False)
    [row] = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert row["reward_mean"] == row["reward_std"] == 0.0  # all equal: variance 0
    assert row["sim/reward_mean"] == pytest.approx(ALL_EQUAL)
    assert row["sim/agent_variance"] == 0.0
    folder = checkpoint.checkpoint_dir(tmp_path, 1) / "simulator"
    adapter = load_file(folder / "adapter_model.safetensors")
    # LoRA's B starts at 0 and the KL to the base has no gradient there: only the reward moved it
    assert any(float(t.abs().max()) > 0 for k, t in adapter.items() if "lora_B" in k)
