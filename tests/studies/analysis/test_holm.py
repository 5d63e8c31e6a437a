"""Holm-Bonferroni against hand-worked sets, R's p.adjust(method = "holm") and statsmodels'
multipletests(method="holm"), which the report used before it computed Holm in numpy."""

import gc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from statsmodels.stats.multitest import multipletests

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


# Few examples and no deadline: this ran statsmodels' Holm, whose gc.collect() took ~0.1 s.
@settings(max_examples=20, deadline=None)
@given(p_values)
def test_matches_r_and_keeps_the_order(p):
    adjusted = holm(p)
    np.testing.assert_allclose(adjusted, r_p_adjust_holm(p), rtol=1e-12, atol=1e-15)
    p = np.asarray(p)
    assert (adjusted >= p - 1e-15).all() and (adjusted <= 1).all()
    order = np.argsort(p, kind="stable")
    assert (np.diff(adjusted[order]) >= 0).all()  # monotone in p


def random_families(count: int, seed: int = 0):
    """Families of 1..40 p-values: uniform ones, ones drawn from a small pool (ties, 0, 1,
    values the step-down lifts or caps), very small ones, and NaNs (undefined tests)."""
    rng = np.random.default_rng(seed)
    pool = np.array([0.0, 1e-12, 0.001, 0.01, 0.0125, 0.02, 0.05, 0.25, 0.5, 1.0])
    for _ in range(count):
        size = int(rng.integers(1, 41))
        p = rng.random(size)
        pooled = rng.random(size) < rng.random()
        p[pooled] = rng.choice(pool, int(pooled.sum()))
        tiny = rng.random(size) < 0.1
        p[tiny] = 10.0 ** -rng.uniform(1, 15, int(tiny.sum()))
        p[rng.random(size) < 0.05] = np.nan
        yield p


def statsmodels_holm(p: np.ndarray) -> np.ndarray:
    """What stats.holm called before: statsmodels on the finite p-values, NaN elsewhere."""
    out = np.full(p.shape, np.nan)
    finite = np.isfinite(p)
    if finite.any():
        out[finite] = multipletests(p[finite], method="holm")[1]
    return out


def test_numpy_holm_equals_statsmodels_on_random_families(monkeypatch):
    # statsmodels' Holm calls gc.collect() each time; skipped so 3,000 families take a second.
    monkeypatch.setattr(gc, "collect", lambda *args: 0)
    worst, sizes = 0.0, set()
    for p in random_families(3000):
        ours, theirs = holm(p), statsmodels_holm(p)
        np.testing.assert_array_equal(np.isnan(ours), np.isnan(p))
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-12)
        worst = max(worst, float(np.nanmax(np.abs(ours - theirs), initial=0.0)))
        sizes.add(int(np.isfinite(p).sum()))
    assert worst <= 1e-12
    assert {0, 1, 2, 40} <= sizes  # all-NaN families and families of one were among them


def test_ties_ones_and_a_family_of_one_equal_statsmodels(monkeypatch):
    monkeypatch.setattr(gc, "collect", lambda *args: 0)
    for p in (
        [0.03],
        [1.0],
        [1.0, 1.0, 1.0],
        [0.02, 0.02, 0.02, 0.02],
        [0.5, 0.01, 0.5, 0.01, 1.0],
        [0.0, 0.0, 1.0],
        [np.nan, 0.04, np.nan, 0.04],
        [np.nan],
    ):
        p = np.asarray(p)
        np.testing.assert_allclose(holm(p), statsmodels_holm(p), rtol=0, atol=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_step_down_is_monotone_and_at_least_the_raw_p(seed):
    for p in random_families(200, seed=seed):
        adjusted, finite = holm(p), np.isfinite(p)
        a, q = adjusted[finite], p[finite]
        if not q.size:
            continue
        order = np.argsort(q, kind="stable")
        assert (np.diff(a[order]) >= 0).all()  # the smallest p keeps the smallest adjusted p
        assert (a >= q).all() and (a <= 1).all()
        assert a[order][0] == min(1.0, q.size * q[order][0])  # first step: Bonferroni
