"""Each rank's peak memory in each phase of a step, written to <run>/memory/rank-K.json, so a
run's real footprint can be set beside the dry run's estimate for the same sizes
(training/tools/dryrun.py) and a GPU smoke can print it per phase.

On CUDA the measure is torch's allocator (`torch.cuda.max_memory_allocated`, reset at each
phase's start): the tensors a formula counts. On CPU it is the process's resident set: Linux's
peak (VmHWM) reset at each phase's start through /proc/self/clear_refs, so it includes the
interpreter and torch themselves; `start` (the resident set before any model was loaded) is
written beside it to take away. Elsewhere the lifetime peak (getrusage) stands in, not reset.

    {"rank": 0, "world": 2, "device": "cpu", "measure": "rss", "unit": "bytes",
     "start": 412000000,
     "phases": {"load": {"peak": ..., "times": 1}, "rollouts": {...}, "update": {...},
                "simulator_update": {...}, "evaluation": {...}, "checkpoint": {...}}}

A phase's figure is its largest peak over the run's steps; a resumed run adds to its file.
"""

from __future__ import annotations

import json
import re
import resource
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

FOLDER = "memory"
CLEAR_REFS, STATUS = Path("/proc/self/clear_refs"), Path("/proc/self/status")


def _rss(field: str) -> int | None:
    """VmHWM (peak) or VmRSS (now) of this process in bytes, None where /proc has none."""
    try:
        found = re.search(rf"{field}:\s+(\d+) kB", STATUS.read_text())
    except OSError:
        return None
    return int(found.group(1)) * 1024 if found else None


def _lifetime_peak() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, kB on Linux


class PhaseMemory:
    """This rank's peaks per phase (the module's docstring)."""

    def __init__(self, run_dir: Path, rank: int, world: int, device: torch.device | str):
        self.device = torch.device(device)
        self.path = Path(run_dir) / FOLDER / f"rank-{rank}.json"
        self.cuda = self.device.type == "cuda"
        saved: dict[str, Any] = {}
        if self.path.is_file():
            saved = json.loads(self.path.read_text())
        self.record = {
            "rank": rank,
            "world": world,
            "device": str(self.device),
            "measure": "cuda_max_allocated" if self.cuda else "rss",
            "unit": "bytes",
            "start": torch.cuda.memory_allocated(self.device) if self.cuda else _rss("VmRSS"),
            "phases": saved.get("phases", {}),
        }

    def _reset(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:
            CLEAR_REFS.write_text("5")  # Linux: VmHWM back to the resident set now
        except OSError:
            pass

    def _peak(self) -> int:
        if self.cuda:
            return torch.cuda.max_memory_allocated(self.device)
        return _rss("VmHWM") or _lifetime_peak()

    def loaded(self) -> None:
        """The peak so far (models loaded, not reset before) as phase `load`."""
        self._add("load", self._peak())

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self._reset()
        try:
            yield
        finally:
            self._add(name, self._peak())

    def _add(self, name: str, peak: int) -> None:
        seen = self.record["phases"].get(name, {"peak": 0, "times": 0})
        self.record["phases"][name] = {"peak": max(seen["peak"], peak), "times": seen["times"] + 1}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.record, indent=2))


def read_memory(run_dir: Path) -> list[dict[str, Any]]:
    """Every rank's record, by rank."""
    files = sorted((Path(run_dir) / FOLDER).glob("rank-*.json"))
    return sorted((json.loads(f.read_text()) for f in files), key=lambda r: r["rank"])
