"""The embedded engine beside busy neighbours (issue 36 point 8): each pass takes no more torch
threads than the cores other processes leave free, and torch's threads sleep while they wait."""

import os
import subprocess
import sys
import threading
import time

import pytest
import torch

from agents.serving.embedded.cpu import CpuShare, cpu_ticks, own_ticks, threads_for
from agents.serving.embedded.engine import Engine, Generation


@pytest.mark.parametrize(
    ("asked", "free", "threads"),
    [
        (2, 2.0, 2),  # a quiet machine: every thread asked for
        (2, 1.6, 2),  # a neighbour that takes a core less than half the time leaves it
        (2, 1.2, 1),  # a busy loop beside the engine's two threads takes 2/3 of a core
        (2, 0.9, 1),
        (2, 0.0, 1),  # everything taken: still one thread, the engine must go on
        (1, 2.0, 1),  # never more than asked for
        (8, 3.7, 4),
    ],
)
def test_a_pass_takes_the_free_cores_rounded_at_most_those_asked_for(asked, free, threads):
    assert threads_for(asked, free) == threads


def stat(*cpus: tuple[int, int]) -> str:
    """/proc/stat's text with per-CPU (busy, idle) ticks: busy as user, idle as idle."""
    lines = [f"cpu  {sum(b for b, _ in cpus)} 0 0 {sum(i for _, i in cpus)} 0 0 0 0 0 0"]
    lines += [f"cpu{n} {busy} 0 0 {idle} 0 0 0 0 0 0" for n, (busy, idle) in enumerate(cpus)]
    return "\n".join([*lines, "intr 1 2 3", "ctxt 9"])


def self_stat(utime: int, stime: int) -> str:
    return f"4242 (python -m x) R 1 1 1 0 -1 0 0 0 0 0 {utime} {stime} 0 0 20 0 3 0 1"


def test_the_ticks_are_read_from_procs_formats():
    text = "cpu  9 9 9 9 9 9 9 9 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\ncpu1 10 0 0 10 0 0 0 0 0 0\n"
    # busy: user nice system irq softirq steal; idle and iowait are free
    assert cpu_ticks({0}, text) == (1 + 2 + 3 + 6 + 7 + 8, 36)
    assert cpu_ticks({0, 1}, text) == (27 + 10, 36 + 20)
    assert own_ticks(self_stat(120, 30)) == 150


def test_the_free_share_is_what_the_others_leave_not_counting_the_engines_own_time():
    """Two cores over one window: a neighbour took all of cpu0, the engine half of cpu1."""
    now = [0.0]
    files = {"/proc/stat": stat((100, 100), (100, 100)), "/proc/self/stat": self_stat(10, 0)}
    share = CpuShare(cpus={0, 1}, read=files.__getitem__, clock=lambda: now[0])
    assert share.free() == 2.0  # nothing measured yet: every core
    files["/proc/stat"] = stat((200, 100), (150, 150))
    files["/proc/self/stat"] = self_stat(50, 10)  # the engine's 50 ticks on cpu1
    assert share.free() == 2.0, "measured again before the window passed"
    now[0] = 1.0
    assert share.free() == pytest.approx(1.0)  # 100 of 200 ticks the others': 2 x 0.5
    assert threads_for(2, share.free()) == 1


def test_a_busy_loop_on_a_core_leaves_it_no_free_share():
    """Real counters: a busy loop pinned to one core; whatever else runs only takes more."""
    core = min(os.sched_getaffinity(0))
    loop = subprocess.Popen(
        [sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{core}}})\nwhile 1: pass"]
    )
    try:
        share = CpuShare(cpus={core}, window=0.5)
        time.sleep(1.0)
        assert share.free() < 0.5
    finally:
        loop.kill()
        loop.wait()


@pytest.mark.parametrize(
    ("given", "spins"), [(None, "300000"), ("PASSIVE", "0"), ("ACTIVE", "30000000000")]
)
def test_the_engine_process_leaves_libgomps_brief_spin_before_torch_loads(given, spins):
    """libgomp reads OMP_WAIT_POLICY once, when torch loads it, and OMP_DISPLAY_ENV=VERBOSE
    makes it print what it made of it: how long a waiting thread spins before it sleeps. The
    engine leaves the default, 300000 rounds (its policy line says PASSIVE then too): sleeping
    at once (0) cost a quiet batch a quarter of its tokens (docs/serving.md). A value given by
    the caller is kept."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env["OMP_DISPLAY_ENV"] = "VERBOSE"
    if given:
        env["OMP_WAIT_POLICY"] = given
    run = subprocess.run(
        [sys.executable, "-m", "agents.serving.embedded.server", "--help"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "import torch" not in run.stderr
    assert f"GOMP_SPINCOUNT = '{spins}'" in run.stderr, run.stderr[-2000:]


class Share:
    """A measured share of the cores, fixed by the test."""

    def __init__(self, free: float):
        self.value = free

    def free(self) -> float:
        return self.value


@pytest.fixture(scope="module")
def engine(base_model):
    engine = Engine(base_model, max_batch=4, threads=1, batch_threads=2)
    yield engine
    engine.close()


def passes(engine: Engine, free: float) -> list[tuple[int, int]]:
    """(rows, torch threads) of each forward pass while three requests run beside a
    neighbour that leaves `free` cores."""
    engine.cpu = Share(free)
    seen = []
    forward = engine._forward

    def recording(input_ids, keys, **kwargs):  # on the decoding thread
        seen.append((input_ids.shape[0], torch.get_num_threads()))
        return forward(input_ids, keys, **kwargs)

    engine._forward = recording
    try:
        prompt = engine.tokenizer("Tell me about the sea.").input_ids
        jobs = [
            Generation(prompt_ids=prompt, max_new_tokens=6, temperature=0.7, seed=i)
            for i in range(3)
        ]
        runs = [threading.Thread(target=engine.generate, args=(job,)) for job in jobs]
        for run in runs:
            run.start()
        for run in runs:
            run.join(60)
    finally:
        del engine._forward
    return seen


def test_the_engines_passes_take_the_threads_the_neighbours_leave(engine):
    quiet = passes(engine, free=2.0)
    assert any(threads == 2 for _, threads in quiet), quiet  # prefills and wide steps
    busy = passes(engine, free=1.0)
    assert any(rows >= 2 for rows, _ in busy), busy
    assert {threads for _, threads in busy} == {1}, busy
