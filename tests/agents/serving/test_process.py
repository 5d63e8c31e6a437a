"""agents.serving.process: the one way parley starts, waits for and stops its servers."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents.serving.process import (
    StartError,
    Supervised,
    free_port,
    port_is_free,
    spawn,
    stop,
    wait_healthy,
)


def gone(pid: int, seconds: float = 10) -> bool:
    """The process has exited (a zombie nobody reaped yet counts: it runs no more)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def file_server(folder, port):
    """A real HTTP server whose /health is a file in `folder`."""
    return [
        sys.executable,
        "-m",
        "http.server",
        str(port),
        "--bind",
        "127.0.0.1",
        "--directory",
        str(folder),
    ]


def test_a_server_is_waited_for_and_stopped_with_its_temporary_log(tmp_path):
    (tmp_path / "health").write_text("ok")
    port = free_port()
    assert port_is_free("127.0.0.1", port)
    process = spawn(file_server(tmp_path, port))
    try:
        wait_healthy(process, f"http://127.0.0.1:{port}/health", timeout=30)
        assert not port_is_free("127.0.0.1", port)
    finally:
        stop(process)
    assert process.returncode is not None
    assert port_is_free("127.0.0.1", port)
    assert not process.log_path.exists()  # a log spawn() made goes with the process


def test_a_server_that_exits_while_starting_is_an_error_with_its_log(tmp_path):
    log = tmp_path / "child.log"
    process = spawn([sys.executable, "-c", "print('no model here'); raise SystemExit(3)"], log)
    with pytest.raises(StartError, match=r"(?s)The engine exited with code 3.*no model here"):
        wait_healthy(process, "http://127.0.0.1:9/health", timeout=30, name="The engine")
    stop(process)
    assert log.exists()  # a log the caller named is kept


def test_a_server_that_never_answers_times_out(tmp_path):
    (tmp_path / "other").write_text("ok")  # serves, but has no /health
    port = free_port()
    process = spawn(file_server(tmp_path, port))
    try:
        with pytest.raises(StartError, match="did not become ready in 1s"):
            wait_healthy(process, f"http://127.0.0.1:{port}/health", timeout=1)
    finally:
        stop(process)


def test_stopping_a_process_group_ends_its_children(tmp_path):
    """vLLM's server runs its engine core in a child: stopping the server must end both."""
    child_pid = tmp_path / "child.pid"
    script = (
        "import subprocess, sys, time, pathlib\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"pathlib.Path({str(child_pid)!r}).write_text(str(c.pid))\n"
        "time.sleep(600)\n"
    )
    process = spawn([sys.executable, "-c", script], own_group=True)
    deadline = time.monotonic() + 30
    while not child_pid.exists() or not child_pid.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    stop(process)
    assert gone(int(child_pid.read_text()))


def test_processes_deaf_to_sigterm_are_killed_at_one_deadline(tmp_path):
    """Two processes that ignore SIGTERM are both killed `timeout` seconds after stop() began,
    not one timeout after the other (serve_agents' Ctrl-C stops every replica this way)."""
    ready = [tmp_path / f"ready-{i}" for i in range(2)]
    deaf = (
        "import pathlib, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "pathlib.Path(sys.argv[1]).touch()\n"
        "time.sleep(600)\n"
    )
    processes = [spawn([sys.executable, "-c", deaf, str(r)]) for r in ready]
    deadline = time.monotonic() + 30
    while not all(r.exists() for r in ready):  # both ignore SIGTERM from here on
        assert time.monotonic() < deadline
        time.sleep(0.05)
    began = time.monotonic()
    stop(*processes, timeout=3)
    took = time.monotonic() - began
    assert all(p.returncode == -signal.SIGKILL for p in processes)
    assert took < 5, f"stop took {took:.1f} s for a 3 s timeout (one after the other: 6 s)"


def test_a_child_dies_with_the_process_that_spawned_it(tmp_path):
    """A parent killed outright (SIGKILL: no cleanup runs) leaves no server behind."""
    child_pid = tmp_path / "child.pid"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import pathlib, sys, time\n"
            "from agents.serving.process import spawn\n"
            "p = spawn([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
            f"pathlib.Path({str(child_pid)!r}).write_text(str(p.pid))\n"
            "time.sleep(600)\n",
        ]
    )
    try:
        deadline = time.monotonic() + 30
        while not child_pid.exists() or not child_pid.read_text():
            assert time.monotonic() < deadline and parent.poll() is None
            time.sleep(0.05)
        pid = int(child_pid.read_text())
        assert not gone(pid, 0.2)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert gone(pid)
    finally:
        parent.kill()


def checked_until(children, words: str, seconds: float = 30) -> list[str]:
    """What the children's checks say, up to the first line with `words`."""
    lines, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        lines += [line for child in children if (line := child.check())]
        if any(words in line for line in lines):
            return lines
        time.sleep(0.05)
    pytest.fail(f"no line with {words!r} in {seconds}s: {lines}")


def test_a_killed_child_is_started_again_and_the_others_run_on(tmp_path):
    """`make demo` and serve_agents: one child killed outright (a replica, the web server) is
    started again, after longer waits if it keeps dying, and the others never stop."""
    (tmp_path / "health").write_text("ok")
    ports = [free_port(), free_port()]
    children = []
    for port in ports:
        launch = lambda port=port: spawn(file_server(tmp_path, port))  # noqa: E731
        children.append(Supervised(f"server {port}", launch(), launch, first=1.0))
    first, other = children
    try:
        for port, child in zip(ports, children, strict=True):
            wait_healthy(child.process, f"http://127.0.0.1:{port}/health", timeout=30)
        other_pid = other.process.pid
        for wait in (1, 2):  # it stops again soon after starting: the wait doubles
            killed = first.process.pid
            os.kill(killed, signal.SIGKILL)
            stopped, started = checked_until(children, "started again")
            assert stopped.startswith(f"server {ports[0]} stopped (code -9); ")
            assert f"starting it again in {wait} s" in stopped
            assert started == f"server {ports[0]} started again (pid {first.process.pid})"
            assert first.process.pid != killed
            wait_healthy(first.process, f"http://127.0.0.1:{ports[0]}/health", timeout=30)
        assert other.process.pid == other_pid and other.process.poll() is None
        wait_healthy(other.process, f"http://127.0.0.1:{ports[1]}/health", timeout=5)
        assert first.starts == 2 and other.starts == 0
    finally:
        stop(*(child.process for child in children))


def test_a_child_that_cannot_start_again_is_tried_later(tmp_path):
    """A start that fails (the port still held, the model not loading) is tried again."""
    tries = []

    def start():
        tries.append(1)
        if len(tries) == 1:
            raise StartError("port 8001 on 127.0.0.1 is taken\nmore")
        return spawn([sys.executable, "-c", "import time; time.sleep(600)"])

    child = Supervised("engine", spawn([sys.executable, "-c", "pass"]), start, first=0.2)
    try:
        lines = checked_until([child], "started again")
        assert lines[0].startswith("engine stopped (code 0)")
        assert lines[1] == (
            "engine could not start again (port 8001 on 127.0.0.1 is taken); next try in 0 s"
        )
        assert lines[2] == f"engine started again (pid {child.process.pid})"
        assert len(tries) == 2 and child.process.poll() is None
    finally:
        stop(child.process)
