"""Power analysis: participants per arm under Holm's first step, checked against R's pwr and
against scipy's noncentral t computed here directly."""

import json
import math
import subprocess
import sys

import pytest
from scipy import stats

from studies.analysis.power import PowerError, family_size, n_per_arm, power_at


def noncentral_power(effect: float, alpha: float, n: int) -> float:
    """Two-sided two-sample t-test power, n per arm: P(|T| > t_crit) with T ~ nct(df, ncp)."""
    df = 2 * n - 2
    ncp = effect * math.sqrt(n / 2)
    crit = stats.t.ppf(1 - alpha / 2, df)
    return stats.nct.sf(crit, df, ncp) + stats.nct.cdf(-crit, df, ncp)


def test_known_value_64_per_arm():
    # R: pwr::pwr.t.test(d = 0.5, sig.level = 0.05, power = 0.8) gives n = 63.76561.
    found = n_per_arm(0.5, 0.05, 1, 0.8)
    assert found.n_exact == pytest.approx(63.76561, abs=1e-4)
    assert found.n_per_arm == 64 and found.alpha_per_test == 0.05


def test_holm_first_step_matches_the_noncentral_t():
    found = n_per_arm(0.5, 0.05, 3, 0.8)
    assert found.alpha_per_test == pytest.approx(0.05 / 3)
    n = found.n_per_arm
    # The smallest n whose power reaches 0.8 at alpha / 3, by scipy's nct alone.
    assert noncentral_power(0.5, 0.05 / 3, n) >= 0.8 > noncentral_power(0.5, 0.05 / 3, n - 1)
    assert power_at(0.5, 0.05 / 3, n) == pytest.approx(noncentral_power(0.5, 0.05 / 3, n))
    assert n == 86


def test_family_size_follows_the_reports_families():
    assert family_size(3, "control", "measure", 4) == 2
    assert family_size(3, "all", "measure", 4) == 3
    assert family_size(3, "control", "study", 4) == 8
    assert family_size(4, "all", "study", 2) == 12
    assert family_size(1, "control", "measure", 2) == 1  # nothing to compare: alpha as it is


@pytest.mark.parametrize(
    "effect, alpha, family, power, word",
    [
        (0, 0.05, 1, 0.8, "effect"),
        (-0.3, 0.05, 1, 0.8, "effect"),
        (0.5, 0, 1, 0.8, "alpha"),
        (0.5, 1.0, 1, 0.8, "alpha"),
        (0.5, 0.05, 0, 0.8, "family"),
        (0.5, 0.05, 1, 1.0, "power"),
        (0.5, 0.05, 1, 0, "power"),
    ],
)
def test_bad_input_is_refused_by_name(effect, alpha, family, power, word):
    with pytest.raises(PowerError, match=word):
        n_per_arm(effect, alpha, family, power)


def manage(*args):
    return subprocess.run(
        [sys.executable, "manage.py", "power", *args], capture_output=True, text=True, timeout=120
    )


def test_power_command_prints_json_and_refuses_bad_input():
    done = manage("--effect", "0.5", "--alpha", "0.05", "--family", "3", "--power", "0.8", "--json")
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert list(found)[:2] == ["n_per_arm", "alpha_per_test"]
    assert found["n_per_arm"] == 86 and found["alpha_per_test"] == pytest.approx(0.05 / 3)
    assert (found["effect"], found["power"], found["family"]) == (0.5, 0.8, 3)
    bad = manage("--effect", "0.5", "--alpha", "1.5", "--family", "0", "--json")
    assert bad.returncode != 0
    assert "alpha must lie strictly between 0 and 1" in bad.stderr and "family" in bad.stderr
