"""Start the embedded engine as a child process and wait until it answers.

    base_url, process = start_engine(model_dir)          # http://127.0.0.1:PORT/v1
    ...
    stop_engine(process)

or `with running_engine(model_dir) as base_url: ...`. With port=None the engine picks a free
port itself and reports it on its ready line, so there is no race for the port. The engine's
output goes to a log file (`process.log_path`) whose tail is shown if it fails to start. On
Linux, launched from the main thread, the child is also killed if this process dies, so tests never leave engines behind.
"""

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from agents.serving.embedded import READY


class EngineStartError(RuntimeError):
    pass


def start_engine(
    model_dir: Path | str,
    port: int | None = None,
    adapters: Path | str | None = None,
    *,
    loras: dict[str, Path | str] | None = None,
    served_name: str | None = None,
    host: str = "127.0.0.1",
    extra_args: list[str] = (),
    log_path: Path | str | None = None,
    startup_timeout: float = 180.0,
) -> tuple[str, subprocess.Popen]:
    """Launch `python -m agents.serving.embedded`; returns (base_url ending in /v1, process)."""
    command = [sys.executable, "-m", "agents.serving.embedded", "--model", str(model_dir)]
    command += ["--host", host, "--port", str(port or 0)]
    if adapters is not None:
        command += ["--adapters", str(adapters)]
    for name, path in (loras or {}).items():
        command += ["--lora", f"{name}={path}"]
    if served_name:
        command += ["--served-name", served_name]
    command += list(extra_args)

    own_log = log_path is None
    if own_log:
        handle, log_path = tempfile.mkstemp(prefix="parley-engine-", suffix=".log")
        os.close(handle)
    log_path = Path(log_path)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            # PR_SET_PDEATHSIG follows the launching *thread*: only tie to a long-lived one
            preexec_fn=_die_with_parent if _on_main_linux_thread() else None,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    process.log_path = log_path
    process.own_log = own_log
    try:
        base_url = _wait_ready(process, log_path, startup_timeout)
    except BaseException:
        stop_engine(process)
        raise
    return base_url, process


def stop_engine(process: subprocess.Popen, timeout: float = 10.0) -> None:
    """Terminate the engine (SIGTERM, then SIGKILL after `timeout`)."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if getattr(process, "own_log", False):  # a temporary log we made: gone with the engine
        Path(process.log_path).unlink(missing_ok=True)


@contextlib.contextmanager
def running_engine(model_dir: Path | str, port: int | None = None, adapters=None, **options):
    base_url, process = start_engine(model_dir, port, adapters, **options)
    try:
        yield base_url
    finally:
        stop_engine(process)


def _wait_ready(process: subprocess.Popen, log_path: Path, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    base_url = None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise EngineStartError(
                f"The engine exited with code {process.returncode} while starting:\n{_tail(log_path)}"
            )
        if base_url is None:
            for line in log_path.read_text(errors="replace").splitlines():
                if line.startswith(READY):
                    base_url = line[len(READY) :].strip()
        if base_url is not None:
            try:
                if (
                    httpx.get(base_url.removesuffix("/v1") + "/health", timeout=2).status_code
                    == 200
                ):
                    return base_url
            except httpx.HTTPError:
                pass
        time.sleep(0.2)
    raise EngineStartError(f"The engine did not become ready in {timeout:.0f}s:\n{_tail(log_path)}")


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _on_main_linux_thread() -> bool:
    return sys.platform == "linux" and threading.current_thread() is threading.main_thread()


def _die_with_parent():
    """In the child: ask Linux to SIGTERM it when the parent exits (prctl PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    except OSError:
        pass
