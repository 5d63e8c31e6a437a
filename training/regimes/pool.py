"""The population of Population Self-Play (regime "population"): a FIFO pool of the last K simulator snapshots.

    <run>/pool/manifest.json   {"size": K, "entries": [{"name", "step", "path"}, ...]} oldest first
    <run>/pool/sim-step-000016/ one adapter folder per snapshot (full fine-tuning: a model folder)

The manifest is rewritten atomically after each change, so a restarted run finds the pool as it
was at its last snapshot. Snapshots from steps after the checkpoint a run resumes from are
dropped (that future is being replayed). An evicted snapshot's folder is deleted: the pool is
working state, and the simulator's weights at every checkpoint are kept with the checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# the pool's own manifest (its entries), not a checkpoint's
POOL_MANIFEST = "manifest.json"


@dataclass
class PoolEntry:
    name: str
    step: int
    path: str  # relative to the pool folder


class SimulatorPool:
    def __init__(self, folder: Path, size: int, writer: bool = True):
        """`writer` False: a data-parallel rank other than 0, which only reads the manifest
        rank 0 writes (`reload` after each change)."""
        if size < 1:
            raise ValueError(f"pool size must be at least 1, got {size}")
        self.folder, self.size, self.writer = Path(folder), size, writer
        self.entries: list[PoolEntry] = []
        self.reload()
        if self.entries and writer:
            self._evict()  # a smaller pool_size on restart keeps the newest

    def reload(self) -> None:
        """Read the manifest (none: an empty pool)."""
        manifest = self.folder / POOL_MANIFEST
        self.entries = []
        if manifest.is_file():
            data = json.loads(manifest.read_text())
            self.entries = [PoolEntry(**e) for e in data["entries"]]
            missing = [e.path for e in self.entries if not (self.folder / e.path).is_dir()]
            if missing:
                raise FileNotFoundError(
                    f"pool manifest {manifest} lists missing snapshots: {missing}"
                )

    def __len__(self) -> int:
        return len(self.entries)

    def path(self, entry: PoolEntry) -> Path:
        return self.folder / entry.path

    def add(self, step: int, save: Callable[[Path], None]) -> PoolEntry:
        """Save a snapshot with `save(folder)`, append it, evict the oldest beyond the size."""
        entry = PoolEntry(name=f"sim-step-{step:06d}", step=step, path=f"sim-step-{step:06d}")
        target = self.folder / entry.path
        if target.exists():
            shutil.rmtree(target)
        save(target)
        self.entries = [e for e in self.entries if e.step != step] + [entry]
        self._evict()
        return entry

    def drop_after(self, step: int) -> None:
        """Forget snapshots newer than `step` (the checkpoint a run resumes from)."""
        stale = [e for e in self.entries if e.step > step]
        self.entries = [e for e in self.entries if e.step <= step]
        for e in stale:
            shutil.rmtree(self.path(e), ignore_errors=True)
        if stale:
            self._write()

    def _evict(self) -> None:
        while len(self.entries) > self.size:
            oldest = self.entries.pop(0)
            shutil.rmtree(self.path(oldest), ignore_errors=True)
        self._write()

    def _write(self) -> None:
        if not self.writer:
            raise RuntimeError("only rank 0 writes the pool")
        self.folder.mkdir(parents=True, exist_ok=True)
        data = {"size": self.size, "entries": [e.__dict__ for e in self.entries]}
        tmp = self.folder / f"{POOL_MANIFEST}.tmp"
        tmp.write_text(json.dumps(data, indent=2))
        os.replace(tmp, self.folder / POOL_MANIFEST)
