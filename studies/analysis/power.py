"""Power analysis of a study: participants per arm for a target effect, under Holm.

statsmodels' ``TTestIndPower`` solves the two-sided, equal-n two-sample t-test,
the same figure as R's ``pwr::pwr.t.test(d, sig.level, power, type = "two.sample")``
(g = 0.5, alpha = 0.05, power = 0.8 gives n = 63.77, so 64 per arm). The test of the
study is Welch's, which with equal n and equal variances is this t-test.

Holm tests its smallest p-value at alpha / m, so a study that must find its first
effect plans at that worst case: alpha_per_test = alpha / m. The target effect is
Hedges' g, taken as Cohen's d here (they differ by under 1% at the sizes planned).
Nothing here knows about Django.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from math import comb

from statsmodels.stats.power import TTestIndPower


@dataclass(frozen=True)
class Power:
    """The participants per arm a study needs, and what it was asked for."""

    effect: float  # Hedges' g to detect
    alpha: float  # the study's alpha, before Holm
    family: int  # m, the tests in the Holm family
    power: float  # chance of detecting the effect at the first Holm step
    alpha_per_test: float  # alpha / m
    n_per_arm: int  # rounded up
    n_exact: float  # what the solver found, before rounding

    def to_dict(self) -> dict:
        """The answer first: n_per_arm and alpha_per_test, then what was asked."""
        found = asdict(self)
        return {k: found[k] for k in ("n_per_arm", "alpha_per_test")} | found


class PowerError(ValueError):
    """Inputs a power analysis cannot use; the message says which and why."""


def problems(effect: float, alpha: float, family: int, power: float) -> list[str]:
    found = []
    if not (isinstance(effect, int | float) and math.isfinite(effect) and effect > 0):
        found.append(f"effect (Hedges' g) must be a number above 0, not {effect!r}")
    if not (isinstance(alpha, int | float) and 0 < alpha < 1):
        found.append(f"alpha must lie strictly between 0 and 1, not {alpha!r}")
    if not (isinstance(family, int) and not isinstance(family, bool) and family >= 1):
        found.append(
            f"family (tests in the Holm family) must be a whole number >= 1, not {family!r}"
        )
    if not (isinstance(power, int | float) and 0 < power < 1):
        found.append(f"power must lie strictly between 0 and 1, not {power!r}")
    return found


def n_per_arm(effect: float, alpha: float, family: int = 1, power: float = 0.8) -> Power:
    """Participants per arm for a two-sided Welch test of ``effect`` at alpha / family."""
    found = problems(effect, alpha, family, power)
    if found:
        raise PowerError("; ".join(found))
    alpha_per_test = alpha / family
    exact = TTestIndPower().solve_power(
        effect_size=effect, alpha=alpha_per_test, power=power, ratio=1.0, alternative="two-sided"
    )
    exact = float(exact)
    # At least 2 per arm: a t-test needs a variance in each.
    return Power(effect, alpha, family, power, alpha_per_test, max(2, math.ceil(exact)), exact)


def power_at(effect: float, alpha_per_test: float, n: int) -> float:
    """The power a study with n per arm has at alpha_per_test (two-sided, equal n)."""
    return float(
        TTestIndPower().power(
            effect_size=effect, nobs1=n, alpha=alpha_per_test, ratio=1.0, alternative="two-sided"
        )
    )


def family_size(arms: int, pairs: str, family: str, measures: int) -> int:
    """Tests in one Holm family as the report forms them: every arm against the control
    (arms - 1) or all pairs (arms choose 2), per measure, or over all measures ("study")."""
    per_measure = comb(arms, 2) if pairs == "all" else max(arms - 1, 0)
    return max(1, per_measure * (measures if family == "study" else 1))
