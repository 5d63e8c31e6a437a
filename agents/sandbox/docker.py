"""The container backend: the task's own image, built from its Dockerfile, one container an episode.

UNTESTED HERE: this machine has no container daemon. The repository is the image's own checkout
(CooperBench's images clone it to /workspace/repo); inputs go to /patches, where the task's
runner.sh reads them. The container has no network, a memory and CPU cap and a process cap;
each command runs through `docker exec` under run_bounded's wall and output limits.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import uuid
from collections.abc import Sequence
from pathlib import Path

from agents.sandbox.base import CommandResult, Limits, Sandbox, SandboxUnavailable, run_bounded

REPO_IN_IMAGE = "/workspace/repo"
INPUTS_IN_IMAGE = "/patches"


def docker_binary() -> str:
    """The docker CLI, refused clearly when it or its daemon is missing."""
    binary = shutil.which("docker")
    if binary is None:
        raise SandboxUnavailable("no docker binary on PATH; use LocalSandbox on this machine")
    try:
        info = subprocess.run([binary, "info"], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise SandboxUnavailable(f"the docker daemon does not answer: {error}") from error
    if info.returncode != 0:
        raise SandboxUnavailable(
            f"the docker daemon does not answer: {info.stderr.decode(errors='replace')[:500]}"
        )
    return binary


def build_image(task_folder: str | Path, tag: str, *, timeout: float = 3600) -> str:
    """Build the task's Dockerfile once per task (it needs the network; the episodes do not)."""
    binary = docker_binary()
    done = subprocess.run(
        [binary, "build", "-t", tag, str(task_folder)], capture_output=True, timeout=timeout
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"docker build of {task_folder} failed: {done.stderr.decode(errors='replace')[-2000:]}"
        )
    return tag


class DockerSandbox(Sandbox):
    def __init__(self, image: str, limits: Limits | None = None):
        self.docker = docker_binary()
        self.limits = limits or Limits()
        self.name = f"parley-sandbox-{uuid.uuid4().hex[:12]}"
        memory = int(self.limits.memory_bytes)
        started = subprocess.run(
            [
                self.docker, "run", "-d", "--rm", "--name", self.name,
                "--network", "none",
                "--memory", str(memory), "--memory-swap", str(memory),
                "--cpus", "1", "--pids-limit", "512",
                "--ulimit", f"cpu={int(self.limits.cpu_seconds)}:{int(self.limits.cpu_seconds) + 1}",
                "--entrypoint", "sleep", image, "infinity",
            ],
            capture_output=True,
            timeout=120,
        )  # fmt: skip  # docker's flags beside their values, one concern a line
        if started.returncode != 0:
            raise RuntimeError(
                f"docker run {image} failed: {started.stderr.decode(errors='replace')[-2000:]}"
            )
        self.run(["mkdir", "-p", INPUTS_IN_IMAGE])

    @property
    def workdir(self) -> str:
        return REPO_IN_IMAGE

    def write_input(self, name: str, content: str) -> str:
        if "/" in name or name in ("", ".", ".."):
            raise ValueError(f"an input's name is one plain file name, not {name!r}")
        path = f"{INPUTS_IN_IMAGE}/{name}"
        written = self.run(f"cat > {shlex.quote(path)}", input=content.encode())
        if not written.ok:
            raise RuntimeError(f"writing {path} failed: {written.output[-2000:]}")
        return path

    def run(self, command: str | Sequence[str], *, input: bytes | None = None) -> CommandResult:
        inner = ["bash", "-c", command] if isinstance(command, str) else list(command)
        argv = [
            self.docker,
            "exec",
            *(["-i"] if input is not None else []),
            "-w",
            REPO_IN_IMAGE,
            self.name,
            *inner,
        ]
        # killing `docker exec` leaves the process in the container: a wall or output kill ends the container
        return run_bounded(argv, self.limits, input=input, on_kill=self.close)

    def close(self) -> None:
        subprocess.run([self.docker, "rm", "-f", self.name], capture_output=True, timeout=60)
