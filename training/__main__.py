"""python -m training run CONFIG.toml [--set KEY=VALUE ...] [--steps N] [--output-dir DIR]
python -m training run CONFIG.toml --dry-run [--offline] [--json] [--accelerate-config FILE]
python -m training experiment collapse [--seeds N] [--steps N] [--out DIR] [--jobs J]
python -m training experiment collapse2 [--out DIR] [--jobs J]
python -m training experiment collapse3 [--out DIR] [--jobs J]
python -m training paper [--json]

`run` trains the run the TOML file describes, with a progress bar; run it again to resume.
Exit status: 0 done, 1 a failure, 2 a bad config or resume, 3 stopped by the breaker
([breaker]: red; resumable, and the resumed run re-diversifies the simulators).
`--set` changes any key of the file (dotted into tables: `--set lora.r=4`), checked with it.
`--dry-run` checks the wiring without training (training/tools/dryrun.py): config, accelerate settings,
endpoints and their models, one request shaped for its provider per endpoint simulator, memory
per device; `--offline` only what needs no network or weights.
`experiment collapse` trains every regime on the P4G decision episode for each seed and writes
DIR/results.json, DIR/results.md and plots (training/tools/experiment.py); run it again to resume.
`experiment collapse2` is the pre-registered one (training/collapse2/: its design, analysis and
verdict rule are fixed; --seeds, --steps and --config do not apply); `experiment collapse3` is
its successor (training/collapse3/: design, analysis and runner registered by hash, the same three
options refused).
`paper` lists the paper's results (training/tools/paper.py): each one's config, the command for one
8-GPU node, the memory per GPU from the offline dry run, and where it differs from the release.
"""

from __future__ import annotations

import argparse
import os
import sys

from agents.domains import DOMAINS
from agents.environment import setting
from agents.simulators.spec import SimulatorKind
from agents.simulators.verbalized import MODES
from training.config import load_config
from training.config_keys import ConfigError, parse_assignment
from training.layout import METRICS_FILE
from training.vocabulary import SIMULATOR_REWARDS, Regime

RANK = setting(
    "RANK",
    "int",
    0,
    least=0,
    help="set by accelerate or torchrun: this process's rank; only rank 0 reports a run",
)


def vocabularies() -> str:
    """The names a config accepts, for the help text (read from where they are declared)."""
    return (
        f"domains: {', '.join(DOMAINS)}; "
        f"regimes: {', '.join(f'{name} ({label})' for name, label in Regime.choices())}; "
        f"simulator kinds: {', '.join(SimulatorKind)}; draw modes: {', '.join(MODES)}; "
        f"simulator rewards: {', '.join(SIMULATOR_REWARDS)}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m training", description=__doc__, epilog=vocabularies()
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "run", help="train (or resume) the run a TOML config describes", epilog=vocabularies()
    )
    run.add_argument("config", help="path to the run's TOML file (see training/configs/)")
    run.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a key of the file, e.g. regime=cotrain, simulator.draw=uniform, "
        "lora.r=4 (values are TOML; a bare word is a string)",
    )
    run.add_argument("--steps", type=int, help="override `steps` (extend a finished run)")
    run.add_argument("--output-dir", help="override `output_dir`")
    run.add_argument(
        "--progress-file",
        help="rank 0 writes each step's progress (JSON) here: how the TrainingRun's task follows"
        " a launched run",
    )
    run.add_argument(
        "--dry-run", action="store_true", help="check the wiring and exit (non-zero on a failure)"
    )
    run.add_argument(
        "--offline", action="store_true", help="--dry-run: only checks needing no network/weights"
    )
    run.add_argument("--json", action="store_true", help="--dry-run: print the result as JSON")
    run.add_argument(
        "--accelerate-config",
        default="",
        metavar="FILE",
        help="--dry-run: the accelerate settings file the run is launched with",
    )
    run.add_argument(
        "--device-memory",
        type=float,
        metavar="GIB",
        help="--dry-run: one device's memory (default: the GPU seen, else 80 GiB; CPU: RAM)",
    )
    experiment = commands.add_parser(
        "experiment", help="reproduce simulator collapse: every regime x seeds (see README)"
    )
    experiment.add_argument(
        "name", choices=["collapse", "collapse2", "collapse3"], help="the experiment"
    )
    experiment.add_argument("--seeds", type=int, default=3, help="seeds per regime (default 3)")
    experiment.add_argument("--steps", type=int, help="override the config's steps")
    experiment.add_argument(
        "--out", default="", help="output folder (default <data dir>/experiments/collapse)"
    )
    experiment.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2)")
    experiment.add_argument("--config", help="another base config (default: the shipped one)")
    paper = commands.add_parser(
        "paper", help="the paper's results: config, 8-GPU command, memory, release differences"
    )
    paper.add_argument("--json", action="store_true", help="print the table as JSON")
    args = parser.parse_args(argv if argv is not None else sys.argv[1:])
    if args.command == "paper":
        return _paper(args)
    if args.command == "experiment":
        return _experiment(args, argv if argv is not None else sys.argv[1:])

    try:
        overrides = dict(parse_assignment(text) for text in args.overrides)
        if args.steps is not None:
            overrides["steps"] = args.steps
        if args.output_dir:
            overrides["output_dir"] = args.output_dir
        if args.dry_run:
            return _dry_run(args, overrides)
        if args.offline or args.json or args.accelerate_config or args.device_memory:
            raise ConfigError(
                "--offline, --json, --accelerate-config, --device-memory need --dry-run"
            )
        config = load_config(args.config, overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    from training.measures.breaker import STOPPED_EXIT, BreakerStopped
    from training.trainer.checkpoint import ResumeError
    from training.trainer.loop import train  # torch and transformers load only for a valid config

    try:
        write = _progress_file(args.progress_file)  # the TrainingRun's task follows both
        checkpoints = train(config, progress_callback=write, within_step=write)
    except (ResumeError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BreakerStopped as stop:  # on purpose and resumable: its own exit status
        if RANK.read() == 0:
            print(f"stopped by the breaker: {stop.reason}", file=sys.stderr)
            print(f"checkpoint: {stop.checkpoint}", file=sys.stderr)
            print(
                "resume: run the same command again (the simulators are re-diversified"
                " before the next step)",
                file=sys.stderr,
            )
        return STOPPED_EXIT
    if RANK.read() != 0:
        return 0  # rank 0 reports the run
    run_dir = config.run_dir()
    print(f"run folder: {run_dir}")
    print(f"metrics:    {run_dir / METRICS_FILE}")
    for folder in checkpoints:
        print(f"checkpoint: {folder}")
    return 0


def _progress_file(path: str | None):
    if not path:
        return None
    import json

    def write(progress: dict) -> None:
        temp = f"{path}.tmp"
        with open(temp, "w") as f:
            json.dump(progress, f, default=str)
        os.replace(temp, path)  # the reader never sees half a file

    return write


def _dry_run(args: argparse.Namespace, overrides: dict) -> int:
    import json

    from training.tools.dryrun import dry_run, render

    result = dry_run(
        args.config,
        overrides,
        offline=args.offline,
        accelerate_config=args.accelerate_config,
        device_gib=args.device_memory,
    )
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 0 if result["ok"] else 1


def _paper(args: argparse.Namespace) -> int:
    import json

    from training.tools.paper import render, table

    data = table()
    print(json.dumps(data, indent=2) if args.json else render(data))
    return 0 if all(row["ready"] for row in data["results"]) else 1


def _experiment(args: argparse.Namespace, argv: list[str]) -> int:
    from pathlib import Path

    if args.seeds < 1 or (args.steps is not None and args.steps < 1) or args.jobs < 1:
        print("error: --seeds, --steps and --jobs must be at least 1", file=sys.stderr)
        return 2
    from agents.paths import data_dir
    from training.tools.experiment import command_line, run

    out = Path(args.out) if args.out else data_dir() / "experiments" / args.name
    if args.name in ("collapse2", "collapse3"):
        return _collapse2(args, argv, out)
    try:
        results = run(
            args.name,
            out,
            seeds=args.seeds,
            steps=args.steps,
            jobs=args.jobs,
            config=Path(args.config) if args.config else None,
            command=command_line(argv),
        )
    except (ConfigError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"results: {out / 'results.json'}")
    print(f"report:  {out / 'results.md'}")
    print(f"runtime: {results['runtime_s'] / 60:.1f} minutes")
    return 0


def _collapse2(args: argparse.Namespace, argv: list[str], out) -> int:
    """collapse2 and collapse3: pre-registered, so nothing the design fixes is an option."""
    import importlib

    from training.tools.experiment import command_line

    run = importlib.import_module(f"training.{args.name}.runner").run

    fixed = [
        f"--{k}"
        for k in ("seeds", "steps", "config")
        if f"--{k}" in argv or any(a.startswith(f"--{k}=") for a in argv)
    ]
    if fixed:
        print(
            f"error: {args.name}'s design is fixed: {', '.join(fixed)} does not apply",
            file=sys.stderr,
        )
        return 2
    try:
        results = run(out, jobs=args.jobs, command=command_line(argv))
    except (ConfigError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"report:  {out / 'results.md'}")
    for regime, block in results["regimes"].items():
        if regime != Regime.SINGLE:
            print(f"{regime}: {block['verdict']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
