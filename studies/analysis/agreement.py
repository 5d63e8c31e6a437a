"""Agreement between raters, and the rates and rankings an annotation study reports.

- Krippendorff's alpha through the `krippendorff` package (ordinal for Likert items), checked
  against the worked example of Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability"
  (nominal .743, ordinal .815, interval .849, ratio .797), with a bootstrap interval over
  conversations (resampling units, as Hayes and Krippendorff 2007 do; percentile interval).
- "Judged human" rates with the Clopper-Pearson (exact) binomial interval, R's
  ``binom.test(x, n)$conf.int``.
- Kendall's tau-b between two rankings of arms (scipy's default variant, R's
  ``cor(x, y, method = "kendall")``, which is tau-b when there are ties).

Nothing here knows about Django: ratings come in as (unit, rater, value) rows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import krippendorff
import numpy as np
from scipy import stats as scipy_stats

LEVELS = ("nominal", "ordinal", "interval", "ratio")


@dataclass(frozen=True)
class Agreement:
    """Krippendorff's alpha of one item, its bootstrap interval and what it was computed from."""

    alpha: float | None
    ci: tuple[float, float] | None
    level: str
    units: int  # conversations rated by at least two raters (the pairable ones)
    ratings: int  # every rating given, pairable or not
    note: str | None = None


def reliability_matrix(rows: Iterable[tuple[object, object, float | None]]) -> np.ndarray:
    """Raters x units, NaN where a rater did not rate a unit (the package's layout)."""
    rows = [(u, r, v) for u, r, v in rows if v is not None and not _is_nan(v)]
    units = sorted({u for u, _, _ in rows}, key=str)
    raters = sorted({r for _, r, _ in rows}, key=str)
    at_unit = {u: i for i, u in enumerate(units)}
    at_rater = {r: i for i, r in enumerate(raters)}
    matrix = np.full((len(raters), len(units)), np.nan)
    for unit, rater, value in rows:
        matrix[at_rater[rater], at_unit[unit]] = float(value)
    return matrix


def undefined_because(matrix: np.ndarray) -> str | None:
    """Why alpha says nothing about a raters x units matrix, in words; None when it does.

    Alpha compares the disagreement within units with the disagreement between all pairable
    values. With one pairable unit the two are the same values, so alpha is 0 whatever the
    raters did (one conversation rated twice once printed "0.000 [0.000, 0.000]"); with no
    variation at all both are 0 and alpha is 0/0."""
    pairable = np.sum(~np.isnan(matrix), axis=0) >= 2
    if pairable.sum() < 2:
        return (
            "undefined: needs at least two conversations each rated by two or more raters "
            f"(there {'is' if pairable.sum() == 1 else 'are'} {int(pairable.sum())})"
        )
    values = matrix[:, pairable]
    present = np.unique(values[~np.isnan(values)])
    if present.size < 2:
        return f"undefined: no variation among the ratings (every one is {present[0]:g})"
    return None


def alpha(matrix: np.ndarray, level: str = "ordinal", domain: Sequence[float] | None = None):
    """Krippendorff's alpha of a raters x units matrix; None when it is undefined
    (undefined_because says why)."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {', '.join(LEVELS)}, not {level!r}")
    if undefined_because(matrix) is not None:
        return None
    pairable = np.sum(~np.isnan(matrix), axis=0) >= 2
    values = matrix[:, pairable]
    kwargs = {"value_domain": list(domain)} if domain is not None else {}
    return float(krippendorff.alpha(reliability_data=values, level_of_measurement=level, **kwargs))


def agreement(
    rows: Iterable[tuple[object, object, float | None]],
    level: str = "ordinal",
    domain: Sequence[float] | None = None,
    boot: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
) -> Agreement:
    """Alpha of one item with a percentile bootstrap interval over units (conversations).

    `domain` is the item's whole scale (1..7 for a 7-point Likert item) so that an ordinal
    alpha counts the distances of values nobody chose; without it only observed values count.
    """
    matrix = reliability_matrix(rows)
    pairable = np.sum(~np.isnan(matrix), axis=0) >= 2
    units, ratings = int(pairable.sum()), int(np.sum(~np.isnan(matrix)))
    estimate = alpha(matrix, level, domain)
    if estimate is None:
        return Agreement(None, None, level, units, ratings, undefined_because(matrix))
    values = matrix[:, pairable]
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(boot):
        sample = values[:, rng.integers(0, values.shape[1], values.shape[1])]
        value = alpha(sample, level, domain)
        if value is not None:
            draws.append(value)
    ci = None
    if draws:
        tail = (1 - confidence) / 2 * 100
        low, high = np.percentile(draws, [tail, 100 - tail])
        ci = (float(low), float(high))
    return Agreement(estimate, ci, level, units, ratings)


@dataclass(frozen=True)
class Rate:
    """k of n, as a proportion with its exact (Clopper-Pearson) interval."""

    k: int
    n: int
    rate: float | None
    ci: tuple[float, float] | None


def binomial_rate(k: int, n: int, confidence: float = 0.95) -> Rate:
    """R's binom.test(k, n)$conf.int: the exact interval, [0, x] or [x, 1] at the ends."""
    if n < 0 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return Rate(k, n, None, None)
    interval = scipy_stats.binomtest(k, n).proportion_ci(confidence, method="exact")
    return Rate(k, n, k / n, (float(interval.low), float(interval.high)))


@dataclass(frozen=True)
class RankAgreement:
    tau: float | None
    p: float | None
    n: int


def kendall_tau_b(first: dict[str, float], second: dict[str, float]) -> RankAgreement:
    """Kendall's tau-b between two scores of the same arms (only arms both score count)."""
    arms = sorted(a for a in first if a in second)
    x = [first[a] for a in arms]
    y = [second[a] for a in arms]
    if len(arms) < 2 or len(set(x)) < 2 or len(set(y)) < 2:
        return RankAgreement(None, None, len(arms))
    result = scipy_stats.kendalltau(x, y, variant="b")
    return RankAgreement(float(result.statistic), float(result.pvalue), len(arms))


def _is_nan(value) -> bool:
    return isinstance(value, float) and math.isnan(value)
