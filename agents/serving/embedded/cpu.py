"""The CPU the rest of the machine leaves the embedded engine, and the threads a pass takes.

The engine runs beside the web server, Celery, beat and whatever else a researcher's laptop
runs. torch's intra-op threads split each operation of a pass into equal parts and wait for
the last one: when another process holds one of the cores a part needs, that part waits for
the scheduler to hand the core back (a time slice, milliseconds), once per operation, hundreds
of times a step. Beside one busy Python loop on 2 cores, 8 concurrent requests on 2 threads
fell from 215 to 3.8 tokens/s (issue 36). So each pass takes no more threads than there are
cores the others leave free, measured here. A thread that waits spins briefly, then sleeps
(libgomp's default, which agents.serving.embedded.server leaves alone): within a pass the waits are
shorter than the spin, and beside a busy neighbour a pass runs on one thread, so none spins
for a core the neighbour holds.

The free cores are measured from Linux's counters, over the last WINDOW seconds: the busy
time of this process's cores (/proc/stat's per-CPU lines for its affinity), less this
process's own CPU time (/proc/self/stat), is what the others took. Where the counters are not
there (not Linux), every core counts as free.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable

WINDOW = 0.5  # seconds between measurements: a neighbour that starts is seen within a second
# /proc/stat's per-CPU columns after the name: user nice system idle iowait irq softirq steal
# (guest time is inside user). Idle and iowait are free; steal is taken by the hypervisor.
_IDLE_COLUMNS = (3, 4)


def threads_for(asked: int, free: float) -> int:
    """The threads a pass takes: those asked for, at most the free cores rounded to the
    nearest (a core the others use less than half the time counts as free), at least one."""
    return max(1, min(asked, math.floor(free + 0.5)))


def cpu_ticks(cpus: set[int], text: str) -> tuple[int, int]:
    """(busy, total) clock ticks of `cpus` from /proc/stat's text."""
    busy = total = 0
    for line in text.splitlines():
        name, *columns = line.split()
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        ticks = [int(column) for column in columns[:8]]
        idle = sum(ticks[i] for i in _IDLE_COLUMNS)
        busy, total = busy + sum(ticks) - idle, total + sum(ticks)
    return busy, total


def own_ticks(text: str) -> int:
    """This process's user + system clock ticks, all its threads, from /proc/self/stat."""
    fields = text.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of proc(5))


def _read(path: str) -> str:
    with open(path) as file:
        return file.read()


class CpuShare:
    """`free()`: how many of this process's cores the other processes left idle over the last
    window; measured at most once a WINDOW, from the thread that asks (the decoding thread)."""

    def __init__(
        self,
        cpus: set[int] | None = None,
        window: float = WINDOW,
        read: Callable[[str], str] = _read,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.cpus = cpus if cpus is not None else _affinity()
        self.window, self._read, self._clock = window, read, clock
        self._free = float(len(self.cpus))
        self._last = self._sample()

    def free(self) -> float:
        now = self._clock()
        if self._last is not None and now - self._last[0] >= self.window:
            sample = self._sample()
            if sample is not None:
                self._free = self._share(self._last, sample)
                self._last = sample
        return self._free

    def _share(self, before, after) -> float:
        (_, busy0, total0, own0), (_, busy1, total1, own1) = before, after
        if total1 <= total0:  # no tick yet on these cores: keep the last figure
            return self._free
        others = max(0, (busy1 - busy0) - (own1 - own0))  # own time may sit on other cores
        return max(0.0, len(self.cpus) * (1 - others / (total1 - total0)))

    def _sample(self) -> tuple[float, int, int, int] | None:
        try:
            busy, total = cpu_ticks(self.cpus, self._read("/proc/stat"))
            own = own_ticks(self._read("/proc/self/stat"))
        except (OSError, ValueError, IndexError):  # not Linux, or no /proc: no measurement
            return None
        return self._clock(), busy, total, own


def _affinity() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return set(range(os.cpu_count() or 1))
