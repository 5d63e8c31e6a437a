"""python -m training run CONFIG.toml [--steps N] [--output-dir DIR]

Trains the run the TOML file describes, with a progress bar; run it again to resume.
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
    args = parser.parse_args(argv)

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


if __name__ == "__main__":
    sys.exit(main())
