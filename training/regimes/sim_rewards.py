"""A co-trained simulator's rewards and advantages (RunConfig.simulator_reward; the names and their
help are declared once in training/vocabulary.py SIMULATOR_REWARDS, each Domain's default is its
`simulator_reward` attribute). r_i is the agent's reward in rollout i of one task's group of n
rollouts (the ones the current simulator played), s_i the simulator's:

    cooperative   s_i = r_i
    adversarial   s_i = 1 - r_i
    curriculum    s_i = exp(-(var - 0.25)^2 / 0.02)     the same for every rollout of the group
                  var = (1/n) sum_j (r_j - mean(r))^2   (biased variance; 0 when n = 1)

The curriculum reward peaks (1.0) when the agent's rewards over the group split evenly: 0.25 is
the largest variance of a 0/1 reward (p = 1/2). It is a function of the variance of the rewards
(not of a success count), so a fractional reward counts as it is: for 0/1 rewards var = p(1 - p)
with p the group's success share, e.g. n = 8: 4 successes 1.0, 3 or 5: 0.99, 2 or 6: 0.82,
1 or 7: 0.37, 0 or 8 (all equal): 0.044; n = 3 with 1 or 2 successes (var 2/9): 0.96.

Advantages. cooperative and adversarial: GRPO's group advantages, as the agent's (scale_std). A
curriculum reward is constant over its group, so r - mean(r) would be 0 for every rollout:
the advantage is the reward itself, as in the release, whose launchers pass
--disable-rewards-normalization (slime then uses the raw reward as the advantage; its group
normalisation runs only with rewards_normalization on).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from training.rl.grpo import group_advantages

# The release's curriculum (CHATS-lab/scope_usim usim/slime/tau2_cotrain_rollout.py,
# _variance_curriculum_reward and _apply_user_curriculum_reward, commit
# 6218b97532dd1c726746840486ef31801ce110e8; set by cmd/slime/tau2/self_play.sh,
# --tau2-user-reward-mode curriculum, commit 1470e27a7c026b22cbd28031f6f865689990cedc):
# a Gaussian in the group's reward variance, centred on 0.25 with sigma^2 = 0.02 (after SPICE,
# arXiv:2510.24684). The release also adds --tau2-tool-error-penalty (-0.1) to a rollout whose
# sample is marked `error` (a rollout that raised: its sample has no tokens, so nothing of it is
# trained) or `tau2_tool_error` (set by no file of the release); parley has neither mark (a
# rollout that raises stops the run), so the term is not carried.
# adversarial and cooperative follow usim/core/co_training_orchestrator.py (P4G: 1 - the agent's
# reward unless --cooperative-reward; commit 0a0747d97c3cb711f27e35d77398a7ae017e97a2, run by
# cmd/slime/p4g/self_play.sh without that flag) and usim/slime/tau2_cotrain_rollout.py (tau2: the
# agent's reward unless curriculum).
CURRICULUM_CENTER = 0.25
CURRICULUM_SIGMA2 = 0.02


def group_variance(rewards: Sequence[float]) -> float:
    """The biased (1/n) variance of one group's agent rewards; 0 for a group of one."""
    n = len(rewards)
    if n < 2:
        return 0.0
    mean = sum(rewards) / n
    return sum((r - mean) ** 2 for r in rewards) / n


def curriculum_reward(rewards: Sequence[float]) -> float:
    """exp(-(var - 0.25)^2 / 0.02) of one group's agent rewards (see the module docstring)."""
    diff = group_variance(rewards) - CURRICULUM_CENTER
    return math.exp(-(diff * diff) / CURRICULUM_SIGMA2)


def simulator_rewards(mode: str, rewards: Sequence[float]) -> list[float]:
    """The simulator's reward for each rollout of one task's group, from the agent's rewards."""
    if mode == "cooperative":
        return [float(r) for r in rewards]
    if mode == "adversarial":
        return [1.0 - r for r in rewards]
    if mode == "curriculum":
        return [curriculum_reward(rewards)] * len(rewards)
    raise ValueError(f"unknown simulator reward {mode!r}")  # config_schema.py validates the name


def simulator_advantages(
    mode: str, agent_rewards: torch.Tensor, scale_std: bool, center: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """(simulator rewards, advantages), both [groups, n], from the agent's rewards [groups, n]
    (one row per task's group)."""
    sim = torch.tensor([simulator_rewards(mode, row) for row in agent_rewards.tolist()])
    if mode == "curriculum":  # constant over the group: the reward is the advantage (see above)
        return sim, sim.clone()
    return sim, group_advantages(sim, scale_std, center)
