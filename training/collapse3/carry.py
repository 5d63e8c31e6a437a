"""Carry an unfinished collapse3 folder from one machine session to the next.

collapse3 takes longer than one session on this 2-core machine (README.md, "Size"), and a
session's data/ is not kept: only what is committed is. The runner (hashed, unchanged) is
resumable: a finished stage's decision and a finished run are only read on a rerun. What it reads
of a finished run is its record.json (and, to know it is finished, its last checkpoint's manifest
and state file); of a stage, its decision file. So:

    python -m training.collapse3.carry export DIR docs/results/collapse3/carried
    python -m training.collapse3.carry restore docs/results/collapse3/carried DIR

(The committed run carried its folder this way from session 19 to session 21; once finished,
docs/results/collapse3 holds the whole run instead, and the carried folder went.)

`export` keeps, for every finished run, record.json, metrics.jsonl, config.json, exploit.json,
samples.jsonl and its last checkpoint's manifest (no weights: 11 MB a checkpoint), and the stage
files (checks.json, lr_pilot.json, gate.json), load.json, runtime.json and the invocation log.
An unfinished run is left out: it runs again from its first step. The flat prior's record is
kept as flat_prior.kept.json, beside the folder and not in it, so that the flat prior is made
again (its weights are not kept) and can be compared with the one the carried runs started from.

`restore` writes them back and marks each carried run finished with its manifest and an empty
state file, beside a RESTORED.txt saying that its weights were not kept. Nothing the analysis
reads is made up: record.json is the run's own. This module decides nothing and is not part of
the registration (registration.toml).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

RUN_FILES = ("record.json", "metrics.jsonl", "config.json", "exploit.json", "samples.jsonl")
STAGE_FILES = (
    "checks.json",
    "lr-pilot/lr_pilot.json",
    "gate/gate.json",
    "load.json",
    "runtime.json",
    "invocations.log",
)
KEPT_PRIOR = "flat_prior.kept.json"
CHECKPOINTS, MANIFEST, STATE = "checkpoints", "manifest.json", "trainer_state.pt"
RESTORED = "RESTORED.txt"


def finished_runs(out: Path) -> list[tuple[Path, Path]]:
    """(run folder, its last complete checkpoint) for every run under `out` that reached its
    configured steps and has its record."""
    found = []
    for config in sorted(Path(out).rglob("config.json")):
        run = config.parent
        if CHECKPOINTS in run.parts or not (run / "record.json").is_file():
            continue
        steps = json.loads(config.read_text())["steps"]
        done = [
            p
            for p in (run / CHECKPOINTS).glob("step-*")
            if not p.name.endswith(".partial")
            and (p / MANIFEST).is_file()
            and (p / STATE).is_file()
        ]
        last = max(done, key=lambda p: json.loads((p / MANIFEST).read_text())["step"], default=None)
        if last is not None and json.loads((last / MANIFEST).read_text())["step"] >= steps:
            found.append((run, last))
    return found


def export(out: Path, dest: Path) -> list[str]:
    out, dest = Path(out), Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    carried = []
    for run, last in finished_runs(out):
        target = dest / run.relative_to(out)
        target.mkdir(parents=True)
        for name in RUN_FILES:
            if (run / name).is_file():
                shutil.copy2(run / name, target / name)
        kept = target / CHECKPOINTS / last.name
        kept.mkdir(parents=True)
        shutil.copy2(last / MANIFEST, kept / MANIFEST)
        carried.append(str(run.relative_to(out)))
    for name in STAGE_FILES:
        if (out / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(out / name, dest / name)
    prior = out / "flat-prior" / "flat_prior.json"
    if prior.is_file():
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy2(prior, dest / KEPT_PRIOR)
    (dest / "carried.json").write_text(json.dumps({"runs": carried}, indent=1))
    return carried


def restore(source: Path, out: Path) -> list[str]:
    source, out = Path(source), Path(out)
    carried = json.loads((source / "carried.json").read_text())["runs"]
    for name in (*STAGE_FILES, KEPT_PRIOR):
        if (source / name).is_file():
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source / name, out / name)
    for relative in carried:
        run, target = source / relative, out / relative
        if target.exists():
            raise FileExistsError(f"{target} exists: restore into a folder without that run")
        target.mkdir(parents=True)
        for name in RUN_FILES:
            if (run / name).is_file():
                shutil.copy2(run / name, target / name)
        for kept in (run / CHECKPOINTS).glob("step-*"):
            marked = target / CHECKPOINTS / kept.name
            marked.mkdir(parents=True)
            shutil.copy2(kept / MANIFEST, marked / MANIFEST)
            (marked / STATE).write_bytes(b"")
            (marked / RESTORED).write_text(
                "Carried from an earlier session by training/collapse3/carry.py: the run finished "
                "there and its record.json is its own; its weights and optimizer state were not "
                "kept (this state file is empty).\n"
            )
    return carried


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.collapse3.carry", description=__doc__)
    parser.add_argument("action", choices=["export", "restore"])
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    args = parser.parse_args(argv)
    runs = (export if args.action == "export" else restore)(args.source, args.target)
    print(f"{args.action}: {len(runs)} finished runs")
    for run in runs:
        print(f"  {run}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
