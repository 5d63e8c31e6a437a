"""A co-trained simulator's exact update on choice turns (RunConfig.simulator_update = "exact").

Where the simulator's whole part of an episode is one choice among fixed texts m = 1..M
answering the agent's opening ask (Domain.exact_user_decision: P4G's five decision markers),
its distribution pi(m | x_i) after rollout i's prompt x_i is exact (training/rl/choices.py), and
so is what each text would have earned: s_i(m), the simulator's reward (sim_rewards.py) had it
answered m to the ask a_i that the agent played in rollout i. The sampled update (grpo.py)
trains on the one text drawn, with the advantage s_i - mean(s) over the task's group, a group
in which the agent played different asks (its baseline mixes asks), and its KL term sees only
the drawn texts: once pi saturates, a group of G draws rarely holds a text pi gives < 1/G, so
the KL gradient is almost always missing. Here, over the N rollouts the current simulator
played this step (every group; data-parallel: N is the global count):

    V_i    = sum_m pi(m|x_i) s_i(m)                   the ask's own expected reward: the
                                                      per-ask baseline (no gradient)
    A_i(m) = s_i(m) - V_i                             (center_rewards = false: s_i(m))
             with scale_std: / (sigma_i + 1e-4),  sigma_i^2 = sum_m pi(m|x_i) (s_i(m) - V_i)^2
                                                      (the ask's own reward spread under pi)
    KL_i   = sum_m pi(m|x_i) (log pi(m|x_i) - log pi_ref(m|x_i))     exact reverse KL to the
                                                      base (LoRA: adapter off), at the same T
    L      = 1/N sum_i [ -sum_m pi(m|x_i) A_i(m) + beta KL_i ]        beta = simulator_beta

log pi is the constrained distribution at the simulator's sampling temperature T, summed over
the text's non-forced tokens, exactly as it was sampled. The expectation over m is exact, so the
objective is on-policy on every pass: each of ppo_epochs passes recomputes pi, V and sigma, and
needs no ratio or clip. The first term's value is 0 at the current pi (the baseline centres each
ask's advantages), so the loss reported is beta x KL. kl_estimator and kl_clamp do not apply.
Note that since sum_m grad pi(m|x_i) = 0, a baseline constant over the texts of one ask does
not change this gradient without scale_std; what the per-ask baseline changes is each ask's
std scaling (sigma_i is the spread around the ask's own V_i, not a spread across asks) and the
advantages and loss that are reported. The variance the sampled update's mixed-ask baseline adds
is gone here because nothing is sampled.
"""

from __future__ import annotations

from typing import Any

import torch

from agents.domains.episode import USER
from training.regimes.sim_rewards import simulator_rewards
from training.rl.grpo import STD_EPS
from training.rl.logprobs import TokenBatch, token_logprobs
from training.rollouts.rollout import Rollout


def exact_choice_loss(
    logp: torch.Tensor,
    ref_logp: torch.Tensor | None,
    rewards: torch.Tensor,
    beta: float,
    scale_std: bool = False,
    center: bool = True,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The summed loss of the module docstring over these rows (divide by the global N).

    logp, ref_logp: [N, M] log pi(m|x_i) (logp with its gradient), rewards: [N, M] s_i(m).
    Returns (sum_i L_i, per-row tensors without gradient: advantage [N, M], kl [N],
    entropy [N], value [N])."""
    probs = logp.exp()
    with torch.no_grad():
        p = probs.detach()
        value = (p * rewards).sum(-1, keepdim=True)  # V_i: this ask's own baseline
        adv = rewards - value if center else rewards.clone()
        if scale_std:
            sigma = (p * (rewards - value) ** 2).sum(-1, keepdim=True).sqrt()
            adv = adv / (sigma + STD_EPS)
    per_row = -(probs * adv).sum(-1)
    kl = torch.zeros_like(per_row)
    if ref_logp is not None and beta > 0:
        kl = (probs * (logp - ref_logp)).sum(-1)  # reverse KL(pi || ref), exact over the texts
        per_row = per_row + beta * kl
    with torch.no_grad():
        entropy = -(p * logp.detach()).sum(-1)
    stats = {"advantage": adv, "kl": kl.detach(), "entropy": entropy, "value": value.squeeze(-1)}
    return per_row.sum(), stats


def decision_rows(policy: Any, rollout: Rollout, index: int) -> tuple[list[list[int]], ...]:
    """The simulator's prompt before its decision, followed by every allowed text: one row per
    text (ids, mask on the text's non-forced tokens, their allowed ids), as its transcript
    recorded the one it drew. A rollout whose simulator made no single choice is refused."""
    decision = rollout.decision(USER)
    transcript = rollout.user
    if decision is None or not transcript.allowed:
        raise ValueError(
            f'simulator_update = "exact": rollout {index} has no choice turn of the simulator'
            ' (its decision distribution is not exact there); use "sampled"'
        )
    choices = policy.choices(decision.texts)
    drawn_ids, drawn_allowed = choices.ids[decision.index], choices.allowed(decision.index)
    first = next(j for j, ids in enumerate(drawn_allowed) if len(ids) > 1)
    start = min(transcript.allowed) - first
    trained = [k for k, m in enumerate(transcript.mask) if m]
    chosen = [start + j for j, ids in enumerate(drawn_allowed) if len(ids) > 1]
    if transcript.ids[start : start + len(drawn_ids)] != drawn_ids or trained != chosen:
        raise ValueError(
            f'simulator_update = "exact": rollout {index}\'s simulator spoke other than its one'
            ' decision (free text is not exact); use "sampled"'
        )
    prompt = transcript.ids[:start]
    rows, masks, allowed = [], [], []
    for text in range(len(choices.texts)):
        options = choices.allowed(text)
        rows.append(prompt + choices.ids[text])
        masks.append([0] * start + [int(len(o) > 1) for o in options])
        allowed.append({start + j: list(o) for j, o in enumerate(options) if len(o) > 1})
    return rows, masks, allowed


def text_rewards(domain: Any, rollout: Rollout, mode: str) -> list[float]:
    """s_i(m): the simulator's reward had it answered each allowed text to this rollout's ask
    (the Domain's score of the conversation ending in that text; sim_rewards.py's mode)."""
    decision = rollout.decision(USER)
    last = max(k for k, m in enumerate(rollout.conversation) if m["role"] == "user")
    base = rollout.conversation[:last]
    agent = [
        domain.score([*base, {"role": "user", "content": text}], rollout.state).reward
        for text in decision.texts
    ]
    return simulator_rewards(mode, agent)


def learn_exact(
    policy: Any,
    rollouts: list[Rollout],
    domain: Any,
    config: Any,
    mode: str,
    ranks: Any,
) -> dict[str, float]:
    """One exact update of the co-trained simulator `policy` on the rollouts it played (this
    rank's share); returns its stats (loss, kl, entropy, grad_norm, trained_sequences)."""
    temperature, beta = config.simulator.temperature, config.simulator_beta
    parts = [decision_rows(policy, r, i) for i, r in enumerate(rollouts)]
    rewards = torch.tensor([text_rewards(domain, r, mode) for r in rollouts], dtype=torch.float)
    width = rewards.shape[1]
    total = max(ranks.total(len(rollouts)), 1)
    chunk = max(config.micro_batch // width, 1)  # rollouts per pass: each brings M rows
    ref = {}
    if beta > 0:
        for start in range(0, len(rollouts), chunk):
            batch = _batch(policy, parts[start : start + chunk])
            ref[start] = _sum_rows(policy.reference_logprobs(batch, temperature), batch, width)
    totals = {"loss": 0.0, "kl": 0.0, "entropy": 0.0, "grad_norm": 0.0, "value": 0.0}
    epochs = config.ppo_epochs
    params = [p for p in policy.model.parameters() if p.requires_grad]
    policy.model.train()
    for _ in range(epochs):
        policy.optimizer.zero_grad(set_to_none=True)
        for start in range(0, len(rollouts), chunk):
            batch = _batch(policy, parts[start : start + chunk])
            with policy.compute():
                logp = token_logprobs(policy.model, batch, temperature=temperature)[0]
            logp = _sum_rows(logp, batch, width)
            loss, stats = exact_choice_loss(
                logp,
                ref.get(start),
                rewards[start : start + chunk],
                beta,
                config.scale_std,
                config.center_rewards,
            )
            (loss / total).backward()
            totals["loss"] += loss.item() / total / epochs
            for key in ("kl", "entropy", "value"):
                totals[key] += float(stats[key].sum()) / total / epochs
        ranks.sum_gradients(params)
        limit = config.grad_clip if config.grad_clip > 0 else float("inf")
        totals["grad_norm"] += float(torch.nn.utils.clip_grad_norm_(params, limit)) / epochs
        policy.optimizer.step()
    policy.model.eval()
    for key in ("loss", "kl", "entropy", "value"):
        totals[key] = ranks.total(totals[key])
    totals["trained_sequences"] = total
    return totals


def _batch(policy: Any, parts: list[tuple[list[list[int]], ...]]) -> TokenBatch:
    ids = [row for rows, _, _ in parts for row in rows]
    masks = [m for _, ms, _ in parts for m in ms]
    allowed = [a for _, _, al in parts for a in al]
    return TokenBatch.from_lists(ids, masks, policy.pad_id, allowed)


def _sum_rows(logp: torch.Tensor, batch: TokenBatch, width: int) -> torch.Tensor:
    """Each row's log-prob of its whole text (the sum over its trained tokens), as [N, M]."""
    return (logp * batch.mask).sum(-1).view(-1, width)
