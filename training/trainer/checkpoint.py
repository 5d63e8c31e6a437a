"""Checkpoints: one folder per saved step, servable as it is.

    <run>/checkpoints/step-000008/
        adapter_config.json, adapter_model.safetensors   the agent's LoRA adapter (peft layout:
                                                         vLLM --lora-modules NAME=<folder>, the
                                                         embedded engine); full fine-tuning
                                                         writes a whole model folder instead
        manifest.json        name, kind, base model, regime, domain, tool format, step,
                             metrics, config
        trainer_state.pt     optimizer(s) and RNG state, for resuming
        breaker.json         [breaker]: its state (thresholds, level, share), for resuming
        simulator/           co-training: the simulator's adapter (full fine-tuning: its
                             model folder) at this step (+ manifest.json)

A folder is written under a temporary name and renamed when complete, so a run killed while
saving never leaves a half checkpoint that a resume would pick up. Data-parallel, rank 0 writes
it (the state is global: every rank holds the same weights and optimizer) and renames it only
after every rank has reached the step's barrier, so a step in which any rank died is never a
checkpoint: a restart resumes from the last step all ranks finished. Every rank calls `save`:
under FSDP gathering the weights and optimizer state is a collective; the files stay the plain
ones (a PEFT adapter, torch's optimizer layout), so any process count resumes them.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from agents.serving.adapters import MANIFEST
from training.rollouts.agent import agent_tool_format

CHECKPOINTS = "checkpoints"
STATE = "trainer_state.pt"
PARTIAL = ".partial"
# a resumed run must train the same thing; steps, intervals and eval settings may change
SAME_RUN_KEYS = ("domain", "regime", "base_model", "finetune", "lora", "simulator", "group_size")
SAME_RUN_KEYS += ("weight_decay_skip_1d",)  # the optimizer's parameter groups (below)
# keys a checkpoint written before the setting existed lacks: their value then was the default
# (weight_decay_skip_1d: it sets the optimizer's parameter groups, so a saved state fits only
# the grouping it was saved with; torch's own error on load names neither)
SAVED_BEFORE = {"weight_decay_skip_1d": False}


class ResumeError(RuntimeError):
    pass


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / CHECKPOINTS / f"step-{step:06d}"


def read_manifest(folder: Path) -> dict[str, Any]:
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{folder} is not a checkpoint (no {MANIFEST})")
    return json.loads(path.read_text())


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    # a ".partial" folder may hold every file yet be incomplete: data-parallel, rank 0 writes it
    # all before the ranks' barrier, and a rank can die after that
    done = [
        p
        for p in root.glob("step-*")
        if p.suffix != PARTIAL and (p / MANIFEST).is_file() and (p / STATE).is_file()
    ]
    return sorted(done, key=lambda p: read_manifest(p)["step"])


def save(
    run_dir: Path,
    step: int,
    config: Any,
    agent: Any,
    regime: Any,
    metrics: dict[str, Any],
    ranks: Any = None,
    files: dict[str, Any] | None = None,
) -> Path:
    """Write the step's checkpoint (rank 0; every rank calls this and takes part in the
    gathering) and return its folder. `files`: more JSON files for it, {name: data} (the
    breaker's state, breaker.json), complete with it."""
    final = checkpoint_dir(run_dir, step)
    temp = final.with_name(final.name + PARTIAL)
    main = ranks is None or ranks.main
    state = {
        "step": step,
        "optimizer": agent.optimizer_state(),
        "torch_rng": torch.get_rng_state(),
    }
    with agent.gathered():
        if main:
            shutil.rmtree(temp, ignore_errors=True)
            agent.save(temp)
    state.update(regime.save(temp if main else None))
    if not main:
        save_barrier(ranks)  # rank 0 renames the checkpoint after this
        return final
    torch.save(state, temp / STATE)
    manifest = {
        "name": f"{config.name}-step{step}",
        "kind": "agent",
        "adapter": config.finetune == "lora",
        "base_model": str(config.base_model_path()),
        "domain": config.domain,
        "regime": config.regime,
        # how its agent writes tool calls ("json" | "native"): a study's arm serves it so
        "tool_format": agent_tool_format(config.tool_format, agent),
        "step": step,
        "metrics": metrics,
        "config": config.to_dict(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    _write_json(temp / MANIFEST, manifest)
    for name, data in (files or {}).items():
        _write_json(temp / name, data)
    if (temp / "simulator").is_dir():
        sim = {**manifest, "name": f"{config.name}-simulator-step{step}", "kind": "simulator"}
        del sim["tool_format"]  # the simulator calls no tools
        _write_json(temp / "simulator" / MANIFEST, sim)
    if ranks is not None:
        save_barrier(ranks)
    if final.exists():
        shutil.rmtree(final)  # the same step saved again (a replayed step after a resume)
    os.replace(temp, final)
    return final


def retained(found: list[Path], keep: int, best_by: str) -> list[Path]:
    """Of a run's complete checkpoints (oldest first), those kept_checkpoints keeps: every one
    with keep 0; else the last `keep` (the last is the one a resume loads, so it is always
    among them) and the best by the held-out figure `best_by` in its manifest's metrics (a
    checkpoint of a step without an evaluation has none and is never "best"; equal figures:
    the later)."""
    if keep == 0:
        return found
    kept = set(found[-keep:])
    scored = []
    for order, folder in enumerate(found):
        figure = read_manifest(folder).get("metrics", {}).get(best_by)
        if isinstance(figure, (int, float)):
            scored.append((figure, order, folder))
    if scored:
        kept.add(max(scored, key=lambda s: s[:2])[2])
    return [p for p in found if p in kept]


def prune(run_dir: Path, keep: int, best_by: str) -> list[Path]:
    """Delete the complete checkpoints `retained` does not keep (rank 0, after a save);
    returns those left, oldest first. A ".partial" folder is never touched here."""
    found = list_checkpoints(run_dir)
    kept = retained(found, keep, best_by)
    for folder in found:
        if folder not in kept:
            shutil.rmtree(folder)
    return kept


def save_barrier(ranks: Any) -> None:
    """Where every rank meets before rank 0 makes a checkpoint complete (renames it)."""
    ranks.barrier()


def resume(run_dir: Path, config: Any, agent: Any, regime: Any) -> int:
    """Load the last complete checkpoint into `agent` and `regime`; returns its step (0: none)."""
    found = list_checkpoints(run_dir)
    if not found:
        return 0
    folder = found[-1]
    manifest = read_manifest(folder)
    saved, current = manifest["config"], config.to_dict()
    changed = [k for k in SAME_RUN_KEYS if saved.get(k, SAVED_BEFORE.get(k)) != current.get(k)]
    if changed:
        raise ResumeError(
            f"{run_dir} holds a run with different {', '.join(changed)}; "
            "use another output_dir (or name) for a new run"
        )
    trained = manifest.get("tool_format")  # absent from checkpoints written before it was kept
    if trained and trained != agent_tool_format(config.tool_format, agent):
        raise ResumeError(
            f"{run_dir} holds a run whose agent calls tools in the {trained} format; "
            "use another output_dir (or name) for a new run"
        )
    # mapped, not read: each rank's pages of the whole optimizer state are the page cache's,
    # shared by the ranks of a node, and only the shard each rank takes is copied to its device
    state = torch.load(folder / STATE, weights_only=False, mmap=True)
    with agent.gathered(writeback=True):  # FSDP: every rank loads the same whole weights
        agent.load_weights(folder)
    agent.load_optimizer_state(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])
    regime.load(folder, state, manifest["step"])
    return int(manifest["step"])


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, default=str))
