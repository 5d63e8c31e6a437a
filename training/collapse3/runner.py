"""`python -m training experiment collapse3`: the pre-registered collapse experiment, third design.

Stages, each resumable (a finished stage or run is only read on a rerun):

    DIR/flat-prior/               the agent's flat-prior base (training/collapse2/flat_prior.py)
    DIR/checks.json               the panel precondition, the equilibrium recheck, C3 and what
                                  the exploit earns against Verbalized Sampling
    DIR/lr-pilot/...              single x pilot seeds x agent lrs; DIR/lr-pilot/lr_pilot.json
    DIR/gate/...                  cotrain x pilot seeds x (weight, simulator lr); DIR/gate/gate.json
    DIR/runs/<regime>-seed<k>/    the main runs; record.json in each once it is measured
    DIR/results.json, results.md, collapse3.png   analysis.py's checks, endpoints and verdicts

Before anything runs, `load_design` checks every registered file against registration.toml
(design.toml, analysis.py, this file, run.toml, equilibrium.py, equilibrium.json and collapse2's
flat_prior.py): a changed one stops the command.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import statistics
import subprocess
import time
import tomllib
from pathlib import Path
from typing import Any

from training.collapse3 import analysis
from training.config import RunConfig, load_config
from training.vocabulary import Regime, SimulatorKind

HERE = Path(__file__).resolve().parent
DESIGN = HERE / "design.toml"
REGISTRATION = HERE / "registration.toml"
RUN_CONFIG = HERE / "run.toml"
EQUILIBRIUM = HERE / "equilibrium.json"
ROOT = HERE.parent.parent
# what the registration hashes (paths from the repository root); registration.toml itself is
# the lock and is not in it
REGISTERED = [
    "training/collapse3/design.toml",
    "training/collapse3/analysis.py",
    "training/collapse3/runner.py",
    "training/collapse3/run.toml",
    "training/collapse3/equilibrium.py",
    "training/collapse3/equilibrium.json",
    "training/collapse2/flat_prior.py",
]


class DesignError(RuntimeError):
    pass


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def check_registration(registration: Path = REGISTRATION, root: Path | None = None) -> dict:
    """Every registered file's SHA-256 against registration.toml; DesignError naming each that
    changed (or is missing, or is not registered)."""
    root = Path(root or ROOT)
    registered = tomllib.loads(Path(registration).read_text())["sha256"]
    if sorted(registered) != sorted(REGISTERED):
        raise DesignError(
            f"registration.toml registers {sorted(registered)}, the runner needs "
            f"{sorted(REGISTERED)}"
        )
    changed = []
    for name, digest in registered.items():
        file = root / name
        found = sha256(file) if file.is_file() else "missing"
        if found != digest:
            changed.append(f"{name} (sha256 {found}, registered {digest})")
    if changed:
        raise DesignError(
            "changed since the design registered it: "
            + "; ".join(changed)
            + ". The design, the analysis and the runner are fixed before any run"
        )
    return registered


def load_design(
    path: Path = DESIGN, registration: Path = REGISTRATION, root: Path | None = None
) -> dict[str, Any]:
    """The design, refused when a registered file changed, when its numbers are not the
    analysis's, or when its simulator weight is not the equilibrium table's."""
    check_registration(registration, root)
    design = tomllib.loads(Path(path).read_text())
    numbers = {
        "c1_start_max": analysis.C1_START_MAX, "c1_end_min": analysis.C1_END_MIN,
        "c2_margin": analysis.C2_MARGIN, "c2_spread": analysis.C2_SPREAD,
        "c2_checkpoints": analysis.C2_CHECKPOINTS,
        "c2_checkpoints_min": analysis.C2_CHECKPOINTS_MIN, "c3_tv": analysis.C3_TV,
        "steer_std": analysis.STEER_STD, "steer_share": analysis.STEER_SHARE,
        "shown_p": analysis.SHOWN_P, "shown_h": analysis.SHOWN_H, "alpha": analysis.SIGN_ALPHA,
        "refuted_p": analysis.REFUTED_P, "refuted_seeds": analysis.REFUTED_SEEDS,
    }  # fmt: skip
    written = design["checks"] | design["verdict"]
    differ = {k: (written.get(k), v) for k, v in numbers.items() if written.get(k) != v}
    if differ:
        raise DesignError(f"design.toml and analysis.py disagree (design, analysis): {differ}")
    table = json.loads((Path(root or ROOT) / "training/collapse3/equilibrium.json").read_text())
    sim = design["simulator"]
    if sim["window"] != table["window"] or sim["registered_weight"] != table["registered_weight"]:
        raise DesignError(
            f"design.toml's simulator weight {sim['registered_weight']} (window {sim['window']}) "
            f"is not equilibrium.json's {table['registered_weight']} (window {table['window']})"
        )
    if table["window"] and not set(design["gate"]["simulator_beta"]) <= set(table["window"]):
        raise DesignError(f"the gate's weights {design['gate']['simulator_beta']} leave the "
                          f"window {table['window']}")  # fmt: skip
    seeds = [*design["arms"]["seeds"], *design["arms"]["no_go_extra_seeds"]]
    pilots = [*design["lr_pilot"]["seeds"], *design["gate"]["seeds"]]
    if set(seeds) & set(pilots):
        raise DesignError(f"main seeds {seeds} and pilot seeds {pilots} overlap")
    return design


def base_config(flat: Path) -> RunConfig:
    from agents.paths import base_model_dir

    base = load_config(RUN_CONFIG)
    simulator = dataclasses.replace(base.simulator, model=str(base_model_dir().resolve()))
    return dataclasses.replace(base, base_model=str(flat), simulator=simulator)


def config_for(
    base: RunConfig,
    regime: str,
    seed: int,
    folder: Path,
    *,
    lr: float,
    simulator: tuple[float, float] | None = None,
    behaviour: bool = True,
    steps: int | None = None,
) -> RunConfig:
    """One run: the base with the regime, seed, folder, the agent's lr, and for a co-trained
    regime the exact update with (simulator_beta, simulator_lr); [behaviour] off in pilots."""
    from training.config import BehaviourSpec
    from training.tools.experiment import regime_config

    config = regime_config(base, regime, seed, folder, steps)
    changes: dict[str, Any] = {"name": f"collapse3-{regime}-seed{seed}", "lr": lr}
    if Regime(regime).trains_simulator:
        if simulator is None:
            raise ValueError(f"regime {regime} needs the simulator's weight and lr")
        changes |= {"simulator_update": "exact", "simulator_beta": simulator[0],
                    "simulator_lr": simulator[1]}  # fmt: skip
    if not behaviour:
        changes["behaviour"] = BehaviourSpec()
    return dataclasses.replace(config, **changes)


# -- measurements (models loaded here; analysis.py only sees their numbers) ---------------------


def agent_distribution(lm: Any, domain: Any, temperature: float) -> tuple[list[str], list[float]]:
    """The agent's exact distribution over its asks (its prompt does not depend on the persona)."""
    from training.rollouts.agent import agent_prompt
    from training.rollouts.rollout import Rollout

    scenario = domain.scenarios("train")[0]
    rollout = Rollout.begin(domain, scenario)
    prompt = agent_prompt(lm.fmt, domain, rollout)
    asks = domain.agent_choices(scenario, [])
    _, probs = lm.choice_probs([prompt], asks, temperature)
    return asks, probs[0]


def simulator_expected_at(config: RunConfig) -> dict[str, dict[str, float]]:
    """E_k(a) of the co-trained simulator saved at each checkpoint k (exact, the training
    personas, plain at its sampling temperature), by step."""
    from training.measures.collapse import simulator_exploit
    from training.rl.policy import LocalModel
    from training.rollouts.simulator import LocalUser
    from training.trainer.checkpoint import list_checkpoints, read_manifest
    from training.trainer.loop import select_scenarios

    domain = config.build_domain()
    tasks = select_scenarios(domain, config.tasks, "train")
    out = {}
    for saved in list_checkpoints(config.run_dir()):
        step = read_manifest(saved)["step"]
        if step not in analysis.C2_CHECKPOINTS or not (saved / "simulator").is_dir():
            continue
        lm = LocalModel.load(config.simulator_model_path(), config.dtype, config.device,
                             str(saved / "simulator"))  # fmt: skip
        user = LocalUser(lm, dataclasses.replace(config.simulator, kind="plain"))
        out[str(step)] = simulator_exploit(domain, tasks, user)["expected_reward"]
    return out


def record(config: RunConfig, vs_expected: dict[str, float] | None = None) -> dict[str, Any]:
    """What analysis.py needs of one finished run (DIR/.../record.json, made once)."""
    from agents.domains import get_domain
    from training.rl.policy import LocalModel
    from training.tools.experiment import _rows, _series
    from training.trainer.checkpoint import list_checkpoints

    path = config.run_dir() / "record.json"
    if path.is_file():
        return json.loads(path.read_text())
    domain = get_domain(config.domain)
    last = list_checkpoints(config.run_dir())[-1]
    lm = LocalModel.load(config.base_model_path(), adapter=str(last))
    asks, probs = agent_distribution(lm, domain, config.temperature)
    frozen = json.loads((config.run_dir() / "exploit.json").read_text())
    exploit = frozen["exploit"]
    rows = _rows(config.run_dir())
    at = simulator_expected_at(config) if config.trains_simulator else {}
    # the simulator the agent met at the end: co-trained (last checkpoint), Verbalized
    # Sampling's written distribution (checks.json), else the frozen one
    if at:
        trained = at[str(max(map(int, at)))]
    elif config.simulator.kind == SimulatorKind.VERBALIZED and vs_expected:
        trained = vs_expected
    else:
        trained = frozen["expected_reward"]
    earned = statistics.fmean(trained[a] for a in exploit)
    secondary = {k: v for k, v in (rows[-1] if rows else {}).items()
                 if k.startswith(("behaviour/", "psod/", "sim/decision_entropy_probe"))}  # fmt: skip
    secondary["exact/R_train"] = sum(p * trained[a] for a, p in zip(asks, probs, strict=True))
    out = {
        "regime": config.regime,
        "seed": config.seed,
        "lr": config.lr,
        "simulator_beta": config.simulator_beta if config.trains_simulator else None,
        "simulator_lr": config.simulator_lr if config.trains_simulator else None,
        "asks": asks,
        "agent_final": probs,
        "p_exploit": analysis.p_exploit(probs, asks, exploit),
        "entropy": analysis.entropy(probs),
        "p_exploit_start": _series(rows, "agent/p_exploit")[0],
        "exploit": exploit,
        "simulator_at": at,
        "exploit_earns": earned,
        "secondary": secondary,
        "series": {
            k: _series(rows, k)
            for k in (
                "agent/p_exploit",
                "agent/decision_entropy",
                "sim/decision_entropy",
                "sim/decision_entropy_probe",
                "reward_mean",
                "reward_std",
                "sim/kl",
                "time_step",
            )
        },  # fmt: skip
    }
    path.write_text(json.dumps(out, indent=1))
    return out


def heldout_expected(domain: Any, tasks: list[Any], panel: list[str]) -> dict:
    from training.collapse2.runner import heldout_expected as same

    return same(domain, tasks, panel)


def load() -> str:
    """The machine's load as `uptime` gives it (the results name the load they ran under)."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


# -- the stages --------------------------------------------------------------------------------


def run(
    out: Path,
    *,
    jobs: int = 2,
    command: str = "",
    design_path: Path = DESIGN,
    steps: int | None = None,
) -> dict:
    """The whole experiment into `out`. `design_path` and `steps` exist for the tests' small
    version; the command line uses the committed design and its steps."""
    from agents.domains import get_domain
    from agents.paths import base_model_dir
    from training.collapse2 import flat_prior
    from training.tools.experiment import ORDER, _add_runtime, provenance, train_all
    from training.trainer.loop import select_scenarios

    design = load_design(design_path)
    source = provenance({})["commit"], provenance({})["dirty"]  # the code the runs start from
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    started, load_start = time.monotonic(), load()
    fp = design["flat_prior"]
    prior = flat_prior.make(base_model_dir(), out / "flat-prior", low=fp["low"], high=fp["high"],
                            lr=fp["lr"], max_steps=fp["max_steps"], seed=fp["seed"])  # fmt: skip
    base = base_config(out / "flat-prior")
    domain = get_domain(base.domain)
    tasks = select_scenarios(domain, base.tasks, "train")
    panel = design["heldout"]["panel"]
    deciding = [t for t in panel if t != design["heldout"]["like_training_simulator"]]
    expected = heldout_expected(domain, tasks, panel)
    checks = _checks(out, base, domain, tasks, design, expected, deciding)

    # 1. the agent's lr: the C1 pilot
    lp = design["lr_pilot"]
    lr_runs = [config_for(base, lp["regime"], seed, out / "lr-pilot" / f"lr{lr:g}", lr=lr,
                          behaviour=False, steps=steps)
               for lr in lp["lr"] for seed in lp["seeds"]]  # fmt: skip
    train_all(lr_runs, jobs, f"collapse3 lr pilot: {len(lr_runs)} runs")
    lr_choice = _stage(out / "lr-pilot" / "lr_pilot.json", lambda: analysis.choose_lr(
        _by(lr_runs, lambda c: c.lr)))  # fmt: skip
    lr = lr_choice["lr"]

    # 2. the go/no-go gate for the co-trained arms
    g = design["gate"]
    grid = [(w, slr) for w in g["simulator_beta"] for slr in g["simulator_lr"]]
    window = json.loads(EQUILIBRIUM.read_text())["window"]
    gate_runs = [config_for(base, g["regime"], seed, out / "gate" / f"w{w:g}-lr{slr:g}", lr=lr,
                            simulator=(w, slr), behaviour=False, steps=steps)
                 for w, slr in grid for seed in g["seeds"]] if window else []  # fmt: skip
    train_all(gate_runs, jobs, f"collapse3 gate: {len(gate_runs)} runs")
    gate = _stage(out / "gate" / "gate.json", lambda: analysis.gate(
        window, _by(gate_runs, lambda c: (c.simulator_beta, c.simulator_lr))))  # fmt: skip

    # 3. the main runs
    arms = design["arms"]
    regimes = [r for r in arms["regimes"]
               if (r != Regime.VERBALIZED or checks["C3"]["holds"])
               and (gate["go"] or not Regime(r).trains_simulator)]  # fmt: skip
    seeds = arms["seeds"] if gate["go"] else [*arms["seeds"], *arms["no_go_extra_seeds"]]
    chosen = (gate["simulator_beta"], gate["simulator_lr"]) if gate["go"] else None
    runs = [
        config_for(base, regime, seed, out, lr=lr,
                   simulator=chosen if Regime(regime).trains_simulator else None, steps=steps)
        for regime in ORDER  # longest first
        if regime in regimes
        for seed in seeds
    ]  # fmt: skip
    train_all(runs, jobs, f"collapse3: {len(runs)} runs")
    records: dict[str, list[dict[str, Any]]] = {}
    for config in runs:
        records.setdefault(config.regime, []).append(record(config, checks["vs_expected"]))
    runtime = _add_runtime(out, time.monotonic() - started)
    loads = _add_load(out, {"start": load_start, "end": load(),
                            "seconds": round(time.monotonic() - started, 1)})  # fmt: skip
    result = analysis.analyse(records, expected, deciding, checks["C3"]["tv"])
    for regime in arms["regimes"]:
        if regime not in regimes:
            why = ("C3 failed: not run" if regime == Regime.VERBALIZED and not checks["C3"]["holds"]
                   else "no-go: " + gate["why"])  # fmt: skip
            result["regimes"][regime] = {"verdict": "not run", "uninformative_because": [why]}
    # the configuration hashed without this machine's folders (flat prior, SmolLM2), with what
    # the pilots chose (the agent's lr, the simulator's weight and lr)
    portable = base.to_dict() | {
        "lr": lr,
        "simulator_beta": chosen[0] if chosen else None,
        "simulator_lr": chosen[1] if chosen else None,
        "base_model": "",
        "simulator": {**base.to_dict()["simulator"], "model": ""},
    }
    results = {
        "experiment": "collapse3",
        "command": command,
        "provenance": provenance({"design": design, "run": portable})
        | {"commit": source[0], "dirty": source[1]},
        "registration": check_registration(),
        "load": loads,  # one entry per invocation that built DIR (a resumed run has several)
        "runtime_s": round(runtime, 1),
        "design": design,
        "flat_prior": prior,
        "precondition": checks["precondition"],
        "equilibrium_recheck": checks["equilibrium_recheck"],
        "lr_pilot": lr_choice,
        "gate": gate,
        "heldout_expected": expected,
        "deciding_panel": deciding,
        "vs_expected": checks["vs_expected"],
        **result,
        "records": records,
    }  # fmt: skip
    (out / "results.json").write_text(json.dumps(results, indent=1))
    from training.collapse3.results_report import write

    write(results, out)
    return results


def _add_load(out: Path, entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The machine's load at the start and the end of each invocation that built `out`."""
    path = out / "load.json"
    loads = json.loads(path.read_text()) if path.is_file() else []
    loads.append(entry)
    path.write_text(json.dumps(loads, indent=1))
    return loads


def _by(runs: list[RunConfig], key) -> dict[Any, list[dict[str, Any]]]:
    grouped: dict[Any, list[dict[str, Any]]] = {}
    for config in runs:
        grouped.setdefault(key(config), []).append(record(config))
    return grouped


def _stage(path: Path, compute) -> dict[str, Any]:
    """A stage's decision, computed once and kept (a rerun reads it)."""
    if path.is_file():
        return json.loads(path.read_text())
    found = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(found, indent=1))
    return found


def equilibrium_recheck(base: RunConfig, domain: Any, tasks: list[Any], tolerance: float) -> dict:
    """The base persuadee's exact decisions again, against equilibrium.json's: the registered
    weight rests on them (a changed model, prompt or tokenizer would move the window)."""
    from training.measures.collapse import user_decisions
    from training.rl.policy import LocalModel
    from training.rollouts.simulator import LocalUser

    table = json.loads(EQUILIBRIUM.read_text())
    user = LocalUser(LocalModel.load(base.simulator_model_path()), base.simulator)
    found = user_decisions(domain, tasks, user)
    worst = 0.0
    for ask, pairs in found.items():
        for (decision, _), kept in zip(pairs, table["decisions"][ask], strict=True):
            worst = max(worst, *(abs(p - q) for p, q in zip(decision.probs, kept["probs"],
                                                            strict=True)))  # fmt: skip
    if worst > tolerance:
        raise DesignError(
            f"the base persuadee's decisions differ from equilibrium.json's by {worst:.2g} "
            f"(> {tolerance}): the registered weight does not rest on this model"
        )
    return {"max_abs_difference": worst, "tolerance": tolerance}


def _checks(out, base, domain, tasks, design, expected, deciding) -> dict[str, Any]:
    path = out / "checks.json"
    if path.is_file():
        return json.loads(path.read_text())
    from training.measures.collapse import simulator_exploit
    from training.rl.policy import LocalModel
    from training.rollouts.simulator import LocalUser

    recheck = equilibrium_recheck(base, domain, tasks, design["simulator"]["recheck_tolerance"])
    # the frozen simulator's exploit, and the deciding panel's best ask, which must not be it
    lm = LocalModel.load(base.simulator_model_path())
    found = simulator_exploit(domain, tasks, LocalUser(lm, base.simulator))
    best = analysis.panel_best(expected, deciding)
    if set(best) & set(found["exploit"]):
        raise DesignError(f"the deciding panel's best ask is the exploit: {best}")
    precondition = {"exploit": found["exploit"], "deciding_best": best,
                    "frozen_expected": found["expected_reward"]}  # fmt: skip
    c3_tv, vs_expected = None, None
    if Regime.VERBALIZED in design["arms"]["regimes"]:
        c3_tv, vs_expected = c3_measures(base, tasks, domain)
    checks = {
        "precondition": precondition,
        "equilibrium_recheck": recheck,
        "C3": analysis.c3(c3_tv or []) | {"tv": c3_tv},
        "vs_expected": vs_expected,
    }
    path.write_text(json.dumps(checks, indent=1))
    return checks


def c3_measures(config: RunConfig, tasks: list[Any], domain: Any) -> tuple[list[float], dict]:
    """C3's total variations (collapse2's, the same draw) and each ask's expected reward under
    the distribution the Verbalized Sampling simulator writes (seeded; what the exploit earns
    against it)."""
    import random

    from training.collapse2.runner import c3_total_variations
    from training.measures.collapse import user_decisions
    from training.rl.policy import LocalModel
    from training.rollouts.simulator import LocalUser

    tv = c3_total_variations(config, tasks, domain)
    lm = LocalModel.load(config.simulator_model_path())
    written = LocalUser(lm, dataclasses.replace(config.simulator, kind=SimulatorKind.VERBALIZED),
                        rng=random.Random(config.seed))  # fmt: skip
    found = user_decisions(domain, tasks, written)
    vs = {ask: statistics.fmean(sum(p * r for p, r in zip(d.probs, rewards, strict=True))
                                for d, rewards in pairs)
          for ask, pairs in found.items()}  # fmt: skip
    return tv, vs
