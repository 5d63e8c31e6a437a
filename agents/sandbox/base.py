"""The sandbox interface, its limits and its result; the bounded process runner both backends use."""

from __future__ import annotations

import abc
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path


class SandboxUnavailable(RuntimeError):
    """The backend cannot run here (no bwrap, no docker binary or daemon)."""


@dataclass(frozen=True)
class Limits:
    cpu_seconds: int = 60  # RLIMIT_CPU: SIGXCPU past it
    memory_bytes: int = 2 * 1024**3  # address space (RLIMIT_AS) or the container's memory
    wall_seconds: float = 120.0  # the whole process group is killed past it
    output_bytes: int = 1024 * 1024  # per stream; a command writing more is killed and cut there


@dataclass
class CommandResult:
    exit_code: int | None  # None when the command never started
    stdout: str
    stderr: str
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    timed_out: bool = False
    killed: str | None = None  # "wall", "output", "cpu" or "error"; None when it ended by itself
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.killed is None

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


class Sandbox(abc.ABC):
    """One episode's throwaway copy of a repository; `run` a command in it, `close` to discard it."""

    limits: Limits

    @property
    @abc.abstractmethod
    def workdir(self) -> str:
        """The copy's path as commands inside the sandbox see it (their working directory)."""

    @abc.abstractmethod
    def run(self, command: str | Sequence[str], *, input: bytes | None = None) -> CommandResult:
        """A shell string runs under `bash -c`; a list runs as is."""

    @abc.abstractmethod
    def write_input(self, name: str, content: str) -> str:
        """A file commands can read but not change (a patch); returns its path inside."""

    @abc.abstractmethod
    def close(self) -> None: ...

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def run_bounded(
    argv: Sequence[str],
    limits: Limits,
    *,
    input: bytes | None = None,
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    preexec: Callable[[], None] | None = None,
    on_kill: Callable[[], None] | None = None,
) -> CommandResult:
    """Run argv in its own session; kill its whole process group past the wall limit or the output cap.

    on_kill runs after the group is killed, for what the group does not hold (a container)."""
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=cwd,
            start_new_session=True,  # its own process group, killed whole
            preexec_fn=preexec,
        )
    except OSError as error:
        return CommandResult(None, "", str(error), killed="error")

    reason: list[str] = []  # the first reason to kill wins
    lock = threading.Lock()

    def kill(why: str) -> None:
        with lock:
            if reason:
                return
            reason.append(why)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if on_kill is not None:
            on_kill()

    captured: dict[str, tuple[bytes, bool]] = {}

    def drain(name: str, stream) -> None:
        kept, cut = bytearray(), False
        while chunk := stream.read1(65536):
            room = limits.output_bytes - len(kept)
            if len(chunk) > room:
                kept += chunk[: max(room, 0)]
                cut = True
                kill("output")  # a flood is ended, not drained for the rest of the wall time
                break
            kept += chunk
        captured[name] = (bytes(kept), cut)

    readers = [
        threading.Thread(target=drain, args=(name, stream), daemon=True)
        for name, stream in (("stdout", proc.stdout), ("stderr", proc.stderr))
    ]
    for reader in readers:
        reader.start()
    if input is not None:
        # from a thread: a command that never reads its stdin must not block the wall clock
        threading.Thread(target=_feed, args=(proc.stdin, input), daemon=True).start()
    try:
        proc.wait(timeout=limits.wall_seconds)
    except subprocess.TimeoutExpired:
        kill("wall")
        proc.wait()
    for reader in readers:
        # a grandchild that escaped the group could hold a pipe open: never wait on it for long
        reader.join(timeout=5)
    out, out_cut = captured.get("stdout", (b"", False))
    err, err_cut = captured.get("stderr", (b"", False))
    code = proc.returncode
    killed = reason[0] if reason else None
    if killed is None and code in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
        killed = "cpu"
    return CommandResult(
        exit_code=code,
        stdout=out.decode("utf-8", "replace"),
        stderr=err.decode("utf-8", "replace"),
        stdout_truncated=out_cut,
        stderr_truncated=err_cut,
        timed_out=killed == "wall",
        killed=killed,
        seconds=time.monotonic() - started,
    )


def _feed(stdin, data: bytes) -> None:
    try:
        stdin.write(data)
        stdin.close()
    except (BrokenPipeError, OSError, ValueError):
        pass
