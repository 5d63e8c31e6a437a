"""The statistics of a study report: descriptives, Welch's t-test, Hedges' g, Holm.

scipy runs the t-tests and numpy the Holm correction (the same arithmetic, in the same
order, as statsmodels' ``multipletests(method="holm")``), so the numbers are the ones R
gives for ``t.test(x, y, var.equal = FALSE)`` and ``p.adjust(p, method = "holm")``.
Nothing here knows about arms or Django.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
from scipy import stats as scipy_stats

# R's t.test refuses data whose standard error is below this many machine
# epsilons of the means ("data are essentially constant"); we say the same.
CONSTANT_EPS = 10 * np.finfo(float).eps


@dataclass(frozen=True)
class Summary:
    """One sample: n, mean, SD (ddof=1), standard error and the t-based CI of the mean."""

    n: int
    mean: float
    sd: float
    se: float
    ci: tuple[float, float]
    note: str | None = None


@dataclass(frozen=True)
class Welch:
    """Welch's t-test of x against y; diff = mean(x) - mean(y), as in R."""

    t: float
    df: float
    p: float
    diff: float
    diff_ci: tuple[float, float]
    note: str | None = None


NAN_PAIR = (math.nan, math.nan)


def describe(values: np.ndarray, ci_level: float = 0.95) -> Summary:
    """n, mean, SD and CI: mean +- qt((1 + level) / 2, n - 1) * SD / sqrt(n)."""
    values = np.asarray(values, dtype=float)
    n = int(values.size)
    if n == 0:
        return Summary(0, math.nan, math.nan, math.nan, NAN_PAIR, "no values")
    mean = float(values.mean())
    if n < 2:
        return Summary(1, mean, math.nan, math.nan, NAN_PAIR, "n < 2: SD and CI undefined")
    sd = float(values.std(ddof=1))
    se = sd / math.sqrt(n)
    half = float(scipy_stats.t.ppf((1 + ci_level) / 2, n - 1)) * se
    return Summary(n, mean, sd, se, (mean - half, mean + half))


def welch(x: np.ndarray, y: np.ndarray, ci_level: float = 0.95) -> Welch:
    """Welch's two-sided t-test, the Welch-Satterthwaite df and the CI of the difference.

    t = (mx - my) / sqrt(vx/nx + vy/ny);
    df = (vx/nx + vy/ny)^2 / ((vx/nx)^2/(nx-1) + (vy/ny)^2/(ny-1)).
    Undefined cases come back as NaN with a note instead of an exception.
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    diff = float(x.mean() - y.mean()) if x.size and y.size else math.nan
    if x.size < 2 or y.size < 2:
        return Welch(
            math.nan, math.nan, math.nan, diff, NAN_PAIR, "needs at least 2 values per arm"
        )
    se = math.sqrt(x.var(ddof=1) / x.size + y.var(ddof=1) / y.size)
    if se < CONSTANT_EPS * max(abs(x.mean()), abs(y.mean())) or se == 0:
        return Welch(
            math.nan,
            math.nan,
            math.nan,
            diff,
            NAN_PAIR,
            "zero variance in both arms (data are essentially constant): t undefined",
        )
    with warnings.catch_warnings():
        # One arm answering all 7s is real data: its variance is exactly 0, not imprecise.
        warnings.filterwarnings("ignore", "Precision loss", RuntimeWarning)
        result = scipy_stats.ttest_ind(x, y, equal_var=False)
    ci = result.confidence_interval(ci_level)
    return Welch(
        float(result.statistic),
        float(result.df),
        float(result.pvalue),
        diff,
        (float(ci.low), float(ci.high)),
    )


def hedges_g(x: Summary, y: Summary) -> float:
    """Hedges' g of x against y: J * d, with Cohen's d on the pooled SD.

    s_pooled = sqrt(((nx-1) sx^2 + (ny-1) sy^2) / (nx + ny - 2)), d = (mx - my) / s_pooled,
    J = 1 - 3 / (4 (nx + ny) - 9)  (Hedges 1981's approximation of the exact gamma ratio).
    NaN when either n < 2 or the pooled SD is 0.
    """
    if x.n < 2 or y.n < 2:
        return math.nan
    dof = x.n + y.n - 2
    pooled = math.sqrt(((x.n - 1) * x.sd**2 + (y.n - 1) * y.sd**2) / dof)
    if pooled == 0:
        return math.nan
    correction = 1 - 3 / (4 * (x.n + y.n) - 9)
    return correction * (x.mean - y.mean) / pooled


def holm(pvalues) -> np.ndarray:
    """Holm-Bonferroni adjusted p-values, like R's p.adjust(p, "holm").

    The i-th smallest of n p-values times n - i + 1, a running maximum (the step-down),
    capped at 1: statsmodels' ``multipletests(p, method="holm")[1]`` operation for
    operation, without the ``gc.collect()`` it runs on every call (tens of ms each in a
    big process). Tied p-values get the same adjusted value whatever their order.
    NaN p-values stay NaN and are left out of the family (R drops NA before
    counting n), so an undefined test does not make the others stricter.
    """
    p = np.asarray(pvalues, dtype=float)
    adjusted = np.full(p.shape, math.nan)
    finite = np.isfinite(p)
    family = p[finite]
    order = np.argsort(family)
    stepped = np.maximum.accumulate(family[order] * np.arange(family.size, 0, -1))
    in_place = np.empty_like(stepped)
    in_place[order] = np.minimum(stepped, 1.0)
    adjusted[finite] = in_place
    return adjusted
