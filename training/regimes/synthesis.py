"""COLLAPSE-AWARE's anti-collapse synthesis ([synthesis], training/config_schema.py SynthesisSpec):
simulator supplies that play a share of each step's tasks beside the regime's own simulator.

    interpolate          frozen variants between two sources' settings, at
                         lambda_i = i / (variants + 1), i = 1..variants:
                             temperature = (1 - lambda) T_from + lambda T_to
                             top_p       = (1 - lambda) p_from + lambda p_to   (endpoint only)
                         and the prompt variant mixed in: round(lambda G) of a group's G
                         rollouts carry to_persona, the others from_persona. All on the training
                         simulator's weights (config.synthesis_base).
    verbalized_missing   the training simulator as Verbalized Sampling, its prompt showing the
                         reference's turns nearest the clusters the population covers least:
                             missing = the n support clusters with the largest r_k - q_k > 0
                         r the reference's cluster shares, q the population's on the probe set
                         at the last measured step (training/measures/profiles.py)
    adversarial          a co-trained simulator rewarded s_i = 1 - r_i (sim_rewards.py
                         "adversarial"): one more CoTrain (regime.py) on its own LoRA, its own
                         member name and checkpoint folder, learning from its own groups

Which tasks: with share s, the step's task i (run position p = (step - 1) B + i) is a synthesis
task when floor((p + 1) s) > floor(p s), so over the run exactly the share s of tasks, evenly
spaced, and the same whichever rank plays the task; the synthesis tasks cycle through the
supplies on (and interpolate's through its variants). A synthesis task's whole group meets one
supply, so GRPO compares rollouts against one user and the adversary learns from whole groups.
With s = 0 the regime's own simulator is handed over untouched; at s > 0 its tasks are seeded as
before, so the tasks it plays are the ones it would have played.

The supplies are mixed in front of the regime's own class (`synthesized`, built by make_regime),
so a run without [synthesis] runs the regime's own code alone. The mixed-in class reads
`regime.synthesis_share` at every step: the breaker raises it at run time, and it is saved with
each checkpoint. `rediversify()` plays synthesis.rediversify_steps steps at share 1.0, then puts
the share back where it was (the supplies' own state is kept: the adversary's weights are
training state, and Verbalized Sampling is told the missing clusters afresh every step).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agents.domains.episode import USER
from agents.simulators.spec import SimulatorKind, SimulatorSpec
from training.config_schema import RunConfig
from training.regimes.regime import CoTrain, ModelCache, frozen_simulator
from training.rl.distributed import Ranks
from training.rollouts.rollout import Rollout

PREFIX = "synthesis/"
INTERPOLATE, MISSING, ADVERSARIAL = (
    f"{PREFIX}{n}" for n in ("interpolate", "verbalized_missing", "adversarial")
)


def is_synthesis(member: str) -> bool:
    """Whether a rollout's member is a synthesis supply."""
    return member.startswith(PREFIX)


def synthesis_ordinal(share: float, step: int, batch_tasks: int, index: int) -> int | None:
    """The run's count of synthesis tasks before the step's task `index`, if it is one (the
    module's docstring); None: the regime's own simulator plays it."""
    if share <= 0:
        return None
    p = (step - 1) * batch_tasks + index
    # the small slack keeps a share like 0.1 from losing a task to 0.1 * 10 = 0.9999...
    before, after = math.floor(p * share + 1e-9), math.floor((p + 1) * share + 1e-9)
    return before if after > before else None


def lerp(a: float, b: float, lam: float) -> float:
    """(1 - lambda) a + lambda b; exactly a when a == b (an in-process simulator's top_p must
    stay exactly 1.0, which (1 - lambda) + lambda need not give in floating point)."""
    return a if a == b else (1 - lam) * a + lam * b


def _persona(*parts: str) -> str:
    return "\n\n".join(p for p in parts if p)


# -- interpolate ---------------------------------------------------------------------------------


def interpolated_specs(config: RunConfig) -> list[tuple[float, SimulatorSpec, SimulatorSpec]]:
    """(lambda, the variant with from_persona, with to_persona) for each variant."""
    syn, base = config.synthesis, config.synthesis_base()
    out = []
    for i in range(1, syn.variants + 1):
        lam = i / (syn.variants + 1)
        common = {
            "temperature": lerp(syn.from_temperature, syn.to_temperature, lam),
            "top_p": lerp(syn.from_top_p, syn.to_top_p, lam),
        }
        a, b = (
            dataclasses.replace(
                base, name=f"interpolate-{i}", persona=_persona(base.persona, p), **common
            )
            for p in (syn.from_persona, syn.to_persona)
        )
        out.append((lam, a, b))
    return out


class Interpolated:
    """The interpolation supply as a Speaker: `choose(ordinal)` picks the variant of a
    synthesis task; the group's rollouts at positions j < round(lambda G) meet its second
    source's prompt variant, the others its first's."""

    role = USER

    def __init__(self, config: RunConfig, models: ModelCache):
        self.group_size = config.group_size
        self.variants = []
        for lam, a, b in interpolated_specs(config):
            first = frozen_simulator(a, models, config.seed)
            second = frozen_simulator(b, models, config.seed) if b != a else first
            self.variants.append((lam, first, second))
        self.variant = 0
        self.rng = _Cascade(
            {f"{i}-{j}": u for i, v in enumerate(self.variants) for j, u in enumerate(v[1:])}
        )

    def choose(self, ordinal: int) -> None:
        self.variant = ordinal % len(self.variants)

    def speakers(self) -> Iterator[Any]:
        """Every variant's speakers (the behaviour profiles probe each)."""
        for _, first, second in self.variants:
            yield first
            if second is not first:
                yield second

    def respond(self, domain: Any, rollouts: list[Rollout]) -> None:
        lam, first, second = self.variants[self.variant]
        cut = round(lam * self.group_size)
        to = [r for r in rollouts if r.index % self.group_size < cut]
        fro = [r for r in rollouts if r.index % self.group_size >= cut]
        for speaker, group in ((first, fro), (second, to)):
            if group:
                speaker.respond(domain, group)


# -- verbalized_missing --------------------------------------------------------------------------


def missing_clusters(
    reference: Sequence[float], population: Sequence[float] | None, n: int
) -> list[int]:
    """The n clusters the people (the reference) occupy and the population covers least:
    largest deficit r_k - q_k first, only deficits above 0 (q unknown before the first
    measured step: all 0, so the reference's largest clusters first)."""
    q = population or [0.0] * len(reference)
    deficit = [(r - x, -k) for k, (r, x) in enumerate(zip(reference, q, strict=True)) if r > 0]
    return [-k for d, k in sorted(deficit, reverse=True) if d > 0][:n]


def missing_note(exemplars: list[list[str]]) -> str:
    """What the Verbalized Sampling simulator is told: how real people in its place also
    behave, one line per turn (the clusters' nearest reference turns)."""
    lines = "\n".join(f'- "{t}"' for group in exemplars for t in group)
    return (
        "Real people in your place also reply in ways you have not shown yet. Make some of your"
        f" replies behave like these things real people said:\n{lines}"
    )


class VerbalizedMissing:
    """The training simulator as Verbalized Sampling, told the missing clusters by `tell`."""

    role = USER

    def __init__(self, config: RunConfig, models: ModelCache):
        base = config.synthesis_base()
        self.spec = dataclasses.replace(
            base, name="verbalized_missing", kind=SimulatorKind.VERBALIZED
        )
        self.user = frozen_simulator(self.spec, models, config.seed)
        self.told: list[int] = []

    @property
    def rng(self) -> random.Random:
        return self.user.rng

    def tell(self, clusters: list[int], exemplars: list[list[str]]) -> None:
        self.told = list(clusters)
        note = missing_note([exemplars[k] for k in clusters]) if clusters else ""
        self.user.spec = dataclasses.replace(self.spec, persona=_persona(self.spec.persona, note))
        if hasattr(self.user, "_simulator"):  # an endpoint simulator builds its prompt once
            self.user._simulator = None

    def speakers(self) -> Iterator[Any]:
        yield self.user

    def respond(self, domain: Any, rollouts: list[Rollout]) -> None:
        self.user.respond(domain, rollouts)


# -- adversarial ---------------------------------------------------------------------------------


def adversary(config: RunConfig, run_dir: Path, models: ModelCache, ranks: Ranks | None) -> CoTrain:
    """The adversarial supply: the co-training path (CoTrain) on the training simulator's model,
    plain and in this process, rewarded 1 - r."""
    base = config.synthesis_base()
    model = base.model if (not base.endpoint or config.trains_simulator) else ""
    spec = SimulatorSpec(
        name="adversarial",
        model=model,
        temperature=base.temperature,
        max_new_tokens=base.max_new_tokens,
    )
    return CoTrain(
        config,
        run_dir,
        models,
        ranks,
        spec=spec,
        reward_mode="adversarial",
        member=ADVERSARIAL,
        saved_as="synthesis_adversary",
    )


class _Adversarial:
    """The adversary's speaker, as a supply."""

    role = USER

    def __init__(self, regime: CoTrain):
        self.regime = regime

    @property
    def rng(self) -> random.Random:
        return self.regime.user.rng

    def speakers(self) -> Iterator[Any]:
        yield self.regime.user

    def respond(self, domain: Any, rollouts: list[Rollout]) -> None:
        self.regime.user.respond(domain, rollouts)


# -- the supplies together -----------------------------------------------------------------------


class _Cascade(random.Random):
    """One generator whose seeding seeds every named speaker's own from the same text."""

    def __init__(self, speakers: dict[str, Any]):
        super().__init__(0)  # before the speakers are known: their generators are left alone
        self.speakers = speakers

    def seed(self, a: Any = None, version: int = 2) -> None:
        super().seed(a, version)
        for name, speaker in getattr(self, "speakers", {}).items():
            if isinstance(getattr(speaker, "rng", None), random.Random):
                speaker.rng.seed(f"{a}-{name}")


class Synthesis:
    """The run's supplies (those [synthesis] turns on), by member name."""

    def __init__(
        self, config: RunConfig, run_dir: Path, models: ModelCache, ranks: Ranks | None = None
    ):
        self.config = config
        syn = config.synthesis
        self.supplies: dict[str, Any] = {}
        self.adversary: CoTrain | None = None
        if syn.interpolate:
            self.supplies[INTERPOLATE] = Interpolated(config, models)
        if syn.verbalized_missing:
            self.supplies[MISSING] = VerbalizedMissing(config, models)
        if syn.adversarial:
            self.adversary = adversary(config, run_dir, models, ranks)
            self.supplies[ADVERSARIAL] = _Adversarial(self.adversary)
        self.names = list(self.supplies)
        self.exemplars: list[list[str]] | None = None
        self.rediversifying = 0  # steps left at share 1.0
        self.share_before = 0.0
        self.measured: list[float] | None = None  # the population's cluster shares, last step

    # what the regime's step asks of it

    def step_share(self, regime: Any) -> float:
        """The share this step plays (regime.synthesis_share, read now); a rediversifying
        countdown ends here, putting the share back once its last step is handed out."""
        share = regime.synthesis_share
        if self.rediversifying:
            self.rediversifying -= 1
            if not self.rediversifying:
                regime.synthesis_share = self.share_before
        return share

    def supply_of(self, ordinal: int) -> str:
        name = self.names[ordinal % len(self.names)]
        if name == INTERPOLATE:
            self.supplies[name].choose(ordinal // len(self.names))
        return name

    def seed(self, text: str) -> None:
        _Cascade(self.supplies).seed(text)

    def probed(self) -> Iterator[tuple[str, Any]]:
        for name, supply in self.supplies.items():
            for speaker in supply.speakers():
                yield name, speaker

    def observe(self, profiles: Any) -> None:
        """Tell Verbalized Sampling the clusters the population covered least at the step just
        measured (before the first: the reference's largest)."""
        if MISSING not in self.supplies or profiles is None or profiles.space is None:
            return
        space = profiles.space
        if self.exemplars is None:
            # load_or_fit (training/measures/behaviour_space.py) gives a run's space its
            # exemplars, a space saved before they were kept included
            self.exemplars = space.exemplars
        self.measured = profiles.population_shares.get("clusters/probe", self.measured)
        syn = self.config.synthesis
        told = missing_clusters(space.reference_shares, self.measured, syn.missing_clusters)
        self.supplies[MISSING].tell(told, [e[: syn.exemplars] for e in self.exemplars])

    def learn(self, step: int, rollouts: list[Rollout], share: float) -> dict[str, float]:
        """The adversary's step on its own groups; the step's synthesis figures."""
        out: dict[str, float] = {"synthesis/share_set": share}
        if self.adversary is not None:
            # its own groups alone: CoTrain.learn sizes a group from the rollouts it is given
            mine = [r for r in rollouts if r.member == ADVERSARIAL]
            stats = self.adversary.learn(step, mine)
            out.update({f"{ADVERSARIAL}/{k.removeprefix('sim/')}": v for k, v in stats.items()})
        if MISSING in self.supplies:
            out[f"{MISSING}/told"] = float(len(self.supplies[MISSING].told))
        for name in self.names:
            mine = [r.reward for r in rollouts if r.member == name]
            if mine:
                out[f"{name}/reward"] = sum(mine) / len(mine)
        return out

    def state(self, regime: Any) -> dict[str, Any]:
        return {
            "synthesis_share": regime.synthesis_share,
            "rediversifying": self.rediversifying,
            "share_before": self.share_before,
            "measured": self.measured,
        }

    def load(self, regime: Any, state: dict[str, Any]) -> None:
        if not state:  # a checkpoint from before [synthesis] was on: the config's share
            return
        regime.synthesis_share = state["synthesis_share"]
        self.rediversifying, self.share_before = state["rediversifying"], state["share_before"]
        self.measured = state["measured"]

    def rediversify(self, regime: Any) -> None:
        if not self.rediversifying:  # a second call while under way keeps the first's share
            self.share_before = regime.synthesis_share
        regime.synthesis_share = 1.0
        self.rediversifying = self.config.synthesis.rediversify_steps


class SynthesisUser:
    """A step's user: the regime's own, except on the step's synthesis tasks, whose rollouts a
    supply plays (each recording the supply as its member)."""

    role = USER

    def __init__(self, synthesis: Synthesis, user: Any, step: int, share: float):
        self.synthesis, self.user, self.step, self.share = synthesis, user, step, share
        self.supply: str | None = None
        own = {"": user} if isinstance(getattr(user, "rng", None), random.Random) else {}
        self.rng = _Reseeding(own, synthesis.supplies)

    def begin_task(self, index: int) -> None:
        """The step's task number `index` starts: which supply, if any, plays it."""
        ordinal = synthesis_ordinal(self.share, self.step, self.synthesis.config.batch_tasks, index)
        self.supply = None if ordinal is None else self.synthesis.supply_of(ordinal)
        if hasattr(self.user, "begin_task"):
            self.user.begin_task(index)

    def respond(self, domain: Any, rollouts: list[Rollout]) -> None:
        if self.supply is None:
            self.user.respond(domain, rollouts)
            return
        for r in rollouts:
            r.member = self.supply
        self.synthesis.supplies[self.supply].respond(domain, rollouts)


class _Reseeding(random.Random):
    """The trainer seeds a task's user generator: the regime's own user is seeded with the very
    text it would have been (its tasks play as without synthesis), each supply from it."""

    def __init__(self, own: dict[str, Any], supplies: dict[str, Any]):
        super().__init__(0)  # before the speakers are known: their generators are left alone
        self.own, self.supplies = own, supplies

    def seed(self, a: Any = None, version: int = 2) -> None:
        super().seed(a, version)
        for user in getattr(self, "own", {}).values():
            user.rng.seed(a, version)
        if hasattr(self, "supplies"):
            _Cascade(self.supplies).seed(f"{a}-synthesis")


class SynthesisMixin:
    """Mixed in front of a regime's class (`synthesized`): the supplies beside its simulator."""

    synthesis: Synthesis

    @contextmanager
    def simulator(self, step: int) -> Iterator[Any]:
        with super().simulator(step) as user:
            share = self.synthesis.step_share(self)
            if share <= 0:
                yield user
                return
            self.synthesis.seed(f"{self.config.seed}-{step}-synthesis")
            self._share = share
            yield SynthesisUser(self.synthesis, user, step, share)

    def behaviour_simulators(self) -> Iterator[tuple[str, Any]]:
        yield from super().behaviour_simulators()
        if self.synthesis_share > 0:  # the population the agent meets includes them now
            yield from self.synthesis.probed()

    def pooled_name(self, member: str) -> str:
        return member if is_synthesis(member) else super().pooled_name(member)

    def learn(self, step: int, rollouts: list[Rollout]) -> dict[str, Any]:
        own = [r for r in rollouts if not is_synthesis(r.member)]
        supplied = [r for r in rollouts if is_synthesis(r.member)]
        stats = super().learn(step, own)
        stats.update(self.synthesis.learn(step, supplied, getattr(self, "_share", 0.0)))
        stats["synthesis/share"] = len(supplied) / len(rollouts) if rollouts else 0.0
        self._share = 0.0
        return stats

    def observe(self, profiles: Any) -> None:
        super().observe(profiles)
        self.synthesis.observe(profiles)

    def rediversify(self) -> str:
        self.synthesis.rediversify(self)  # first: it keeps the share as it was, to go back to
        done = super().rediversify()  # the regime's own (a co-trained simulator to its base)
        steps = self.config.synthesis.rediversify_steps
        return f"{done}; the synthesis share at 1.0 for {steps} steps"

    def save(self, folder: Path | None) -> dict[str, Any]:
        state = super().save(folder)
        state["synthesis"] = self.synthesis.state(self)
        if self.synthesis.adversary is not None:
            state.update(self.synthesis.adversary.save(folder))
        return state

    def load(self, folder: Path, state: dict[str, Any], step: int) -> None:
        super().load(folder, state, step)
        self.synthesis.load(self, state.get("synthesis", {}))
        adv = self.synthesis.adversary
        if adv is not None and (folder / adv.saved_as).is_dir():  # else: synthesis came on now
            adv.load(folder, state, step)


@functools.cache
def synthesized(cls: type) -> type:
    """`cls` with the synthesis supplies mixed in front (one class per regime class)."""
    return type(f"Synthesized{cls.__name__}", (SynthesisMixin, cls), {"__module__": __name__})
