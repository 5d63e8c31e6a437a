"""Start the embedded engine as a child process and wait until it answers.

    base_url, process = start_engine(model_dir)          # http://127.0.0.1:PORT/v1
    ...
    stop_engine(process)

or `with running_engine(model_dir) as base_url: ...`. With port=None the engine picks a free
port itself and reports it on its ready line, so there is no race for the port. The engine's
output goes to a log file (`process.log_path`) whose tail is shown if it fails to start. On
Linux, launched from the main thread, the child is also killed if this process dies, so tests
never leave engines behind (agents.serving.process).
"""

import os
import subprocess
import sys
from pathlib import Path

from agents.serving.embedded.server import READY
from agents.serving.process import StartError, serving, spawn, stop, wait_healthy

EngineStartError = StartError  # the name callers of the engine launcher know


def launch_engine(
    model_dir: Path | str,
    port: int | None = None,
    adapters: Path | str | None = None,
    *,
    loras: dict[str, Path | str] | None = None,
    served_name: str | None = None,
    host: str = "127.0.0.1",
    extra_args: list[str] = (),
    log_path: Path | str | None = None,
    own_group: bool = False,
) -> subprocess.Popen:
    """start_engine without the wait (wait_engine): several replicas start side by side.
    `own_group`: the engine leads its own process group (a Ctrl-C meant for the launcher does
    not reach it; stop() ends the whole group)."""
    command = [sys.executable, "-m", "agents.serving.embedded.server", "--model", str(model_dir)]
    command += ["--host", host, "--port", str(port or 0)]
    if adapters is not None:
        command += ["--adapters", str(adapters)]
    for name, path in (loras or {}).items():
        command += ["--lora", f"{name}={path}"]
    if served_name:
        command += ["--served-name", served_name]
    command += list(extra_args)
    return spawn(
        command,
        log_path,
        log_prefix="parley-engine-",
        own_group=own_group,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def wait_engine(process: subprocess.Popen, timeout: float = 180.0) -> str:
    """The base URL (ending in /v1) of an engine launch_engine started, once it answers; the
    engine is stopped if it cannot start."""
    try:
        wait_healthy(process, lambda: _health_url(process.log_path), timeout, name="The engine")
    except BaseException:
        stop_engine(process)
        raise
    return _base_url(process.log_path)


def start_engine(
    model_dir: Path | str,
    port: int | None = None,
    adapters: Path | str | None = None,
    *,
    startup_timeout: float = 180.0,
    **options,
) -> tuple[str, subprocess.Popen]:
    """Launch `python -m agents.serving.embedded.server`; returns (base_url ending in /v1, process).
    `options` go to launch_engine (loras, served_name, host, extra_args, log_path)."""
    process = launch_engine(model_dir, port, adapters, **options)
    return wait_engine(process, startup_timeout), process


def stop_engine(process: subprocess.Popen, timeout: float = 10.0) -> None:
    """Terminate the engine (SIGTERM, then SIGKILL after `timeout`)."""
    stop(process, timeout=timeout)


def running_engine(model_dir: Path | str, port: int | None = None, adapters=None, **options):
    """`with running_engine(...) as base_url:` start_engine, stopped when the block ends."""
    return serving(start_engine(model_dir, port, adapters, **options))


def _base_url(log_path: Path) -> str | None:
    """The address the engine wrote on its ready line (it may have picked its own port)."""
    for line in log_path.read_text(errors="replace").splitlines():
        if line.startswith(READY):
            return line[len(READY) :].strip()
    return None


def _health_url(log_path: Path) -> str | None:
    base_url = _base_url(log_path)
    return base_url.removesuffix("/v1") + "/health" if base_url else None
