"""Inter-rater agreement, judged-human rates and rank agreement (studies/analysis/agreement.py)."""

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from studies.analysis.agreement import (
    agreement,
    alpha,
    binomial_rate,
    kendall_tau_b,
    reliability_matrix,
)

# Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability", section C: four observers,
# twelve units, values 1-5, gaps where an observer did not code a unit (unit 12 has one value
# and is not pairable). Published: nominal .743, ordinal .815, interval .849, ratio .797.
N = None
WORKED = {
    "A": [1, 2, 3, 3, 2, 1, 4, 1, 2, N, N, N],
    "B": [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, N, 3],
    "C": [N, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, N],
    "D": [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, N],
}
PUBLISHED = {"nominal": 0.743, "ordinal": 0.815, "interval": 0.849, "ratio": 0.797}


def worked_rows():
    return [
        (f"u{unit:02d}", rater, value)
        for rater, values in WORKED.items()
        for unit, value in enumerate(values, 1)
    ]


@pytest.mark.parametrize("level", sorted(PUBLISHED))
def test_alpha_reproduces_the_published_worked_example(level):
    matrix = reliability_matrix(worked_rows())
    assert matrix.shape == (4, 12)
    assert round(alpha(matrix, level), 3) == PUBLISHED[level]


def test_the_bootstrap_interval_holds_the_estimate_and_repeats_with_its_seed():
    result = agreement(worked_rows(), "ordinal", boot=300, seed=7)
    assert result.units == 11 and result.ratings == 41  # unit 12 (one value) is not pairable
    low, high = result.ci
    assert low < result.alpha < high <= 1
    assert agreement(worked_rows(), "ordinal", boot=300, seed=7).ci == result.ci


def test_agreement_is_one_when_raters_agree_and_undefined_without_two_raters():
    same = [(u, r, v) for u, v in [("a", 1), ("b", 4), ("c", 7)] for r in ("x", "y", "z")]
    assert agreement(same, boot=50).alpha == pytest.approx(1.0)
    lonely = [("a", "x", 3), ("b", "y", 5)]
    result = agreement(lonely, boot=50)
    assert result.alpha is None and result.ci is None and result.note


def test_disagreement_lowers_alpha_below_chance_level():
    # raters who order conversations oppositely agree less than chance: alpha < 0
    rows = [(u, "x", v) for u, v in zip("abcdef", [1, 2, 3, 5, 6, 7], strict=True)]
    rows += [(u, "y", v) for u, v in zip("abcdef", [7, 6, 5, 3, 2, 1], strict=True)]
    assert agreement(rows, boot=50).alpha < 0


def clopper_pearson(k, n, confidence=0.95):
    """The exact interval from its definition (beta quantiles), independent of the code."""
    tail = (1 - confidence) / 2
    low = 0.0 if k == 0 else scipy_stats.beta.ppf(tail, k, n - k + 1)
    high = 1.0 if k == n else scipy_stats.beta.ppf(1 - tail, k + 1, n - k)
    return low, high


@pytest.mark.parametrize("k,n", [(0, 10), (3, 10), (7, 20), (20, 20), (1, 1), (48, 101)])
def test_judged_human_rate_has_the_exact_binomial_interval(k, n):
    rate = binomial_rate(k, n)
    assert rate.rate == pytest.approx(k / n)
    assert rate.ci == pytest.approx(clopper_pearson(k, n), abs=1e-9)


def test_a_rate_of_nothing_is_undefined_and_a_bad_count_is_refused():
    assert binomial_rate(0, 0).rate is None
    with pytest.raises(ValueError, match="0 <= k <= n"):
        binomial_rate(5, 3)


def test_kendall_tau_b_counts_ties_as_tau_b_does():
    # pairs: 4 concordant, none discordant, one tie in each ranking: 4 / sqrt(5 * 5)
    first = {"a": 1, "b": 2, "c": 2, "d": 3}
    second = {"a": 1, "b": 2, "c": 3, "d": 3, "only-here": 9}
    result = kendall_tau_b(first, second)
    assert result.n == 4 and result.tau == pytest.approx(0.8)
    reversed_ = {arm: -score for arm, score in first.items()}
    assert kendall_tau_b(first, reversed_).tau == pytest.approx(-1.0)
    assert kendall_tau_b({"a": 1}, {"a": 2}).tau is None
    assert not math.isnan(kendall_tau_b(first, first).tau)
    assert np.isclose(kendall_tau_b(first, first).tau, 1.0)


def test_one_conversation_rated_twice_or_no_variation_is_undefined_and_says_why():
    # with one pairable unit alpha is 0 whatever the raters did: it is undefined, not 0.000
    once = agreement([("a", "x", 6), ("a", "y", 3)], boot=50)
    assert once.alpha is None and once.ci is None and once.units == 1
    assert once.note == (
        "undefined: needs at least two conversations each rated by two or more raters (there is 1)"
    )
    flat = agreement([(u, r, 4) for u in "ab" for r in "xy"], boot=50)
    assert flat.alpha is None and flat.note == (
        "undefined: no variation among the ratings (every one is 4)"
    )
