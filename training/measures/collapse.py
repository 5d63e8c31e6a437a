"""Panel-independent measures of simulator collapse, per step (metrics.jsonl):

    agent/p_exploit           the agent's probability of the simulator's exploit: the asks that
                              the frozen base simulator rewards most (within EXPLOIT_TOLERANCE of
                              the best), computed exactly once at the start (exploit.json)
    agent/decision_entropy    entropy (nats) of the agent's distribution over its choices, at the
                              sampling temperature (exact on choice turns)
    sim/decision_entropy      entropy of the simulator's distribution over its decisions (for a
                              Verbalized Sampling simulator, of the distribution it wrote down)
    reward_var/total          variance of the step's rewards, and its split with two simulator
    reward_var/simulator      draws per agent message (r, r'): the simulator's part
    reward_var/agent          E[(r - r')^2] / 2 and the agent's part Cov(r, r'), which sum to the
                              total in expectation

These need the Domain's choice turns (agents/domains/base.py), so they are exact where the task
makes them exact (the P4G decision episode) and absent elsewhere. Note the two-draw split draws
the simulator's last choice again from the same distribution: for a Verbalized Sampling
simulator that is the same written list, so the part of its variance that comes from writing
the list is counted as the agent's.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from agents.domains.base import Domain, Scenario
from agents.domains.episode import AGENT, USER
from training.layout import EXPLOIT_FILE
from training.rollouts.rollout import Rollout

EXPLOIT_TOLERANCE = 0.02  # reward units: asks this close to the best count as the exploit


def user_decisions(
    domain: Domain, tasks: list[Scenario], user: Any, max_tasks: int = 8
) -> dict[str, list[Any]] | None:
    """For an episode the agent opens with a choice and the user answers with one: per opening
    ask, one (Decision, reward of each of its choices) per task, for up to `max_tasks` tasks.
    None for any other kind of episode."""
    if domain.first_speaker != AGENT or not tasks:
        return None
    asks = domain.agent_choices(tasks[0], [])
    if not asks:
        return None
    found: dict[str, list[Any]] = {ask: [] for ask in asks}
    for task in tasks[:max_tasks]:
        rollouts = []
        for ask in asks:
            rollout = Rollout.begin(domain, task)
            rollout.conversation.append({"role": "assistant", "content": ask})
            rollout.max_turns = domain.max_turns
            rollouts.append(rollout)
        user.respond(domain, rollouts)
        for ask, rollout in zip(asks, rollouts, strict=True):
            decision = rollout.decision(USER)
            if decision is None:
                return None  # the user's answer is not a choice turn: nothing exact to say
            base = rollout.conversation[:-1]
            rewards = [
                domain.score([*base, {"role": "user", "content": text}], rollout.state).reward
                for text in decision.texts
            ]
            found[ask].append((decision, rewards))
    return found


def simulator_exploit(
    domain: Domain, tasks: list[Scenario], user: Any, max_tasks: int = 8
) -> dict[str, Any] | None:
    """Each opening ask's exact expected reward against the frozen simulator `user` (a Speaker
    that records its Decisions: LocalUser, ScriptedUser), averaged over up to `max_tasks`
    training tasks, and the exploit set. None where `user_decisions` is."""
    found = user_decisions(domain, tasks, user, max_tasks)
    if found is None:
        return None
    means = {
        ask: statistics.fmean(
            sum(p * r for p, r in zip(d.probs, rewards, strict=True)) for d, rewards in pairs
        )
        for ask, pairs in found.items()
    }
    best = max(means.values())
    return {
        "tasks": [t.id for t in tasks[:max_tasks]],
        "expected_reward": means,
        "exploit": [ask for ask, value in means.items() if value >= best - EXPLOIT_TOLERANCE],
        "tolerance": EXPLOIT_TOLERANCE,
    }


def mixture_exploit(found: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The exploit of an even mixture of simulators (an Ensemble, whose rotation gives each
    member the same share): each ask's expected reward averaged over `found`, one
    simulator_exploit per member. None when any member's is."""
    if not found or any(f is None for f in found):
        return None
    if len(found) == 1:
        return found[0]
    means = {
        ask: statistics.fmean(f["expected_reward"][ask] for f in found)
        for ask in found[0]["expected_reward"]
    }
    best = max(means.values())
    return {
        "tasks": found[0]["tasks"],
        "expected_reward": means,
        "exploit": [ask for ask, value in means.items() if value >= best - EXPLOIT_TOLERANCE],
        "tolerance": EXPLOIT_TOLERANCE,
        "members": [f["expected_reward"] for f in found],
    }


def load_or_find_exploit(run_dir: Path, find: Any) -> dict[str, Any] | None:
    """exploit.json of the run, computed by `find()` the first time (a resumed run reuses it)."""
    path = Path(run_dir) / EXPLOIT_FILE
    if path.is_file():
        return json.loads(path.read_text())
    found = find()
    if found is not None:
        path.write_text(json.dumps(found, indent=2))
    return found


def step_metrics(rollouts: list[Rollout], exploit: dict[str, Any] | None) -> dict[str, float]:
    row: dict[str, float] = {}
    asks = [d for r in rollouts if (d := _first(r, AGENT))]
    if asks:
        row["agent/decision_entropy"] = statistics.fmean(d.entropy for d in asks)
        if exploit:
            chosen = set(exploit["exploit"])
            row["agent/p_exploit"] = statistics.fmean(
                sum(p for t, p in zip(d.texts, d.probs, strict=True) if t in chosen) for d in asks
            )
            row["agent/exploit_taken"] = statistics.fmean(d.texts[d.index] in chosen for d in asks)
    decisions = [d for r in rollouts if (d := r.decision(USER))]
    if decisions:
        row["sim/decision_entropy"] = statistics.fmean(d.entropy for d in decisions)
    row.update(
        variance_split(
            [(r.reward, r.redraw_reward) for r in rollouts if r.redraw_reward is not None]
        )
    )
    return row


def variance_split(pairs: list[tuple[float, float]]) -> dict[str, float]:
    """Var(r) = Var_agent(E[r | message]) + E[Var_simulator(r | message)], estimated from two
    simulator draws r, r' per agent message: the simulator's part E[(r - r')^2] / 2, the
    agent's Cov(r, r')."""
    if len(pairs) < 2:
        return {}
    first = [a for a, _ in pairs]
    second = [b for _, b in pairs]
    mean_a, mean_b = statistics.fmean(first), statistics.fmean(second)
    return {
        "reward_var/total": statistics.pvariance(first),
        "reward_var/simulator": statistics.fmean((a - b) ** 2 for a, b in pairs) / 2,
        "reward_var/agent": statistics.fmean((a - mean_a) * (b - mean_b) for a, b in pairs),
    }


def _first(rollout: Rollout, role: str):
    return next((d for d in rollout.decisions if d.role == role), None)
