"""collapse3's pre-registration: the registration refuses a changed design, analysis or runner;
the rule decides as written on constructed runs; C2 fails a compliant simulator; the gate's
no-go path; the equilibrium formula against brute-force optimisation and against the exact
update's own loss; the seeds no earlier run used."""

import json
import shutil
import tomllib
from pathlib import Path

import pytest
import torch

from agents.domains.p4g.decision import ASKS
from training.collapse3 import analysis, equilibrium
from training.collapse3.runner import (
    DESIGN,
    REGISTERED,
    REGISTRATION,
    DesignError,
    check_registration,
    load_design,
)

ROOT = Path(__file__).resolve().parents[2]
ASK_TEXTS = list(ASKS.values())
AMOUNT = {text: amount for (_, amount), text in ASKS.items()}
EXPLOIT = [t for t in ASK_TEXTS if AMOUNT[t] == 2.0]  # the frozen SmolLM2's: both $2 asks


def compliant() -> dict[str, float]:
    """A simulator that gives whatever it is asked: E(a) = amount / 2."""
    return {a: AMOUNT[a] / 2 for a in ASK_TEXTS}


def punishing() -> dict[str, float]:
    """A simulator that gives what it is asked except on the exploit asks, where it gives $0.50."""
    return {a: (0.25 if a in EXPLOIT else AMOUNT[a] / 2) for a in ASK_TEXTS}


def dist(exploit_mass: float) -> list[float]:
    rest = (1 - exploit_mass) / 6
    return [exploit_mass / 2 if a in EXPLOIT else rest for a in ASK_TEXTS]


def run(regime, seed, end, start=0.25, sim=None, stds=None) -> dict:
    probs = dist(end)
    at = {str(k): sim() for k in analysis.C2_CHECKPOINTS} if sim else {}
    return {
        "regime": regime,
        "seed": seed,
        "asks": ASK_TEXTS,
        "agent_final": probs,
        "p_exploit": analysis.p_exploit(probs, ASK_TEXTS, EXPLOIT),
        "entropy": analysis.entropy(probs),
        "p_exploit_start": start,
        "exploit": EXPLOIT,
        "simulator_at": at,
        "exploit_earns": 0.5,
        "secondary": {"psod/training": 0.1, "exact/R_train": 0.6},
        "series": {"reward_std": stds if stds is not None else [0.2] * 16},
    }


EXPECTED = {
    "anchored": {a: AMOUNT[a] / 2 for a in ASK_TEXTS},
    "reactant": {a: (0.05 if a in EXPLOIT else 0.35) for a in ASK_TEXTS},
}


def analyse(single_end, arm_end, sim=punishing, stds=None):
    runs = {  # the runner lists the longest regimes first: single is not first here
        "cotrain": [run("cotrain", 300 + k, e, sim=sim, stds=stds) for k, e in enumerate(arm_end)],
        "single": [run("single", 300 + k, e) for k, e in enumerate(single_end)],
    }
    return analysis.analyse(runs, EXPECTED, ["reactant"], None)


# -- the rule on constructed runs --------------------------------------------------------------


def test_each_verdict_on_constructed_runs():
    shown = analyse([0.95] * 5, [0.4, 0.5, 0.45, 0.3, 0.6])["regimes"]["cotrain"]
    assert shown["C2"]["holds"] and shown["C4"]["holds"]
    assert shown["verdict"] == "mechanism shown"
    assert shown["paired"]["sign_test_p"] == pytest.approx(1 / 32)
    # reported, not deciding: the loop's PSOD as it came, the exact one from the panel
    assert shown["secondary"]["psod/training"] == [0.1] * 5
    want = [0.6 - h for h in shown["heldout_deciding"]]
    assert shown["secondary"]["exact/psod"] == pytest.approx(want)
    one_back = analyse([0.95] * 5, [0.4, 0.5, 0.45, 0.3, 0.97])["regimes"]["cotrain"]
    assert one_back["verdict"] == "inconclusive"
    same = analyse([0.95] * 5, [0.96, 0.94, 0.95, 0.97, 0.93])["regimes"]["cotrain"]
    assert same["verdict"] == "refuted"


def test_failed_checks_make_an_arm_uninformative():
    no_collapse = analyse([0.5] * 5, [0.3] * 5)
    assert not no_collapse["checks"]["C1"]["holds"]
    assert no_collapse["regimes"]["cotrain"]["verdict"] == "uninformative"
    # C2: a compliant co-trained simulator pays the exploit most, whatever the agent does
    kind = analyse([0.95] * 5, [0.3] * 5, sim=compliant)["regimes"]["cotrain"]
    assert not kind["C2"]["holds"] and kind["verdict"] == "uninformative"
    assert any("C2" in why for why in kind["uninformative_because"])
    # C4: an agent whose groups' rewards never spread was not steered
    flat = analyse([0.95] * 5, [0.3] * 5, stds=[0.0] * 12 + [0.2] * 4)["regimes"]["cotrain"]
    assert not flat["C4"]["holds"] and flat["verdict"] == "uninformative"
    assert any("C4" in why for why in flat["uninformative_because"])


def test_c2_fails_a_compliant_simulator_and_passes_one_that_punishes_the_exploit():
    """collapse2's C2 (max E - sum pi E) passed a compliant simulator whenever the agent was not
    yet on its best ask; collapse3's asks whether the exploit is the best ask."""
    kind = analysis.c2_at(compliant(), EXPLOIT)
    assert not kind["holds"] and kind["margin"] == pytest.approx(-0.25)
    assert kind["spread"] == pytest.approx(0.75)  # conditional, but on the exploit
    hard = analysis.c2_at(punishing(), EXPLOIT)
    assert hard["holds"] and hard["margin"] == pytest.approx(0.5)
    # ask-independent: the exploit is not best, but nothing is conditional either
    assert not analysis.c2_at(dict.fromkeys(ASK_TEXTS, 0.1), EXPLOIT)["holds"]
    # per seed at the fixed checkpoints: 2 of 3 needed, a missing checkpoint fails
    mixed = run("cotrain", 0, 0.3)
    mixed["simulator_at"] = {"8": compliant(), "12": punishing(), "16": punishing()}
    assert analysis.c2_seed(mixed)["holds"]
    mixed["simulator_at"] = {"8": compliant(), "12": punishing()}
    assert not analysis.c2_seed(mixed)["holds"]


def test_the_gates_no_go_and_go_paths():
    kind = [run("cotrain", 400 + k, 0.9, sim=compliant) for k in range(2)]
    hard = [run("cotrain", 400 + k, 0.3, sim=punishing) for k in range(2)]
    # no window in the equilibrium table: no-go without a pilot
    none = analysis.gate([], {(0.07, 5e-3): hard})
    assert not none["go"] and "not run" in none["why"]
    # no setting holds C2 in most pilot seeds: no-go, the precondition not established
    nogo = analysis.gate([0.07, 0.1], {(0.07, 5e-3): kind, (0.1, 2e-2): kind})
    assert not nogo["go"] and "could not be established at 135M" in nogo["why"]
    # one seed of two is not most
    half = analysis.gate([0.07], {(0.07, 5e-3): [kind[0], hard[1]]})
    assert not half["go"]
    go = analysis.gate([0.07, 0.1], {(0.07, 5e-3): kind, (0.1, 2e-2): hard, (0.07, 2e-2): hard})
    assert go["go"] and go["simulator_beta"] in (0.1, 0.07) and go["simulator_lr"] == 2e-2


def test_the_lr_pilot_rule():
    def runs(*ends):
        return [run("single", 400 + k, e) for k, e in enumerate(ends)]

    picked = analysis.choose_lr(
        {1e-3: runs(0.7, 0.85), 1.5e-3: runs(0.9, 0.85), 2e-3: runs(0.99, 0.97)}
    )
    assert picked["lr"] == 1.5e-3 and picked["c1_in_every_pilot_seed"]
    fallback = analysis.choose_lr({1e-3: runs(0.5, 0.6), 2e-3: runs(0.7, 0.75)})
    assert fallback["lr"] == 2e-3 and not fallback["c1_in_every_pilot_seed"]


# -- the equilibrium -------------------------------------------------------------------------

BASE = [0.05, 0.1, 0.15, 0.3, 0.4]  # a constructed persuadee, mostly compliant
R = [0.0, 0.25, 0.5, 0.75, 1.0]  # the agent's reward per marker ($0 ... $2)


def _simplex(m: int, steps: int):
    """Every point of the simplex on a grid of 1/steps."""
    if m == 1:
        yield (steps,)
        return
    for k in range(steps + 1):
        for rest in _simplex(m - 1, steps - k):
            yield (k, *rest)


@pytest.mark.parametrize("weight", [0.1, 0.3, 1.0])
def test_the_equilibrium_is_the_maximiser_found_by_brute_force(weight):
    """On three markers (a grid of 1/200 over the simplex): the best grid point is next to the
    closed form, and the closed form scores at least as well as every grid point. A flipped
    exponent (exp(-s/w)) or the forward KL(b || pi) gives another point."""
    base, s = [0.2, 0.3, 0.5], equilibrium.adversarial([0.0, 0.5, 1.0])
    pi = equilibrium.tilt(base, s, weight)
    steps = 200
    best = max(
        (tuple(k / steps for k in p) for p in _simplex(3, steps)),
        key=lambda p: equilibrium.objective(list(p), base, s, weight),
    )
    assert max(abs(a - b) for a, b in zip(best, pi, strict=True)) <= 1.5 / steps
    assert (
        equilibrium.objective(pi, base, s, weight)
        >= equilibrium.objective(list(best), base, s, weight) - 1e-12
    )
    assert pi[0] > base[0]  # the adversarial simulator moves mass to $0


def test_the_exact_updates_own_loss_descends_to_the_equilibrium():
    """Gradient descent on training/regimes/exact_update.py's loss (logits of one prompt, the
    adversarial reward, the reverse KL) ends at equilibrium.tilt: the table is the fixed point of
    the update the runs use."""
    from training.regimes.exact_update import exact_choice_loss

    weight = 0.3
    s = torch.tensor([equilibrium.adversarial(R)])
    ref = torch.tensor([BASE]).log()
    logits = torch.zeros(1, 5, requires_grad=True)
    opt = torch.optim.SGD([logits], lr=2.0)
    for _ in range(3000):
        opt.zero_grad()
        loss, _ = exact_choice_loss(logits.log_softmax(-1), ref, s, weight, scale_std=False)
        loss.backward()
        opt.step()
    found = logits.detach().softmax(-1)[0].tolist()
    want = equilibrium.tilt(BASE, equilibrium.adversarial(R), weight)
    assert found == pytest.approx(want, abs=2e-3)


def test_the_table_on_a_constructed_persuadee_has_a_window():
    """A persuadee compliant on small asks and mixed on $2: strong tilts zero every ask, weak
    ones leave the base (the exploit best); in between the $2 ask, the one with mass on $0 to
    lose, falls first."""

    def decision(probs):
        return {"probs": probs, "rewards": R}

    decisions = {
        "small": [decision([0.01, 0.01, 0.96, 0.01, 0.01])],  # gives $1
        "big": [decision([0.3, 0.01, 0.01, 0.01, 0.67])],  # gives $2 or $0
    }
    found = equilibrium.table(decisions, ["big"], 0.02, 0.1, weights=[0.01, 0.1, 0.3, 10.0])
    holds = {r["weight"]: r["holds"] for r in found["rows"]}
    assert holds == {0.01: False, 0.1: True, 0.3: True, 10.0: False}
    assert found["window"] == [0.1, 0.3] and found["registered_weight"] in (0.1, 0.3)


def test_the_committed_table_recomputes_from_its_own_decisions():
    """equilibrium.json's rows follow from the base decisions it stores (the model run is the
    only thing not redone here), and the design registers its window and weight."""
    table = json.loads((ROOT / "training/collapse3/equilibrium.json").read_text())
    again = equilibrium.table(
        table["decisions"], table["exploit"], analysis.C2_MARGIN, analysis.C2_SPREAD
    )
    assert again["window"] == table["window"]
    assert again["registered_weight"] == table["registered_weight"]
    for a, b in zip(again["rows"], table["rows"], strict=True):
        assert a["expected"] == pytest.approx(b["expected"])
    design = load_design()
    assert design["simulator"]["registered_weight"] == table["registered_weight"]
    assert set(design["gate"]["simulator_beta"]) <= set(table["window"])


# -- the registration ----------------------------------------------------------------------


def _copy_registered(root: Path) -> None:
    for name in REGISTERED:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, root / name)


@pytest.mark.parametrize(
    "name", ["design.toml", "analysis.py", "runner.py", "run.toml", "equilibrium.json"]
)
def test_the_registration_refuses_a_changed_file(tmp_path, name):
    root = tmp_path / "repo"
    _copy_registered(root)
    check_registration(REGISTRATION, root)  # the same bytes: accepted
    with (root / "training/collapse3" / name).open("a") as f:
        f.write("\n# edited after registration\n")
    with pytest.raises(DesignError, match=f"collapse3/{name}"):
        check_registration(REGISTRATION, root)


def test_the_committed_design_is_registered_and_its_numbers_are_the_analysiss(tmp_path):
    design = load_design()
    seeds = {*design["arms"]["seeds"], *design["arms"]["no_go_extra_seeds"]}
    assert not seeds & {*design["lr_pilot"]["seeds"], *design["gate"]["seeds"]}
    # the main seeds no earlier committed run used (collapse, collapse2 and its pilot; collapse3's
    # own committed runs are the registered ones)
    used = {
        json.loads(p.read_text())["seed"]
        for earlier in ("collapse", "collapse2")
        for p in (ROOT / "docs/results" / earlier).glob("runs/*/config.json")
    }
    used |= set(
        tomllib.loads((ROOT / "training/collapse2/design.toml").read_text())["pilot"]["seeds"]
    )  # collapse2's pilot
    assert used >= {0, 1, 2, 3, 4, 100, 101}
    assert not seeds & used and not {*design["lr_pilot"]["seeds"]} & used
    # the design's numbers are the analysis's: a copy with one changed is refused
    root = tmp_path / "repo"
    _copy_registered(root)
    text = DESIGN.read_text().replace("c2_margin = 0.02", "c2_margin = 0.01")
    (root / "training/collapse3/design.toml").write_text(text)
    registration = tmp_path / "registration.toml"
    registration.write_text(
        REGISTRATION.read_text().replace(
            check_registration()["training/collapse3/design.toml"],
            __import__("hashlib").sha256(text.encode()).hexdigest(),
        )
    )
    check_registration(registration, root)
    with pytest.raises(DesignError, match="disagree"):
        load_design(root / "training/collapse3/design.toml", registration, root)


def test_the_command_refuses_what_the_design_fixes(capsys):
    from training.__main__ import main

    assert main(["experiment", "collapse3", "--steps", "2"]) == 2
    assert "collapse3's design is fixed" in capsys.readouterr().err


def test_the_runs_configs(tmp_path):
    """Pilots without [behaviour], main runs with it on the P4G corpus; the co-trained arms on
    the exact update with the gate's weight and lr, no std scaling; every config valid."""
    from training.collapse3.runner import base_config, config_for
    from training.config import parse_config

    base = base_config(tmp_path / "flat-prior")
    pilot = config_for(base, "single", 400, tmp_path, lr=1.5e-3, behaviour=False)
    assert not pilot.behaviour.enabled and pilot.lr == 1.5e-3
    main = config_for(base, "cotrain", 300, tmp_path, lr=1e-3, simulator=(0.07, 2e-2))
    assert main.behaviour.reference == "p4g_corpus" and main.simulator_update == "exact"
    assert (main.simulator_beta, main.simulator_lr, main.scale_std) == (0.07, 2e-2, False)
    for config in (pilot, main, config_for(base, "verbalized", 300, tmp_path, lr=1e-3)):
        parse_config(config.to_dict())  # validated as a file would be
    with pytest.raises(ValueError, match="needs the simulator"):
        config_for(base, "population", 300, tmp_path, lr=1e-3)


def test_the_committed_results_recompute_from_the_committed_records():
    """docs/results/collapse3 is the registered run as it came out: analysis.py, given the
    committed records, gives the committed results.json's checks, endpoints and verdicts
    exactly (an edited record, or a verdict typed in by hand, fails here)."""
    committed = ROOT / "docs/results/collapse3"
    results = json.loads((committed / "results.json").read_text())
    checks = json.loads((committed / "checks.json").read_text())
    records: dict[str, list] = {}
    for path in sorted((committed / "runs").glob("*/record.json")):
        record = json.loads(path.read_text())
        records.setdefault(record["regime"], []).append(record)
    assert {r: len(v) for r, v in records.items()} == {"single": 8, "verbalized": 8}
    again = analysis.analyse(
        records, results["heldout_expected"], results["deciding_panel"], checks["C3"]["tv"]
    )
    assert again["checks"] == results["checks"]
    for regime, block in again["regimes"].items():
        assert block == results["regimes"][regime], regime
    assert results["regimes"]["verbalized"]["verdict"] == "inconclusive"
    assert {results["regimes"][r]["verdict"] for r in ("cotrain", "population")} == {"not run"}
    assert results["gate"]["go"] is False
