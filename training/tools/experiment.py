"""`python -m training experiment collapse`: the simulator-collapse mechanism, reproduced.

One base config (training/configs/experiments/collapse.toml) is trained once per regime and seed
with the real trainer (training/trainer/loop.py: GRPO, the regime's simulator step, the pool, the held-out
panel), `jobs` runs at a time, each in its own process on one thread. Every run resumes from its
last checkpoint, so running the command again finishes an interrupted experiment; finished runs
are only read. Then DIR/results.json, DIR/results.md and the plots are written from the runs'
metrics.jsonl.

    DIR/runs/<regime>-seed<k>/   each run's folder (metrics.jsonl, samples, checkpoints, plots)
    DIR/results.json             the numbers (schema in `summarize`)
    DIR/results.md               the same as tables, with what it shows
    DIR/collapse.png             per step: train reward, exploit probability, decision entropies
    DIR/heldout.png              final held-out reward per user type and regime
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import shlex
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from agents.simulators.spec import SimulatorKind
from training.config import load_config, parse_config
from training.config_schema import RunConfig
from training.layout import EXPLOIT_FILE, METRICS_FILE
from training.vocabulary import Regime

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "experiments"
EXPERIMENTS = {"collapse": CONFIGS / "collapse.toml"}
# longest first, so that the runs pack onto the workers
ORDER = (Regime.VERBALIZED, Regime.POPULATION, Regime.COTRAIN, Regime.SINGLE)


def regime_config(
    base: RunConfig, regime: str, seed: int, out: Path, steps: int | None
) -> RunConfig:
    """The base config with only the regime, the seed and the folder changed (and, for the
    verbalized regime, the simulator made a Verbalized Sampling one of the same model)."""
    changes: dict[str, Any] = {
        "name": f"{base.name}-{regime}-seed{seed}",
        "regime": regime,
        "seed": seed,
        "output_dir": str(out / "runs" / f"{regime}-seed{seed}"),
    }
    if steps:
        changes["steps"] = steps
        changes["eval_every"] = min(base.eval_every, steps) if base.eval_every else 0
    kind = Regime(regime).simulator_kind  # the registry's: Verbalized Sampling's simulator
    if kind:
        changes["simulator"] = dataclasses.replace(
            base.simulator, kind=kind.value, name=f"{base.simulator.name}-vs"
        )
    return dataclasses.replace(base, **changes)


def _train(config: dict[str, Any]) -> str:
    from training.trainer.loop import train

    train(parse_config(config), show_progress=False)
    return config["name"]


def run(
    name: str,
    out: Path,
    *,
    seeds: int = 3,
    steps: int | None = None,
    jobs: int = 2,
    config: Path | None = None,
    command: str = "",
) -> dict[str, Any]:
    base = load_config(config or EXPERIMENTS[name])
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    runs = [
        regime_config(base, regime, seed, out, steps) for regime in ORDER for seed in range(seeds)
    ]
    started = time.monotonic()
    train_all(runs, jobs, f"{name}: {len(runs)} runs")
    runtime = _add_runtime(out, time.monotonic() - started)
    results = summarize(runs, base, runtime, command)
    for regime, block in results["regimes"].items():
        mine = sorted((c for c in runs if c.regime == regime), key=lambda c: c.seed)
        block["final_simulator_reward_per_ask"] = [final_simulator(c) for c in mine]
    write(results, out)
    return results


def train_all(runs: list[RunConfig], jobs: int, desc: str) -> None:
    """Train `runs` (those not finished yet), `jobs` at a time, each in its own spawned process,
    with one progress bar over all their steps. RuntimeError naming every run that failed."""
    from tqdm import tqdm

    total = sum(c.steps for c in runs)
    bar = tqdm(total=total, desc=desc, unit="step")
    failures: list[str] = []
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        todo = [c for c in runs if not _finished(c)]  # a finished run is only read
        futures = {pool.submit(_train, c.to_dict()): c for c in todo}
        pending = set(futures)
        while pending:
            time.sleep(2)
            done = sum(min(len(_rows(c.run_dir())), c.steps) for c in runs)
            if done != bar.n:
                bar.update(done - bar.n)
            for future in [f for f in pending if f.done()]:
                pending.discard(future)
                if future.exception() is not None:
                    failures.append(f"{futures[future].name}: {future.exception()}")
    bar.n = sum(min(len(_rows(c.run_dir())), c.steps) for c in runs)
    bar.close()
    if failures:
        raise RuntimeError("runs failed:\n" + "\n".join(failures))


def provenance(config: dict[str, Any]) -> dict[str, Any]:
    """What a results file came from: the commit (with "dirty": uncommitted changes to tracked
    files) and the SHA-256 of the configuration as canonical JSON."""
    import hashlib
    import subprocess

    root = Path(__file__).resolve().parents[2]

    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", *args], cwd=root, capture_output=True, text=True, check=True
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return ""

    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return {
        "commit": git("rev-parse", "HEAD") or "unknown",
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "config_sha256": hashlib.sha256(canonical.encode()).hexdigest(),
    }


def summarize(runs: list[RunConfig], base: RunConfig, runtime: float, command: str) -> dict:
    """results.json: per regime, per seed and per step where the metric is per step."""
    regimes: dict[str, Any] = {}
    for regime in (r.value for r in Regime):
        mine = sorted((c for c in runs if c.regime == regime), key=lambda c: c.seed)
        if not mine:
            continue
        rows = [_rows(c.run_dir()) for c in mine]
        finals = [_last_eval(r) for r in rows]
        types = [s.name for s in base.heldout]
        regimes[regime] = {
            "seeds": [c.seed for c in mine],
            "train_reward": [_series(r, "reward_mean") for r in rows],
            "agent_entropy": [_series(r, "agent/decision_entropy") for r in rows],
            "agent_token_entropy": [_series(r, "entropy") for r in rows],
            "p_exploit": [_series(r, "agent/p_exploit") for r in rows],
            "simulator_entropy": [_series(r, "sim/decision_entropy") for r in rows],
            "reward_var_simulator": [_series(r, "reward_var/simulator") for r in rows],
            "reward_var_agent": [_series(r, "reward_var/agent") for r in rows],
            "heldout_reward": {
                "final": [f.get("heldout/reward") for f in finals],
                "worst_type": [f.get("heldout/worst_reward") for f in finals],
                "per_type": {t: [f.get(f"heldout/{t}/reward") for f in finals] for t in types},
            },
            "heldout_success": {
                "final": [f.get("heldout/success") for f in finals],
                "per_type": {t: [f.get(f"heldout/{t}/success") for f in finals] for t in types},
            },
            "optimizer_steps": [int(sum(x.get("optimizer_step", 0) for x in r)) for r in rows],
            "run_time_s": [round(sum(x.get("time_step", 0) for x in r), 1) for r in rows],
        }
    exploit_file = runs[0].run_dir() / EXPLOIT_FILE
    return {
        "experiment": "collapse",
        "command": command,
        "provenance": provenance(base.to_dict()),
        "steps": max(c.steps for c in runs),
        "group_size": base.group_size,
        "batch_tasks": base.batch_tasks,
        "runtime_s": round(runtime, 1),
        "domain": base.domain,
        "exploit": json.loads(exploit_file.read_text()) if exploit_file.is_file() else None,
        "heldout_types": [s.script or s.name for s in base.heldout],
        "config": base.to_dict(),
        "regimes": regimes,
    }


def final_simulator(config: RunConfig) -> dict[str, float] | None:
    """Each ask's exact expected reward against the simulator the agent ended up facing: the
    co-trained simulator of the last checkpoint (a frozen one never changes: exploit.json).
    Says whether co-training made the exploit less rewarding than the other asks."""
    from training.measures.collapse import simulator_exploit
    from training.rl.policy import LocalModel
    from training.rollouts.simulator import LocalUser
    from training.trainer.checkpoint import list_checkpoints
    from training.trainer.loop import select_scenarios

    run_dir = config.run_dir()
    if config.simulator.kind == SimulatorKind.VERBALIZED:
        return None  # what a Verbalized Sampling simulator writes is sampled: nothing exact
    if not config.trains_simulator:
        path = run_dir / EXPLOIT_FILE
        return json.loads(path.read_text())["expected_reward"] if path.is_file() else None
    saved = list_checkpoints(run_dir)
    if not saved or not (saved[-1] / "simulator").is_dir():
        return None
    lm = LocalModel.load(
        config.simulator_model_path(), config.dtype, config.device, str(saved[-1] / "simulator")
    )
    domain = config.build_domain()
    user = LocalUser(lm, dataclasses.replace(config.simulator, kind="plain"))
    found = simulator_exploit(domain, select_scenarios(domain, config.tasks, "train"), user)
    return found["expected_reward"] if found else None


def write(results: dict[str, Any], out: Path) -> None:
    (out / "results.json").write_text(json.dumps(results, indent=1))
    plot(results, out)
    (out / "results.md").write_text(markdown(results))


def markdown(results: dict[str, Any]) -> str:
    regimes = results["regimes"]
    types = list(next(iter(regimes.values()))["heldout_reward"]["per_type"])
    lines = [
        "# Simulator collapse on a 135M model (P4G decision episode)",
        "",
        f"`{results['command']}`: {len(regimes)} regimes x {len(next(iter(regimes.values()))['seeds'])} "
        f"seeds, {results['steps']} steps of {results['batch_tasks']} task x G = "
        f"{results['group_size']} rollouts, {results['runtime_s'] / 60:.0f} minutes in all.",
        "",
        provenance_line(results.get("provenance")),
        "",
        "Mean over seeds (min to max in brackets). Final = the last step; held-out = the "
        "scripted panel after the last step.",
        "",
        "| regime | train reward (first -> final) | p(exploit) (first -> final) | agent decision "
        "entropy (first -> final) | simulator decision entropy (final) | held-out reward | "
        "worst held-out type | optimizer steps |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for regime, r in regimes.items():
        lines.append(
            f"| {regime} | {_trend(r['train_reward'])} | {_trend(r['p_exploit'])} | "
            f"{_trend(r['agent_entropy'])} | {_cell([s[-1] for s in r['simulator_entropy'] if s])} | "
            f"{_cell(r['heldout_reward']['final'])} | {_cell(r['heldout_reward']['worst_type'])} | "
            f"{_cell(r['optimizer_steps'], '.0f')} |"
        )
    lines += ["", "Held-out reward per user type:", "", "| regime | " + " | ".join(types) + " |"]
    lines.append("|---" * (len(types) + 1) + "|")
    for regime, r in regimes.items():
        per = r["heldout_reward"]["per_type"]
        lines.append(f"| {regime} | " + " | ".join(_cell(per[t]) for t in types) + " |")
    asks = [a for a in (results.get("exploit") or {}).get("expected_reward", {})]
    if asks and any(any(r.get("final_simulator_reward_per_ask") or []) for r in regimes.values()):
        lines += [
            "",
            "Each ask's expected reward against the simulator the agent faced at the end (the "
            "frozen one, or the co-trained one of the last checkpoint), mean over seeds; n/a for "
            "Verbalized Sampling, whose written distribution is sampled, not exact:",
            "",
            "| regime | " + " | ".join(_short(a) for a in asks) + " |",
            "|---" * (len(asks) + 1) + "|",
        ]
        for regime, r in regimes.items():
            seeds = [x for x in r.get("final_simulator_reward_per_ask") or [] if x]
            cells = [f"{_mean([x[a] for x in seeds]):.2f}" if seeds else "n/a" for a in asks]
            lines.append(f"| {regime} | " + " | ".join(cells) + " |")
    exploit = results.get("exploit")
    if exploit:
        lines += ["", "The frozen simulator's expected reward per ask (exact, at the start):", ""]
        for ask, value in sorted(exploit["expected_reward"].items(), key=lambda kv: -kv[1]):
            mark = " (exploit)" if ask in exploit["exploit"] else ""
            lines.append(f"- {value:.3f}{mark}: {ask}")
    lines += ["", "![per step](collapse.png)", "", "![held-out](heldout.png)", ""]
    return "\n".join(lines)


def provenance_line(found: dict[str, Any] | None) -> str:
    if not found:
        return "Commit and configuration hash: not recorded."
    dirty = " (with uncommitted changes)" if found.get("dirty") else ""
    return f"Commit {found['commit']}{dirty}; configuration SHA-256 {found['config_sha256']}." + (
        f" {found['note']}" if found.get("note") else ""
    )


def plot(results: dict[str, Any], out: Path) -> None:
    from training.measures.figures import figure, save, seed_panels

    regimes = results["regimes"]
    panels = [
        ("train_reward", "train reward"),
        ("p_exploit", "p(agent asks the exploit)"),
        ("agent_entropy", "agent decision entropy (nats)"),
        ("simulator_entropy", "simulator decision entropy (nats)"),
    ]
    seed_panels(
        out / "collapse.png",
        [
            (title, {g: [s for s in r[key] if s] for g, r in regimes.items()})
            for key, title in panels
        ],
        spread="band",
    )

    types = list(next(iter(regimes.values()))["heldout_reward"]["per_type"])
    fig, (ax,) = figure(1.6 * (len(types) + 1) + 2, 3.6)
    width = 0.8 / len(regimes)
    labels = [*types, "mean"]
    for k, (regime, r) in enumerate(regimes.items()):
        values = [r["heldout_reward"]["per_type"][t] for t in types] + [
            r["heldout_reward"]["final"]
        ]
        xs = [i + k * width for i in range(len(labels))]
        ax.bar(xs, [_mean(v) for v in values], width, label=regime)
        for x, v in zip(xs, values, strict=True):
            ax.scatter([x] * len(v), v, color="black", s=6, zorder=3)
    ax.set_xticks([i + width * (len(regimes) - 1) / 2 for i in range(len(labels))], labels)
    ax.set_ylabel("held-out reward")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    ax.set_title("final held-out reward per user type (bars: mean over seeds; dots: seeds)")
    save(fig, out / "heldout.png")


# -- helpers -----------------------------------------------------------------------------------


def _finished(config: RunConfig) -> bool:
    from training.trainer.checkpoint import list_checkpoints, read_manifest

    saved = list_checkpoints(config.run_dir())
    return bool(saved) and read_manifest(saved[-1])["step"] >= config.steps


def _rows(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _series(rows: list[dict[str, Any]], key: str) -> list[float]:
    return [row[key] for row in rows if isinstance(row.get(key), int | float)]


def _last_eval(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return next((r for r in reversed(rows) if "heldout/reward" in r), {})


def _mean(values: list[Any]) -> float:
    numbers = [v for v in values if isinstance(v, int | float)]
    return statistics.fmean(numbers) if numbers else float("nan")


def _cell(values: list[Any], fmt: str = ".3f") -> str:
    numbers = [v for v in values if isinstance(v, int | float)]
    if not numbers:
        return "n/a"
    return f"{statistics.fmean(numbers):{fmt}} [{min(numbers):{fmt}}, {max(numbers):{fmt}}]"


def _trend(series: list[list[float]]) -> str:
    seeds = [s for s in series if s]
    if not seeds:
        return "n/a"
    return f"{_mean([s[0] for s in seeds]):.3f} -> {_cell([s[-1] for s in seeds])}"


def _short(ask: str) -> str:
    """'emotion $2' for an ask of the decision episode (its appeal and amount)."""
    from agents.domains.p4g.decision import ASKS

    for (appeal, amount), text in ASKS.items():
        if text == ask:
            return f"{appeal} ${amount:g}"
    return ask[:20]


def _add_runtime(out: Path, seconds: float) -> float:
    """Wall time summed over the invocations that built this folder (a resumed experiment)."""
    path = out / "runtime.json"
    before = json.loads(path.read_text())["runtime_s"] if path.is_file() else 0.0
    total = before + seconds
    path.write_text(json.dumps({"runtime_s": total}))
    return total


def command_line(argv: list[str]) -> str:
    return "python -m training " + " ".join(shlex.quote(a) for a in argv)


if __name__ == "__main__":  # pragma: no cover - use python -m training experiment
    sys.exit("use: python -m training experiment collapse")
