"""Welch, descriptives and Hedges' g against R's published values and R's formulas.

R is not installed here, so the R reference is R's own formulas (t.test's
Welch branch, qt/pt) written out in mpmath at 50 digits, independent of scipy.
"""

import math

import mpmath as mp
import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from studies.analysis import Settings, build_report
from studies.analysis.stats import describe, hedges_g, welch

SLEEP_1 = [0.7, -1.6, -0.2, -1.2, -0.1, 3.4, 3.7, 0.8, 0.0, 2.0]
SLEEP_2 = [1.9, 0.8, 1.1, 0.1, -0.1, 4.4, 5.5, 1.6, 4.6, 3.4]

mp.mp.dps = 50


def r_pt(t, df):
    """R's pt(t, df): 1 - I_x(df/2, 1/2) / 2 for t > 0, x = df / (df + t^2)."""
    t, df = mp.mpf(t), mp.mpf(df)
    tail = mp.betainc(df / 2, mp.mpf(1) / 2, 0, df / (df + t * t), regularized=True) / 2
    return tail if t < 0 else 1 - tail


def r_qt(prob, df):
    """R's qt(prob, df) for prob > 1/2, by bracketed root finding on r_pt."""
    # pt(1, df) < 0.84 and pt(1000, df) > 0.999 for every df >= 1: a sign change to bracket.
    return mp.findroot(lambda t: r_pt(t, df) - prob, (1, 1000), solver="illinois", tol=1e-40)


def r_welch(x, y, level=0.95):
    """t.test(x, y, var.equal = FALSE): t, df, p, diff and CI, all from R's formulas."""
    x, y = [mp.mpf(v) for v in x], [mp.mpf(v) for v in y]
    mx, my = mp.fsum(x) / len(x), mp.fsum(y) / len(y)
    vx = mp.fsum((v - mx) ** 2 for v in x) / (len(x) - 1)
    vy = mp.fsum((v - my) ** 2 for v in y) / (len(y) - 1)
    sx, sy = vx / len(x), vy / len(y)
    se = mp.sqrt(sx + sy)
    df = (sx + sy) ** 2 / (sx**2 / (len(x) - 1) + sy**2 / (len(y) - 1))
    t = (mx - my) / se
    half = r_qt((1 + mp.mpf(level)) / 2, df) * se
    return {
        "t": t,
        "df": df,
        "p": 2 * r_pt(-abs(t), df),
        "diff": mx - my,
        "diff_ci": (mx - my - half, mx - my + half),
    }


def r_mean_ci(x, level=0.95):
    x = [mp.mpf(v) for v in x]
    m = mp.fsum(x) / len(x)
    sd = mp.sqrt(mp.fsum((v - m) ** 2 for v in x) / (len(x) - 1))
    half = r_qt((1 + mp.mpf(level)) / 2, len(x) - 1) * sd / mp.sqrt(len(x))
    return m, sd, (m - half, m + half)


def close(got, ref, tol=1e-8):
    """Agreement to 1e-8, relative for large numbers (R prints 7 significant digits)."""
    return abs(got - float(ref)) <= tol * max(1.0, abs(float(ref)))


def _datasets():
    rng = np.random.default_rng(20240611)
    rounded = lambda a: np.round(a, 2).tolist()  # noqa: E731
    return {
        "sleep": (SLEEP_1, SLEEP_2),
        "unequal n 5 vs 40": (rounded(rng.normal(3, 1, 5)), rounded(rng.normal(3.6, 1.4, 40))),
        "variance ratio 1e-6": (rounded(rng.normal(10, 0.05, 12)), rounded(rng.normal(4, 50, 9))),
        "variance ratio 1e6": (rounded(rng.normal(4, 50, 7)), rounded(rng.normal(10, 0.05, 30))),
        "n 2 vs 3": ([1.5, 2.25], [3.0, 4.5, 3.75]),
        "likert ties": (rng.integers(1, 8, 30).tolist(), rng.integers(2, 8, 25).tolist()),
        "tiny p": (rounded(rng.normal(0, 1, 50)), rounded(rng.normal(3, 1, 60))),
    }


DATASETS = _datasets()


def test_sleep_matches_r_published_values():
    test = welch(SLEEP_1, SLEEP_2)
    assert round(test.t, 4) == -1.8608
    assert round(test.df, 3) == 17.776
    assert round(test.p, 5) == 0.07939
    assert round(test.diff_ci[0], 7) == -3.3654832
    assert round(test.diff_ci[1], 7) == 0.2054832
    assert test.diff == pytest.approx(0.75 - 2.33)


@pytest.mark.parametrize("name", DATASETS)
def test_report_comparison_matches_r_formulas(name):
    x, y = DATASETS[name]
    table = pd.DataFrame({"arm": ["x"] * len(x) + ["y"] * len(y), "score": x + y})
    report = build_report(table, Settings("arm", ("score",), control="y"))
    (comparison,) = report["comparisons"]
    ref = r_welch(x, y)
    for key in ("t", "df", "p", "diff"):
        assert close(comparison[key], ref[key]), (key, comparison[key], ref[key])
    for got, want in zip(comparison["diff_ci"], ref["diff_ci"], strict=True):
        assert close(got, want)
    if ref["p"] < 1e-6:  # small p also to 1e-8 relative, not just absolutely near 0
        assert abs(comparison["p"] / float(ref["p"]) - 1) < 1e-8
    assert comparison["note"] is None


@pytest.mark.parametrize("name", DATASETS)
def test_descriptives_match_r_formulas(name):
    for values in DATASETS[name]:
        summary = describe(np.array(values, float))
        mean, sd, ci = r_mean_ci(values)
        assert summary.n == len(values)
        assert close(summary.mean, mean) and close(summary.sd, sd)
        assert close(summary.ci[0], ci[0]) and close(summary.ci[1], ci[1])


@pytest.mark.parametrize("name", DATASETS)
def test_hedges_g_agrees_with_the_student_t_route(name):
    """d from the pooled (Student) t: d = t * sqrt(1/n1 + 1/n2); g = d * (1 - 3/(4N - 9))."""
    x, y = (np.array(v, float) for v in DATASETS[name])
    student = scipy_stats.ttest_ind(x, y, equal_var=True).statistic
    d = student * math.sqrt(1 / x.size + 1 / y.size)
    expected = d * (1 - 3 / (4 * (x.size + y.size) - 9))
    assert hedges_g(describe(x), describe(y)) == pytest.approx(expected, rel=1e-10)


def test_hedges_correction_is_close_to_the_exact_gamma_factor():
    """The documented J approximates Hedges' exact Gamma(m/2) / (sqrt(m/2) Gamma((m-1)/2))."""
    for n1, n2 in [(2, 2), (5, 7), (40, 40)]:
        m = n1 + n2 - 2
        exact = math.exp(math.lgamma(m / 2) - math.lgamma((m - 1) / 2)) / math.sqrt(m / 2)
        x = describe(np.arange(n1, dtype=float))
        y = describe(np.arange(n2, dtype=float) + 1)
        pooled = math.sqrt(((n1 - 1) * x.sd**2 + (n2 - 1) * y.sd**2) / m)
        assert hedges_g(x, y) / ((x.mean - y.mean) / pooled) == pytest.approx(exact, rel=0.02)


def test_welch_undefined_cases_are_nan_with_a_note():
    few = welch([1.0], [2.0, 3.0])
    assert math.isnan(few.t) and math.isnan(few.p) and "at least 2" in few.note
    assert few.diff == pytest.approx(-1.5)
    constant = welch([4.0, 4.0, 4.0], [5.0, 5.0])
    assert math.isnan(constant.t) and "zero variance" in constant.note
    assert constant.diff == pytest.approx(-1.0)
    one_constant = welch([4.0, 4.0, 4.0], [5.0, 6.0])
    assert math.isfinite(one_constant.t) and one_constant.note is None


def test_describe_small_samples():
    assert describe(np.array([])).n == 0 and describe(np.array([])).note == "no values"
    one = describe(np.array([3.0]))
    assert one.mean == 3.0 and math.isnan(one.sd) and "n < 2" in one.note
    flat = describe(np.array([2.0, 2.0, 2.0]))
    assert flat.sd == 0 and flat.ci == (2.0, 2.0)
