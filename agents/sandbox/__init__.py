"""Running a command in an episode's throwaway copy of a repository, with no network and with
CPU, memory, wall-time and output limits; every run returns a CommandResult, never hangs.

Two backends behind one interface (Sandbox): LocalSandbox (bubblewrap, for machines without a
container daemon) and DockerSandbox (the task's own Dockerfile; written, untested here).
"""

from agents.sandbox.base import CommandResult, Limits, Sandbox, SandboxUnavailable
from agents.sandbox.docker import DockerSandbox
from agents.sandbox.local import LocalSandbox

__all__ = [
    "CommandResult",
    "DockerSandbox",
    "Limits",
    "LocalSandbox",
    "Sandbox",
    "SandboxUnavailable",
]
