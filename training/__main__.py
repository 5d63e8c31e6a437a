"""python -m training run CONFIG.toml [--steps N] [--output-dir DIR]
python -m training experiment collapse [--seeds N] [--steps N] [--out DIR] [--jobs J]

`run` trains the run the TOML file describes, with a progress bar; run it again to resume.
`experiment collapse` trains every regime on the P4G decision episode for each seed and writes
DIR/results.json, DIR/results.md and plots (training/experiment.py); run it again to resume.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from training.config import ConfigError, load_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="train (or resume) the run a TOML config describes")
    run.add_argument("config", help="path to the run's TOML file (see training/configs/)")
    run.add_argument("--steps", type=int, help="override `steps` (extend a finished run)")
    run.add_argument("--output-dir", help="override `output_dir`")
    experiment = commands.add_parser(
        "experiment", help="reproduce simulator collapse: every regime x seeds (see README)"
    )
    experiment.add_argument("name", choices=["collapse"], help="the experiment")
    experiment.add_argument("--seeds", type=int, default=3, help="seeds per regime (default 3)")
    experiment.add_argument("--steps", type=int, help="override the config's steps")
    experiment.add_argument(
        "--out", default="", help="output folder (default <data dir>/experiments/collapse)"
    )
    experiment.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2)")
    experiment.add_argument("--config", help="another base config (default: the shipped one)")
    args = parser.parse_args(argv if argv is not None else sys.argv[1:])
    if args.command == "experiment":
        return _experiment(args, argv if argv is not None else sys.argv[1:])

    try:
        config = load_config(args.config)
        changes = {}
        if args.steps is not None:
            changes["steps"] = args.steps
        if args.output_dir:
            changes["output_dir"] = args.output_dir
        config = dataclasses.replace(config, **changes).validate()
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    from training.checkpoint import ResumeError
    from training.run import train  # torch and transformers load only for a valid config

    try:
        checkpoints = train(config)
    except (ResumeError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    run_dir = config.run_dir()
    print(f"run folder: {run_dir}")
    print(f"metrics:    {run_dir / 'metrics.jsonl'}")
    for folder in checkpoints:
        print(f"checkpoint: {folder}")
    return 0


def _experiment(args: argparse.Namespace, argv: list[str]) -> int:
    from pathlib import Path

    if args.seeds < 1 or (args.steps is not None and args.steps < 1) or args.jobs < 1:
        print("error: --seeds, --steps and --jobs must be at least 1", file=sys.stderr)
        return 2
    from agents.paths import data_dir
    from training.experiment import command_line, run

    out = Path(args.out) if args.out else data_dir() / "experiments" / args.name
    try:
        results = run(
            args.name, out, seeds=args.seeds, steps=args.steps, jobs=args.jobs,
            config=Path(args.config) if args.config else None, command=command_line(argv),
        )  # fmt: skip
    except (ConfigError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"results: {out / 'results.json'}")
    print(f"report:  {out / 'results.md'}")
    print(f"runtime: {results['runtime_s'] / 60:.1f} minutes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
