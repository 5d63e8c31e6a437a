"""collapse2's pre-registered analysis and design: the rule decides as written, the design is
refused when the analysis changed, and the held-out precondition holds on the real panel."""

import math
import shutil
from pathlib import Path

import pytest

from training.collapse2 import analysis
from training.collapse2.runner import DESIGN, DesignError, load_design

ASKS = [f"ask{i}" for i in range(8)]
EXPLOIT = ["ask3", "ask7"]


def dist(exploit_mass: float) -> list[float]:
    """8 asks: `exploit_mass` split on the two exploit asks, the rest evenly on the others."""
    rest = (1 - exploit_mass) / 6
    return [exploit_mass / 2 if a in EXPLOIT else rest for a in ASKS]


def run(regime: str, seed: int, end: float, start: float = 0.25, sim=None) -> dict:
    probs = dist(end)
    return {
        "regime": regime,
        "seed": seed,
        "asks": ASKS,
        "agent_final": probs,
        "p_exploit": analysis.p_exploit(probs, ASKS, EXPLOIT),
        "entropy": analysis.entropy(probs),
        "p_exploit_start": start,
        "simulator_final": sim,
    }


def punishing(mode_reward: float = 0.2) -> dict:
    """A co-trained simulator that pays the exploit asks (the collapsed agent's mode) less."""
    return {a: (mode_reward if a in EXPLOIT else 0.5) for a in ASKS}


EXPECTED = {
    "anchored": {a: (0.9 if a in EXPLOIT else 0.3) for a in ASKS},
    "reactant": {a: (0.05 if a in EXPLOIT else 0.35) for a in ASKS},
}


def analyse(single_end, arm_end, sim=punishing):
    runs = {  # the runner lists the longest regimes first: single is not first here
        "cotrain": [run("cotrain", k, e, sim=sim()) for k, e in enumerate(arm_end)],
        "single": [run("single", k, e) for k, e in enumerate(single_end)],
    }
    return analysis.analyse(runs, EXPECTED, ["reactant"], None)


def test_a_regime_that_keeps_every_seed_off_the_exploit_shows_the_mechanism():
    out = analyse([0.95] * 5, [0.4, 0.5, 0.45, 0.3, 0.6])
    cotrain = out["regimes"]["cotrain"]
    assert out["checks"]["C1"]["holds"] and cotrain["C2"]["holds"]
    assert cotrain["verdict"] == "mechanism shown"
    assert cotrain["paired"]["sign_test_p"] == pytest.approx(1 / 32)
    # secondary: the deciding panel gains where the exploit is left
    assert all(g > 0 for g in cotrain["paired"]["heldout_deciding_gain"])


def test_one_seed_the_other_way_is_not_enough_with_five_seeds():
    out = analyse([0.95] * 5, [0.4, 0.5, 0.45, 0.3, 0.97])
    assert out["regimes"]["cotrain"]["verdict"] == "inconclusive"
    assert out["regimes"]["cotrain"]["paired"]["sign_test_p"] == pytest.approx(6 / 32)


def test_a_regime_that_collapses_like_single_is_refuted():
    out = analyse([0.95] * 5, [0.96, 0.94, 0.95, 0.97, 0.93])
    assert out["regimes"]["cotrain"]["verdict"] == "refuted"


def test_failed_checks_make_an_arm_uninformative_not_evidence():
    no_collapse = analyse([0.5] * 5, [0.3] * 5)  # C1: single never reached 0.80
    assert not no_collapse["checks"]["C1"]["holds"]
    assert no_collapse["regimes"]["cotrain"]["verdict"] == "uninformative"
    # C2: a simulator that pays every ask the same punishes nothing
    flat = analyse([0.95] * 5, [0.3] * 5, sim=lambda: dict.fromkeys(ASKS, 0.3))
    assert not flat["regimes"]["cotrain"]["C2"]["holds"]
    assert flat["regimes"]["cotrain"]["verdict"] == "uninformative"
    assert "C2" in flat["regimes"]["cotrain"]["uninformative_because"][0]


def test_c3_and_the_sign_test():
    assert not analysis.c3([0.02, 0.05])["holds"] and analysis.c3([0.2, 0.1])["holds"]
    assert analysis.sign_test([1, 1, 1]) == pytest.approx(1 / 8)
    assert analysis.sign_test([-1, -1]) == 1.0
    assert analysis.sign_test([0, 0]) == 1.0
    assert math.isclose(analysis.entropy([0.125] * 8), math.log(8))


def test_the_committed_design_registers_this_analysis_and_refuses_a_changed_one(tmp_path):
    design = load_design()  # the committed pair agrees
    assert design["arms"]["seeds"] and design["pilot"]["seeds"]
    assert not set(design["arms"]["seeds"]) & set(design["pilot"]["seeds"])
    changed = tmp_path / "design.toml"
    text = DESIGN.read_text()
    changed.write_text(text.replace(design["analysis"]["sha256"], "0" * 64))
    with pytest.raises(DesignError, match="changed since the design registered it"):
        load_design(changed)
    changed.write_text(text.replace("c2_punish = 0.05", "c2_punish = 0.01"))
    with pytest.raises(DesignError, match="disagree"):
        load_design(changed)


def test_the_deciding_panels_best_ask_is_not_the_frozen_simulators_exploit():
    """On the real scripted panel: without `anchored`, a $2 ask is not the best one, while with
    it a $2 ask is (which is why the full panel decides nothing)."""
    from agents.domains import get_domain
    from training.collapse2.runner import heldout_expected
    from training.tools.experiment import _short

    domain = get_domain("p4g-decision")
    design = load_design()
    panel = design["heldout"]["panel"]
    expected = heldout_expected(domain, domain.scenarios("train")[:4], panel)
    deciding = [t for t in panel if t != design["heldout"]["like_training_simulator"]]
    best = [_short(a) for a in analysis.panel_best(expected, deciding)]
    assert best and not any(b.endswith("$2") for b in best), best
    assert any(_short(a).endswith("$2") for a in analysis.panel_best(expected, panel))


def test_the_command_refuses_what_the_design_fixes(capsys):
    from training.__main__ import main

    assert main(["experiment", "collapse2", "--seeds", "2"]) == 2
    assert "design is fixed" in capsys.readouterr().err


def test_an_edited_copy_of_the_analysis_is_caught(tmp_path, monkeypatch):
    from training.collapse2 import runner

    root = tmp_path / "repo"
    (root / "training" / "collapse2").mkdir(parents=True)
    source = Path(analysis.__file__)
    shutil.copy(source, root / "training" / "collapse2" / "analysis.py")
    monkeypatch.setattr(runner, "ROOT", root)
    load_design()  # the same bytes: accepted
    with (root / "training" / "collapse2" / "analysis.py").open("a") as f:
        f.write("\nSHOWN_P = 0.01\n")
    with pytest.raises(DesignError):
        load_design()
