"""The local backend: an episode's copy of the repository under bubblewrap (Debian's `bubblewrap`).

Inside, the whole host file system is read-only, /tmp is private and empty, the copy is the only
writable place, there is no network (only a loopback of its own) and no view of the host's
processes. CPU time and address space are capped with setrlimit before bwrap starts (its
children inherit them); wall time and output by run_bounded. The environment is the host's,
read-only: the interpreter running parley is first on PATH.
"""

from __future__ import annotations

import resource
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from agents.sandbox.base import CommandResult, Limits, Sandbox, SandboxUnavailable, run_bounded

BWRAP = "bwrap"


class LocalSandbox(Sandbox):
    def __init__(
        self, source: str | Path, limits: Limits | None = None, *, scratch: str | Path | None = None
    ):
        """Copy `source` (a repository checkout, .git included) into a fresh scratch folder."""
        self.bwrap = shutil.which(BWRAP)
        if self.bwrap is None:
            raise SandboxUnavailable(
                "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"
            )
        self.limits = limits or Limits()
        if scratch is not None and Path(scratch).resolve().is_relative_to(Path(source).resolve()):
            raise ValueError(
                f"the scratch folder {scratch} is inside the source {source}: it would copy itself"
            )
        self._root = Path(tempfile.mkdtemp(prefix="sandbox-", dir=scratch))
        self._copy = self._root / "repo"
        self._inputs = self._root / "inputs"
        shutil.copytree(source, self._copy, symlinks=True)
        self._inputs.mkdir()

    @property
    def workdir(self) -> str:
        return str(self._copy)

    def write_input(self, name: str, content: str) -> str:
        if "/" in name or name in ("", ".", ".."):
            raise ValueError(f"an input's name is one plain file name, not {name!r}")
        path = self._inputs / name
        path.write_text(content)
        return str(path)

    def _argv(self, command: str | Sequence[str]) -> list[str]:
        copy, inputs = str(self._copy), str(self._inputs)
        inner = ["bash", "-c", command] if isinstance(command, str) else list(command)
        return [
            self.bwrap,
            "--ro-bind", "/", "/",
            "--dev", "/dev",
            "--proc", "/proc",
            "--tmpfs", "/tmp",  # private; hides the host's /tmp, where the scratch may live
            "--bind", copy, copy,  # the one writable place
            "--ro-bind", inputs, inputs,
            "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--die-with-parent",  # the kill of bwrap ends everything inside its pid namespace
            "--new-session",
            "--chdir", copy,
            "--",
            *inner,
        ]  # fmt: skip  # bwrap's options beside their paths, one mount a line

    def _env(self) -> dict[str, str]:
        path = f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"
        return {"PATH": path, "HOME": "/tmp", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}

    def _preexec(self) -> None:
        cpu = max(1, int(self.limits.cpu_seconds))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU, then SIGKILL a second on
        memory = int(self.limits.memory_bytes)
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    def run(self, command: str | Sequence[str], *, input: bytes | None = None) -> CommandResult:
        if not self._copy.is_dir():
            raise RuntimeError("this sandbox is closed")
        return run_bounded(
            self._argv(command), self.limits, input=input, env=self._env(), preexec=self._preexec
        )

    def close(self) -> None:
        shutil.rmtree(self._root, ignore_errors=True)
