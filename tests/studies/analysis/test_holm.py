"""Holm-Bonferroni against hand-worked sets and R's p.adjust(method = "holm")."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from studies.analysis.stats import holm


def r_p_adjust_holm(p):
    """R: i <- seq_len(n); o <- order(p); pmin(1, cummax((n - i + 1) * p[o]))[order(o)]."""
    p = np.asarray(p, float)
    n = p.size
    o = np.argsort(p, kind="stable")
    adjusted = np.minimum(1, np.maximum.accumulate((n - np.arange(n)) * p[o]))
    out = np.empty(n)
    out[o] = adjusted
    return out


# Worked by hand: sort, multiply the i-th smallest by n - i + 1, running max, cap at 1.
HAND_WORKED = {
    "unsorted": ([0.01, 0.04, 0.03, 0.005], [0.03, 0.06, 0.06, 0.02]),
    "already sorted": ([0.001, 0.01, 0.02, 0.5], [0.004, 0.03, 0.04, 0.5]),
    "ties": ([0.02, 0.02, 0.02], [0.06, 0.06, 0.06]),
    "ties among others": ([0.04, 0.01, 0.04, 0.001], [0.08, 0.03, 0.08, 0.004]),
    "running max lifts a later one": ([0.4, 0.6, 0.01], [0.8, 0.8, 0.03]),
    "capped at 1": ([0.5, 0.7, 0.9], [1.0, 1.0, 1.0]),
    "partly capped": ([0.3, 0.001, 0.45], [0.6, 0.003, 0.6]),
    "single test": ([0.037], [0.037]),
}


@pytest.mark.parametrize("name", HAND_WORKED)
def test_hand_worked(name):
    p, expected = HAND_WORKED[name]
    np.testing.assert_allclose(holm(p), expected, rtol=1e-14, atol=0)
    np.testing.assert_allclose(r_p_adjust_holm(p), expected, rtol=1e-14, atol=0)


def test_nan_is_left_out_of_the_family_like_r_na():
    # R: p.adjust(c(0.01, NA, 0.04), "holm") -> 0.02 NA 0.04
    adjusted = holm([0.01, np.nan, 0.04])
    assert adjusted[0] == pytest.approx(0.02) and adjusted[2] == pytest.approx(0.04)
    assert np.isnan(adjusted[1])
    assert np.isnan(holm([np.nan, np.nan])).all()
    assert holm([]).size == 0


# Values drawn from a small pool too, so ties are common.
p_values = st.lists(
    st.one_of(st.sampled_from([0.0, 0.001, 0.01, 0.02, 0.05, 0.5, 1.0]), st.floats(0, 1)),
    min_size=1,
    max_size=30,
)


# statsmodels runs gc.collect() per call (~0.1 s in a test process): few examples, no deadline.
@settings(max_examples=20, deadline=None)
@given(p_values)
def test_matches_r_and_keeps_the_order(p):
    adjusted = holm(p)
    np.testing.assert_allclose(adjusted, r_p_adjust_holm(p), rtol=1e-12, atol=1e-15)
    p = np.asarray(p)
    assert (adjusted >= p - 1e-15).all() and (adjusted <= 1).all()
    order = np.argsort(p, kind="stable")
    assert (np.diff(adjusted[order]) >= 0).all()  # monotone in p
