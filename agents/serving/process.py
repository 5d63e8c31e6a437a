"""Server child processes: the embedded engine, vLLM, and the demo's engine, worker and web server.

    process = spawn(command, log_path)                 # output to a log file, dies with us
    wait_healthy(process, "http://127.0.0.1:8001/health", timeout=180, name="The engine")
    ...
    stop(process)                                      # SIGTERM, then SIGKILL after a timeout

A process started from the main thread on Linux is also sent SIGTERM when this one dies, so
tests and `make demo` never leave servers behind. With `own_group` the child leads its own
process group and every signal goes to the whole group (vLLM runs its engine core in a child
process, which must not outlive the server). Imports nothing heavy: the demo and the vLLM
command line use it before any model is loaded.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx


class StartError(RuntimeError):
    """A server exited or did not answer its health URL while starting; says why, with the
    tail of its log."""


class ProcessGroup(subprocess.Popen):
    """A Popen whose signals go to its whole process group (start it with start_new_session)."""

    def send_signal(self, sig):
        self.poll()
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, sig)

    def wait(self, timeout=None):
        code = super().wait(timeout)
        with contextlib.suppress(ProcessLookupError):  # the leader is gone: end stragglers too
            os.killpg(self.pid, signal.SIGKILL)
        return code


def spawn(
    command: list[str],
    log_path: Path | str | None = None,
    *,
    log_prefix: str = "parley-",
    append: bool = False,
    own_group: bool = False,
    env: dict[str, str] | None = None,
    cwd: Path | str | None = None,
) -> subprocess.Popen:
    """Start `command` with stdout and stderr in `log_path` (a temporary file, deleted by
    stop(), when None). The process carries `log_path` and `own_log`."""
    own_log = log_path is None
    if own_log:
        handle, log_path = tempfile.mkstemp(prefix=log_prefix, suffix=".log")
        os.close(handle)
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab" if append else "wb") as log:  # the child keeps its own descriptor
        process = (ProcessGroup if own_group else subprocess.Popen)(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=own_group,
            # PR_SET_PDEATHSIG follows the launching *thread*: only tie to a long-lived one
            preexec_fn=_die_with_parent if _on_main_linux_thread() else None,
            env=env,
            cwd=cwd,
        )
    process.log_path, process.own_log = log_path, own_log
    return process


class Supervised:
    """A child that is started again whenever it stops, so that one crash never ends the rest:
    `first` seconds after it stops, twice the last wait each time it stops again within
    `steady` seconds of starting (up to `longest`), so a child that cannot run costs little.

        engine = Supervised("engine", spawn_engine(), spawn_engine)
        while True:
            if line := engine.check(): print(line)
            time.sleep(1)
    """

    def __init__(
        self,
        name: str,
        process: subprocess.Popen,
        start: Callable[[], subprocess.Popen],
        *,
        first: float = 1.0,
        longest: float = 60.0,
        steady: float = 60.0,
    ):
        self.name, self.process, self._start = name, process, start
        self.first, self.longest, self.steady = first, longest, steady
        self.starts = 0  # starts after the first
        self._wait, self._started, self._due = first, time.monotonic(), None

    def check(self) -> str | None:
        """Call every second or so: a line saying what happened, when something did. A start
        that raises is tried again later (a port still held, an engine that cannot load)."""
        now = time.monotonic()
        if self._due is None:
            if self.process.poll() is None:
                return None
            self._due = now + self._next_wait(now)
            log = getattr(self.process, "log_path", None)
            return (
                f"{self.name} stopped (code {self.process.returncode}); starting it again in "
                f"{self._due - now:.0f} s" + (f" (see {log})" if log else "")
            )
        if now < self._due:
            return None
        try:
            process = self._start()
        except Exception as error:
            self._due = now + self._next_wait(now)
            reason = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
            return (
                f"{self.name} could not start again ({reason}); next try in {self._due - now:.0f} s"
            )
        self.process, self.starts, self._due = process, self.starts + 1, None
        self._started = time.monotonic()
        return f"{self.name} started again (pid {process.pid})"

    def _next_wait(self, now: float) -> float:
        if now - self._started >= self.steady:  # it ran for a while: a fresh failure
            self._wait = self.first
        wait, self._wait = self._wait, min(self._wait * 2, self.longest)
        return wait


def wait_healthy(
    process: subprocess.Popen,
    health: str | Callable[[], str | None],
    timeout: float,
    name: str = "The server",
    interval: float = 0.2,
) -> None:
    """Return once `health` answers 200; raise StartError if the process exits first or the
    timeout passes. `health` is the URL, or a function giving it once it is known (None before:
    an engine on port 0 writes its address in its log)."""
    deadline, url = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise StartError(
                f"{name} exited with code {process.returncode} while starting:\n"
                f"{tail(process.log_path)}"
            )
        url = health() if callable(health) else health
        if url is not None:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, timeout=2).status_code == 200:
                    return
        time.sleep(interval)
    raise StartError(
        f"{name} did not become ready in {timeout:.0f}s (health: {url}):\n{tail(process.log_path)}"
    )


def stop(*processes: subprocess.Popen, timeout: float = 10.0) -> None:
    """Terminate every process (SIGTERM), then kill those still running `timeout` seconds
    later; a temporary log spawn() made goes with its process. One deadline for all: waited
    for one after the other, n processes deaf to SIGTERM took n x timeout, and serve_agents'
    Ctrl-C with two busy vLLM replicas outlasted the minute a user (and its test) gives it."""
    for process in processes:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + timeout
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if getattr(process, "own_log", False):
            Path(process.log_path).unlink(missing_ok=True)


@contextlib.contextmanager
def serving(started: tuple[str, subprocess.Popen], timeout: float = 10.0):
    """`with serving(start_x(...)) as base_url:` the server is stopped however the block ends."""
    base_url, process = started
    try:
        yield base_url
    finally:
        stop(process, timeout=timeout)


def group_alive(pgid: int) -> bool:
    """Some process of the process group `pgid` still exists (a zombie not yet reaped counts)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the OS's pick)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def port_is_free(host: str, port: int) -> bool:
    """Nothing answers on host:port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as sock:
        return sock.connect_ex((host, port)) != 0


def tail(path: Path | str, lines: int = 30) -> str:
    return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])


def _on_main_linux_thread() -> bool:
    return sys.platform == "linux" and threading.current_thread() is threading.main_thread()


def _die_with_parent():
    """In the child: ask Linux to SIGTERM it when the parent exits (prctl PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    except OSError:
        pass
