"""Behaviour profiles every step (metrics.jsonl): COLLAPSE-AWARE's MCI, SCD and BDI
(agents/behaviour/measures.py) of the simulators, in two forms, and PSOD at evaluation steps.

    probe    each simulator answers a FIXED probe set: the same first `probe_tasks` training
             tasks, the same agent openings (every opening ask where the Domain fixes them) and
             the same seeds every step. Only the simulator changes between steps, so this is
             the simulator's behaviour. The primary form.
    pooled   the step's training rollouts' user turns, as they were played. It also moves when
             the AGENT collapses (an unchanged persuadee asked for $2 only gives $2 only), so it
             is written beside the probe form, never instead of it.

Keys: behaviour/<space>/<form>/<measure>[/<simulator>], space one of
    clusters   the run's k-means clusters (estimates: with /lo and /hi, a bootstrap interval)
    acts       the P4G dialogue acts of the turns' sentences (estimates, with intervals)
    decision   the simulator's choice turn (P4G's decision): exact from its probabilities
measure one of mci/<simulator>, scd (the training population), bdi and bdi/<simulator> (against
a human reference), or, where the reference is not human (tau2: a named run's simulator
turns), coverage (covered clusters / K) and coverage_growth (the relative form: the change
since the step before, not a BDI). sim/decision_entropy_probe is sim/decision_entropy on the
probe set. psod/<name> = R(agent; <name>) - heldout/reward at evaluation steps, <name> each
training simulator the regime names (docs/training.md, "Behaviour profiles").
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from agents.behaviour import measures as m
from agents.domains.base import Domain, Message, Scenario, count_turns
from agents.domains.episode import AGENT, USER
from training.rollouts.rollout import Decision, Rollout

DEFAULT_OPENING = "Hello! How are you today?"


@dataclass(frozen=True)
class Probe:
    """One fixed prompt: a task, the conversation so far, and whether the user's reply is its
    last (its decision, where the Domain makes that a choice turn)."""

    task: Scenario
    conversation: tuple[Message, ...]
    final: bool


@dataclass
class Reply:
    text: str
    decision: Decision | None


def probe_set(
    domain: Domain, tasks: Sequence[Scenario], count: int, opening: str = ""
) -> list[Probe]:
    """The run's fixed probes: for each of the first `count` tasks, the user's first reply to
    every opening the Domain fixes (its agent_choices, else `opening`), and, where the Domain
    has a decision turn, the same prompts asked for the decision."""
    probes = []
    for task in tasks[:count]:
        start = Rollout.begin(domain, task).conversation
        if domain.first_speaker == AGENT and not start:
            asks = domain.agent_choices(task, []) or [opening or DEFAULT_OPENING]
            starts = [[{"role": "assistant", "content": ask}] for ask in asks]
        else:
            starts = [start]
        for conversation in starts:
            probes.append(Probe(task, tuple(conversation), final=False))
            # a decision asked for at the end too, unless the first reply already is one
            if not domain.user_choices(task, list(conversation), False) and domain.user_choices(
                task, list(conversation), True
            ):
                probes.append(Probe(task, tuple(conversation), final=True))
    return probes


def ask(domain: Domain, probes: Sequence[Probe], user: Any, samples: int, seed: str) -> list[Reply]:
    """`samples` replies of the simulator `user` to every probe. Seeded from `seed` alone (the
    same every step) and leaving the run's generators as they were, so probing changes none of
    the training's draws."""
    torch_state = torch.get_rng_state()
    rng = getattr(user, "rng", None)
    rng_state = rng.getstate() if isinstance(rng, random.Random) else None
    try:
        torch.manual_seed(random.Random(seed).getrandbits(63))
        if rng_state is not None:
            rng.seed(f"{seed}-user")
        rollouts = []
        for probe in probes:
            for _ in range(samples):
                r = Rollout.begin(domain, probe.task)
                r.conversation = [dict(x) for x in probe.conversation]
                turns = count_turns(r.conversation)
                # a final probe's reply is the user's last: its decision turn
                r.max_turns = turns + 1 if probe.final else max(domain.max_turns, turns + 3)
                r.index = len(rollouts)
                rollouts.append(r)
        user.respond(domain, rollouts)
    finally:
        torch.set_rng_state(torch_state)
        if rng_state is not None:
            rng.setstate(rng_state)
    return [Reply(_last_user_text(r.conversation), r.decision(USER)) for r in rollouts]


def _last_user_text(conversation: list[Message]) -> str:
    return next(
        (str(x.get("content") or "") for x in reversed(conversation) if x.get("role") == "user"), ""
    )


@dataclass
class Profiles:
    """What a run measures with: its space (None: the decision space alone), the settings,
    and the coverage each (space, form) had at the step before (for coverage_growth)."""

    space: Any  # BehaviourSpace | None
    support_share: float
    cover_share: float
    bootstrap: int
    seed: int
    human: bool  # the space's reference is people (BDI) or simulators (relative form)
    decision_reference: dict[str, float] | None = None  # people's shares over decision texts
    before: dict[str, set[int]] = field(default_factory=dict)
    # the training population's shares per "<space>/<form>" at the last step measured (what
    # the synthesis supplies steer by: training/regimes/synthesis.py)
    population_shares: dict[str, list[float]] = field(default_factory=dict)

    def row(
        self,
        step: int,
        probed: dict[str, list[Reply]],
        pooled: dict[str, list[Reply]],
        population: Iterable[str],
    ) -> dict[str, float]:
        """The step's behaviour measures. `probed` / `pooled`: replies per simulator name;
        `population`: the names that make the training population (its SCD and BDI)."""
        population = [n for n in population if n in probed or n in pooled]
        row: dict[str, float] = {}
        for form, replies in (("probe", probed), ("pooled", pooled)):
            names = [n for n in population if replies.get(n)]
            every = [n for n in replies if replies[n]]
            if not every:
                continue
            row.update(self._decisions(form, replies, every, names))
            if self.space is not None:
                texts = {
                    n: [r.text for r in replies[n] if r.decision is None and r.text] for n in every
                }
                labels = {n: self.space.assign(t) for n, t in texts.items()}
                row.update(
                    self._estimated(
                        "clusters", form, labels, names, self.space.k, self.space.reference_shares
                    )
                )
                if self.space.acts is not None:
                    acts = {n: self.space.label_acts(t) for n, t in texts.items()}
                    row.update(
                        self._estimated(
                            "acts",
                            form,
                            acts,
                            names,
                            len(self.space.acts["labels"]),
                            self.space.acts["reference_shares"],
                            acts=True,
                        )
                    )
        decisions = [r.decision for n in population for r in probed.get(n, []) if r.decision]
        if decisions:
            row["sim/decision_entropy_probe"] = statistics.fmean(d.entropy for d in decisions)
        return row

    def _estimated(
        self,
        space: str,
        form: str,
        labels: dict[str, list[int]],
        names: list[str],
        k: int,
        reference: list[float],
        acts: bool = False,
    ) -> dict[str, float]:
        """Measures from cluster labels: estimates, each with a bootstrap interval."""
        key = f"behaviour/{space}/{form}"
        out: dict[str, float] = {}

        def put(name: str, labels_: list[int], stat: Callable[[Sequence[int]], float]) -> None:
            out[name] = stat(labels_)
            lo, hi = m.bootstrap(labels_, stat, self.bootstrap, f"{self.seed}-{name}")
            out[f"{name}/lo"], out[f"{name}/hi"] = lo, hi

        for n, own in labels.items():
            if own:
                put(f"{key}/mci/{n}", own, lambda x: m.mci(m.shares(x, k)))
        pooled = [x for n in names for x in labels.get(n, [])]
        if not pooled:
            return out
        put(f"{key}/scd", pooled, lambda x: m.scd(m.shares(x, k)))
        self.population_shares[f"{space}/{form}"] = m.shares(pooled, k)
        if self.human or acts:  # the acts' reference is always the annotated people
            cover, least = self.cover_share, self.support_share
            bdi = lambda x: m.bdi(m.covered(m.shares(x, k), cover), reference, least)  # noqa: E731
            put(f"{key}/bdi", pooled, bdi)
            for n in names:
                if labels.get(n):
                    put(f"{key}/bdi/{n}", labels[n], bdi)
        else:  # no human reference: the relative form, labelled as such
            now = m.covered(m.shares(pooled, k), self.cover_share)
            out[f"{key}/coverage"] = len(now) / k
            if key in self.before:
                out[f"{key}/coverage_growth"] = m.coverage_growth(now, self.before[key], k)
            self.before[key] = now
        return out

    def _decisions(
        self, form: str, replies: dict[str, list[Reply]], every: list[str], names: list[str]
    ) -> dict[str, float]:
        """Measures of the choice turns: exact, from each decision's probabilities."""
        texts: list[str] = []
        for n in every:
            for r in replies[n]:
                if r.decision:
                    texts += [t for t in r.decision.texts if t not in texts]
        if not texts or len(texts) < 2:
            return {}
        key = f"behaviour/decision/{form}"
        exact: dict[str, list[float]] = {}
        for n in every:
            own = [_aligned(r.decision, texts) for r in replies[n] if r.decision]
            if own:
                exact[n] = m.mixture(own)
        out = {f"{key}/mci/{n}": m.mci(p) for n, p in exact.items()}
        population = [exact[n] for n in names if n in exact]
        if not population:
            return out
        q = m.mixture(population)
        out[f"{key}/scd"] = m.scd(q)
        reference = [(self.decision_reference or {}).get(t, 0.0) for t in texts]
        if m.support(reference, self.support_share):
            least, cover = self.support_share, self.cover_share
            out[f"{key}/bdi"] = m.bdi(m.covered(q, cover), reference, least)
            for n in names:
                if n in exact:
                    out[f"{key}/bdi/{n}"] = m.bdi(m.covered(exact[n], cover), reference, least)
        return out


def _aligned(decision: Decision, texts: list[str]) -> list[float]:
    """A decision's probabilities over `texts` (0 for a text it did not offer)."""
    by_text = dict(zip(decision.texts, decision.probs, strict=True))
    return [by_text.get(t, 0.0) for t in texts]


def rollout_replies(
    rollouts: Iterable[Rollout], name: Callable[[str], str]
) -> dict[str, list[Reply]]:
    """The step's user turns as replies, by the simulator that played them (`name` of a
    rollout's member): free-text turns, and each choice turn once with its probabilities."""
    found: dict[str, list[Reply]] = {}
    for r in rollouts:
        own = found.setdefault(name(r.member), [])
        decision = r.decision(USER)
        chosen = decision.texts[decision.index] if decision else None
        for x in r.conversation:
            text = str(x.get("content") or "").strip() if x.get("role") == "user" else ""
            if text and text != chosen:
                own.append(Reply(text, None))
        if decision:
            own.append(Reply(chosen or "", decision))
    return found


def psod_row(heldout_reward: float, rewards: dict[str, list[float]]) -> dict[str, float]:
    """psod/<name> for each named training simulator's rewards."""
    return {
        f"psod/{n}": m.psod(statistics.fmean(r), heldout_reward) for n, r in rewards.items() if r
    }
