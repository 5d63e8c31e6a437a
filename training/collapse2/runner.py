"""`python -m training experiment collapse2`: the pre-registered collapse experiment.

Stages, each resumable (a finished stage or run is only read on a rerun):

    DIR/flat-prior/          the agent's flat-prior base model (flat_prior.py)
    DIR/checks.json          the panel precondition and C3 (plain vs verbalized decisions)
    DIR/pilot/runs/...       cotrain x pilot seeds x simulator KL weights; DIR/pilot/pilot.json
    DIR/runs/<regime>-seed<k>/   the main runs; record.json in each once it is measured
    DIR/results.json, results.md, collapse2.png   analysis.py's checks, endpoints and verdicts

The design (design.toml) and the analysis (analysis.py, its SHA-256 in the design) are read
first; a changed analysis stops the command before anything runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import statistics
import time
import tomllib
from pathlib import Path
from typing import Any

from agents.simulators.spec import SimulatorKind
from training.collapse2 import analysis
from training.config import load_config
from training.config_schema import RunConfig
from training.layout import EXPLOIT_FILE
from training.vocabulary import Regime

HERE = Path(__file__).resolve().parent
DESIGN = HERE / "design.toml"
RUN_CONFIG = HERE / "run.toml"
ROOT = HERE.parent.parent


class DesignError(RuntimeError):
    pass


def load_design(path: Path = DESIGN) -> dict[str, Any]:
    """The design, refused when the analysis it names is not the one it registered or its
    numbers are not the analysis's."""
    design = tomllib.loads(Path(path).read_text())
    file = ROOT / design["analysis"]["file"]
    found = hashlib.sha256(file.read_bytes()).hexdigest()
    if found != design["analysis"]["sha256"]:
        raise DesignError(
            f"{file} changed since the design registered it (sha256 {found}, registered "
            f"{design['analysis']['sha256']}): the analysis is fixed before any run"
        )
    numbers = {
        "c1_start_max": analysis.C1_START_MAX,
        "c1_end_min": analysis.C1_END_MIN,
        "c2_punish": analysis.C2_PUNISH,
        "c2_spread": analysis.C2_SPREAD,
        "c3_tv": analysis.C3_TV,
        "shown_p": analysis.SHOWN_P,
        "shown_h": analysis.SHOWN_H,
        "alpha": analysis.SIGN_ALPHA,
        "refuted_p": analysis.REFUTED_P,
        "refuted_seeds": analysis.REFUTED_SEEDS,
    }
    written = design["checks"] | design["verdict"]
    differ = {k: (written.get(k), v) for k, v in numbers.items() if written.get(k) != v}
    if differ:
        raise DesignError(f"design.toml and analysis.py disagree (design, analysis): {differ}")
    return design


def config_for(
    base: RunConfig, regime: str, seed: int, folder: Path, sim_beta: float, steps: int | None = None
) -> RunConfig:
    from training.tools.experiment import regime_config

    config = regime_config(base, regime, seed, folder, steps)
    return dataclasses.replace(
        config, name=f"collapse2-{regime}-seed{seed}", simulator_beta=sim_beta
    )


def base_config(flat: Path) -> RunConfig:
    from agents.paths import base_model_dir

    base = load_config(RUN_CONFIG)
    simulator = dataclasses.replace(base.simulator, model=str(base_model_dir().resolve()))
    return dataclasses.replace(base, base_model=str(flat), simulator=simulator)


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


def heldout_expected(
    domain: Any, tasks: list[Any], panel: list[str]
) -> dict[str, dict[str, float]]:
    """E_t(a): each scripted type's exact expected reward per ask (training tasks' personas)."""
    from agents.simulators.spec import SimulatorSpec
    from training.measures.collapse import simulator_exploit
    from training.rollouts.simulator import ScriptedUser

    return {
        t: simulator_exploit(
            domain,
            tasks,
            ScriptedUser(SimulatorSpec(name=t, kind=SimulatorKind.SCRIPTED, script=t)),
        )["expected_reward"]
        for t in panel
    }


def c3_total_variations(config: RunConfig, tasks: list[Any], domain: Any) -> list[float]:
    """Per persona x ask: total variation between the plain simulator's exact decision and the
    distribution the Verbalized Sampling simulator writes (one written list each, seeded)."""
    import random

    from training.measures.collapse import user_decisions
    from training.rl.policy import LocalModel
    from training.rollouts.simulator import LocalUser

    lm = LocalModel.load(config.simulator_model_path())
    plain = LocalUser(lm, dataclasses.replace(config.simulator, kind=SimulatorKind.PLAIN))
    written = LocalUser(
        lm,
        dataclasses.replace(config.simulator, kind=SimulatorKind.VERBALIZED),
        rng=random.Random(config.seed),
    )
    a, b = user_decisions(domain, tasks, plain), user_decisions(domain, tasks, written)
    return [
        0.5 * sum(abs(p - q) for p, q in zip(x[0].probs, y[0].probs, strict=True))
        for ask in a
        for x, y in zip(a[ask], b[ask], strict=True)
    ]


def record(config: RunConfig) -> dict[str, Any]:
    """What analysis.py needs of one finished run (DIR/runs/<run>/record.json, made once)."""
    from agents.domains import get_domain
    from training.rl.policy import LocalModel
    from training.tools.experiment import _rows, _series, final_simulator
    from training.trainer.checkpoint import list_checkpoints

    path = config.run_dir() / "record.json"
    if path.is_file():
        return json.loads(path.read_text())
    domain = get_domain(config.domain)
    last = list_checkpoints(config.run_dir())[-1]
    lm = LocalModel.load(config.base_model_path(), adapter=str(last))
    asks, probs = agent_distribution(lm, domain, config.temperature)
    exploit = json.loads((config.run_dir() / EXPLOIT_FILE).read_text())["exploit"]
    rows = _rows(config.run_dir())
    out = {
        "regime": config.regime,
        "seed": config.seed,
        "asks": asks,
        "agent_final": probs,
        "p_exploit": analysis.p_exploit(probs, asks, exploit),
        "entropy": analysis.entropy(probs),
        "p_exploit_start": _series(rows, "agent/p_exploit")[0],
        "exploit": exploit,
        "simulator_final": final_simulator(config) if config.trains_simulator else None,
        "series": {
            k: _series(rows, k)
            for k in (
                "agent/p_exploit",
                "agent/decision_entropy",
                "sim/decision_entropy",
                "reward_mean",
            )
        },
    }
    path.write_text(json.dumps(out, indent=1))
    return out


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
    started = time.monotonic()
    fp = design["flat_prior"]
    prior = flat_prior.make(
        base_model_dir(),
        out / "flat-prior",
        low=fp["low"],
        high=fp["high"],
        lr=fp["lr"],
        max_steps=fp["max_steps"],
        seed=fp["seed"],
    )
    base = base_config(out / "flat-prior")
    domain = get_domain(base.domain)
    tasks = select_scenarios(domain, base.tasks, "train")
    panel = design["heldout"]["panel"]
    deciding = [t for t in panel if t != design["heldout"]["like_training_simulator"]]
    expected = heldout_expected(domain, tasks, panel)
    checks = _checks(out, base, domain, tasks, design, expected, deciding)

    pilot_runs = [
        config_for(
            base, design["pilot"]["regime"], seed, out / "pilot" / f"beta{beta:g}", beta, steps
        )
        for beta in design["pilot"]["simulator_beta"]
        for seed in design["pilot"]["seeds"]
    ]
    train_all(pilot_runs, jobs, f"collapse2 pilot: {len(pilot_runs)} runs")
    chosen = _pilot(out, design, pilot_runs)

    regimes = [
        r for r in design["arms"]["regimes"] if r != Regime.VERBALIZED or checks["C3"]["holds"]
    ]
    runs = [
        config_for(base, regime, seed, out, chosen["simulator_beta"], steps)
        for regime in ORDER  # longest first
        if regime in regimes
        for seed in design["arms"]["seeds"]
    ]
    train_all(runs, jobs, f"collapse2: {len(runs)} runs")
    records: dict[str, list[dict[str, Any]]] = {}
    for config in runs:
        records.setdefault(config.regime, []).append(record(config))
    runtime = _add_runtime(out, time.monotonic() - started)
    result = analysis.analyse(records, expected, deciding, checks["C3"]["tv"])
    if Regime.VERBALIZED not in regimes:
        result["regimes"][Regime.VERBALIZED.value] = {
            "verdict": "not run",
            "uninformative_because": ["C3 failed: not run"],
        }
    # the configuration hashed without this machine's folders (flat prior, SmolLM2)
    portable = base.to_dict() | {
        "base_model": "",
        "simulator": {**base.to_dict()["simulator"], "model": ""},
    }
    results = {
        "experiment": "collapse2",
        "command": command,
        "provenance": provenance({"design": design, "run": portable})
        | {"commit": source[0], "dirty": source[1]},
        "runtime_s": round(runtime, 1),
        "design": design,
        "flat_prior": prior,
        "precondition": checks["precondition"],
        "pilot": chosen,
        "heldout_expected": expected,
        "deciding_panel": deciding,
        **result,
        "records": records,
    }
    (out / "results.json").write_text(json.dumps(results, indent=1))
    from training.collapse2.results_report import write

    write(results, out)
    return results


def _checks(out, base, domain, tasks, design, expected, deciding) -> dict[str, Any]:
    path = out / "checks.json"
    if path.is_file():
        return json.loads(path.read_text())
    from training.measures.collapse import simulator_exploit
    from training.rl.policy import LocalModel
    from training.rollouts.simulator import LocalUser

    # the frozen simulator's exploit, and the deciding panel's best ask, which must not be it
    lm = LocalModel.load(base.simulator_model_path())
    found = simulator_exploit(domain, tasks, LocalUser(lm, base.simulator))
    best = analysis.panel_best(expected, deciding)
    if set(best) & set(found["exploit"]):
        raise DesignError(f"the deciding panel's best ask is the exploit: {best}")
    precondition = {"exploit": found["exploit"], "deciding_best": best}
    c3_tv = None
    if Regime.VERBALIZED in design["arms"]["regimes"]:
        c3_tv = c3_total_variations(base, tasks, domain)
    checks = {
        "precondition": precondition,
        "C3": analysis.c3(c3_tv or []) | {"tv": c3_tv},
    }
    path.write_text(json.dumps(checks, indent=1))
    return checks


def _pilot(out: Path, design: dict[str, Any], runs: list[RunConfig]) -> dict[str, Any]:
    """The simulator KL weight, chosen as the design says from the pilot's C2 alone."""
    by_beta: dict[float, list[dict[str, Any]]] = {}
    for config in runs:
        by_beta.setdefault(config.simulator_beta, []).append(analysis.c2_seed(record(config)))
    scores = {
        beta: (
            sum(s["holds"] for s in seeds),
            statistics.fmean(s.get("punish", float("-inf")) for s in seeds),
            -beta,
        )
        for beta, seeds in by_beta.items()
    }
    beta = max(scores, key=lambda b: scores[b])
    chosen = {
        "simulator_beta": beta,
        "per_value": {str(b): s for b, s in by_beta.items()},
        "rule": "most pilot seeds passing C2, then larger mean punish margin, then smaller value",
    }
    (out / "pilot").mkdir(exist_ok=True)
    (out / "pilot" / "pilot.json").write_text(json.dumps(chosen, indent=1))
    return chosen
