"""The bubblewrap sandbox: no network, no writes outside the copy, runaway and flooding commands
ended at their limits with the reason reported, never a hang of the caller."""

import os
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest

from agents.sandbox import Limits, LocalSandbox, SandboxUnavailable
from agents.sandbox.docker import DockerSandbox

if shutil.which("bwrap") is None and not os.environ.get("PARLEY_CI"):
    pytest.skip("bubblewrap is not installed (apt-get install bubblewrap)", allow_module_level=True)

QUICK = Limits(cpu_seconds=2, memory_bytes=1024**3, wall_seconds=3, output_bytes=10_000)


@pytest.fixture
def sandbox(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    (source / "hello.txt").write_text("hello\n")
    with LocalSandbox(source, QUICK, scratch=tmp_path) as box:
        yield box


def test_a_command_runs_in_the_copy_and_writes_only_there(sandbox, tmp_path):
    done = sandbox.run("cat hello.txt && echo changed > hello.txt && echo new > made.txt")
    assert done.ok, done
    assert done.stdout == "hello\n"
    assert (Path(sandbox.workdir) / "made.txt").read_text() == "new\n"
    assert (tmp_path / "source" / "hello.txt").read_text() == "hello\n"  # the source is untouched


def test_nothing_outside_the_copy_is_writable(sandbox, tmp_path):
    hidden = tmp_path / "outside.txt"  # under the host's /tmp, hidden by the private /tmp
    host = Path(tempfile.mkdtemp(dir="/var/tmp"))  # a folder the host can write, outside /tmp
    try:
        done = sandbox.run(f"echo x > {hidden}; echo x > {host}/made.txt; true")
        assert not hidden.exists()
        assert not (host / "made.txt").exists()
        assert "Read-only file system" in done.stderr, done.stderr
    finally:
        shutil.rmtree(host)


def test_inputs_are_readable_not_writable(sandbox):
    path = sandbox.write_input("a.patch", "diff\n")
    done = sandbox.run(f"cat {path}; echo more >> {path}")
    assert done.stdout == "diff\n"
    assert "Read-only" in done.stderr
    assert Path(path).read_text() == "diff\n"


def test_no_network_not_even_the_hosts_loopback(sandbox):
    # a server listening on the host's loopback: reachable from here, not from inside
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    accepted = []
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
    try:
        probe = (
            "import socket\n"
            "try:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=1); print('connected')\n"
            "except OSError as e:\n"
            "    print('refused', e)\n"
            "print(sorted(i[1] for i in socket.if_nameindex()))\n"
        )
        done = sandbox.run(["python", "-c", probe])
        assert done.ok, done
        assert done.stdout.startswith("refused"), done.stdout
        assert done.stdout.splitlines()[-1] == "['lo']"
        assert not accepted
    finally:
        server.close()


def test_a_hanging_command_is_killed_at_its_wall_limit_with_its_children(sandbox):
    marker = "987.6543"
    started = time.monotonic()
    done = sandbox.run(f"sleep {marker} & sleep {marker}; echo never")
    assert time.monotonic() - started < QUICK.wall_seconds + 3
    assert done.timed_out and done.killed == "wall"
    assert "never" not in done.stdout
    time.sleep(0.2)
    left = [p for p in os.listdir("/proc") if p.isdigit() and marker in _cmdline(p)]
    assert not left, "a sleeping child outlived the kill"


def test_a_cpu_bound_loop_is_ended_by_its_cpu_limit(tmp_path):
    limits = Limits(cpu_seconds=1, memory_bytes=1024**3, wall_seconds=20, output_bytes=10_000)
    (tmp_path / "source").mkdir()
    with LocalSandbox(tmp_path / "source", limits, scratch=tmp_path) as box:
        done = box.run(["python", "-c", "while True: pass"])
    assert done.killed == "cpu", done
    assert done.seconds < 10


def test_memory_beyond_the_limit_is_refused(sandbox):
    done = sandbox.run(["python", "-c", "x = bytearray(3 * 1024**3)"])
    assert done.exit_code != 0
    assert "MemoryError" in done.stderr


def test_a_flood_of_output_is_cut_and_reported(sandbox):
    started = time.monotonic()
    done = sandbox.run("yes flood")
    assert time.monotonic() - started < QUICK.wall_seconds  # ended at the cap, not at the wall
    assert done.killed == "output" and done.stdout_truncated
    assert len(done.stdout.encode()) == QUICK.output_bytes
    assert not done.timed_out


def test_input_a_command_never_reads_does_not_block_the_wall_limit(sandbox):
    started = time.monotonic()
    done = sandbox.run("sleep 100", input=b"x" * 10_000_000)  # far more than a pipe holds
    assert done.killed == "wall"
    assert time.monotonic() - started < QUICK.wall_seconds + 3


def test_a_missing_program_is_a_result_not_an_exception(sandbox):
    done = sandbox.run(["no-such-program-here"])
    assert done.exit_code != 0 and not done.ok


def test_a_scratch_inside_the_source_is_refused(tmp_path):
    with pytest.raises(ValueError, match="inside"):
        LocalSandbox(tmp_path, QUICK, scratch=tmp_path / "scratch")


def test_docker_is_refused_clearly_without_a_daemon(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SandboxUnavailable, match="no docker binary"):
        DockerSandbox("any-image")


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""
