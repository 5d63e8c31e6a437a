"""agents.serving.process: the one way parley starts, waits for and stops its servers."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents.serving.process import (
    StartError,
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
    return [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
            "--directory", str(folder)]  # fmt: skip


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
