"""An agent's workspace in a CooperBench episode: its own sandboxed copy of the task's repository
and the coding tools it works through (bash, read, write and edit a file, message the partner,
submit).

The tools are those of the benchmark's agents (cooperbench/CooperBench at 44b4a7a,
src/cooperbench/agents/mini_swe_agent_v2/models/utils/actions_toolcall.py: `bash` and
`send_message`; submitting is `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` there, and that
command submits here too), with a file reader and editor added, which the issue asks for and
which small models use more reliably than sed. Every file tool goes through the sandbox's own
commands, so both backends (a bubblewrap copy here, a container for real runs) serve them alike.

The repository is prepared once per task (`prepare_checkout`): a git checkout at the task's base
commit in a cache folder, which every episode's sandbox copies. The local backend runs with the
host's tools, read-only; the Docker backend has the task image's own environment.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.domains.cooperbench.task import Task
from agents.sandbox import CommandResult, Limits, Sandbox

STOP_SIGNAL = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"  # the benchmark's submit command's word
# the release's cooperbench_max_tool_output_chars default (CHATS-lab/scope_usim
# usim/cooperbench/rollout.py): what a model reads of one command's output
MAX_OUTPUT_CHARS = 4000
GIT = ["git", "-c", "user.email=prepare@parley", "-c", "user.name=parley"]


def _tool(name: str, description: str, properties: dict, required: list[str]) -> dict:
    schema = {"type": "object", "properties": properties, "required": required}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": schema},
    }


_TEXT = {"type": "string"}
TOOLS = [
    _tool(
        "bash",
        "Run a bash command in your copy of the repository (a new shell each time; its exit "
        "code, stdout and stderr come back). `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` submits.",
        {"command": {**_TEXT, "description": "The bash command to execute"}},
        ["command"],
    ),
    _tool(
        "read_file",
        "Read a file of the repository with line numbers, optionally only some lines.",
        {
            "path": {**_TEXT, "description": "Relative to the repository's root"},
            "start_line": {"type": "integer", "minimum": 1},
            "end_line": {"type": "integer", "minimum": 1},
        },
        ["path"],
    ),
    _tool(
        "write_file",
        "Create a file, or replace its whole content.",
        {"path": _TEXT, "content": _TEXT},
        ["path", "content"],
    ),
    _tool(
        "edit_file",
        "Replace one exact piece of a file's text (it must appear exactly once) with another.",
        {"path": _TEXT, "old_text": _TEXT, "new_text": _TEXT},
        ["path", "old_text", "new_text"],
    ),
    _tool(
        "send_message",
        "Send a message to your colleague, who reads it before their next step.",
        {"content": {**_TEXT, "description": "The message content to send"}},
        ["content"],
    ),
    _tool(
        "submit",
        "Submit your changes: your patch is what you have changed in the repository. After "
        "this you take no more steps.",
        {},
        [],
    ),
]
TOOL_NAMES = tuple(t["function"]["name"] for t in TOOLS)


# -- the repository, prepared once per task --------------------------------------------------

_PREPARING = threading.Lock()


def prepare_checkout(task: Task, repos_dir: Path, cache_dir: Path) -> Path:
    """The task's repository as a git checkout at its base commit, made once per task and
    repository state in `cache_dir` and reused by every episode (each copies it into its own
    sandbox). The repository comes from `repos_dir/<REPO_NAME>` (setup.sh's REPO_NAME, else the
    task folder's name without `_task`): a git checkout, which is checked out at BASE_COMMIT, or
    a plain folder (parley's bundled task), which becomes a repository of one commit."""
    source = repos_dir / (task.repository or task.repo_name.removesuffix("_task"))
    if not source.is_dir():
        raise FileNotFoundError(
            f"no checkout of {task.repo_name}'s repository at {source}: the local sandbox needs "
            "one there (the Docker backend builds the task's own image instead)"
        )
    key = hashlib.sha256(
        f"{source.resolve()}|{task.base_commit}|{_fingerprint(source)}".encode()
    ).hexdigest()[:16]
    target = cache_dir / f"{task.repo_name}-task{task.task_id}-{key}"
    with _PREPARING:
        if (target / ".parley-prepared").is_file():
            return target
        cache_dir.mkdir(parents=True, exist_ok=True)
        # built aside under a unique name and renamed into place: ranks or runs preparing the
        # same task at once never see (or remove) each other's half-made copy
        building = Path(tempfile.mkdtemp(prefix=f"{target.name}.", dir=cache_dir)) / "repo"
        shutil.copytree(source, building, symlinks=True)
        if (building / ".git").exists():
            if task.base_commit:
                _git(building, "checkout", "-q", "--force", task.base_commit)
            _git(building, "clean", "-fdxq")
        else:
            _git(building, "init", "-q")
            _git(building, "add", "-A")
            _git(building, "commit", "-qm", f"base ({task.base_commit or 'no BASE_COMMIT'})")
        (building / ".git" / "info").mkdir(exist_ok=True)
        # the stamp is not part of the repository: an agent's diff never shows it
        with open(building / ".git" / "info" / "exclude", "a") as exclude:
            exclude.write("\n.parley-prepared\n")
        (building / ".parley-prepared").write_text(task.base_commit or "")
        try:
            building.rename(target)
        except OSError:  # another process finished first: its copy is the same
            if not (target / ".parley-prepared").is_file():
                raise
        shutil.rmtree(building.parent, ignore_errors=True)
    return target


def _fingerprint(source: Path) -> str:
    """A git checkout's HEAD, else the files' names, sizes and times (a plain folder's state)."""
    head = source / ".git" / "HEAD"
    if head.is_file():
        return head.read_text()
    return json.dumps(
        sorted(
            (str(p.relative_to(source)), p.stat().st_size, int(p.stat().st_mtime))
            for p in source.rglob("*")
            if p.is_file()
        )
    )


def _git(folder: Path, *args: str) -> None:
    done = subprocess.run([*GIT, *args], cwd=folder, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed in {folder}: {done.stderr.strip()}")


# -- one speaker's workspace -----------------------------------------------------------------


@dataclass
class Workspace:
    """One speaker's sandbox (opened at its first tool call), its sent messages and its
    submitted patch."""

    open_sandbox: Any  # () -> Sandbox
    sandbox: Sandbox | None = None
    base: str = ""  # the base commit's sha inside the copy
    submitted: bool = False
    patch: str | None = None  # set at submit, or read at the end when it never submitted
    messages: list[str] = field(default_factory=list)
    commands: int = 0

    def box(self) -> Sandbox:
        if self.sandbox is None:
            self.sandbox = self.open_sandbox()
            head = self.sandbox.run(["git", "rev-parse", "HEAD"])
            self.base = head.stdout.strip() if head.ok else "HEAD"
        return self.sandbox

    def close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
            self.sandbox = None

    def current_patch(self) -> str:
        """Everything changed in the copy against the base commit, new files included."""
        if self.sandbox is None:
            return ""
        diff = self.sandbox.run(
            f"git add -A >/dev/null 2>&1 && git diff --cached --binary {self.base}"
        )
        return diff.stdout if diff.ok else ""

    # the tools ---------------------------------------------------------------------------

    def call(self, name: str, arguments: dict[str, Any] | str) -> str:
        """Run one tool call; anything wrong comes back as text the model can read."""
        if self.submitted:
            return "Error: you have submitted; you cannot take more steps."
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as error:
                return f"Error: the arguments are not valid JSON ({error})"
        if not isinstance(arguments, dict):
            return "Error: the arguments must be a JSON object"
        tool = getattr(self, f"_{name}", None) if name in TOOL_NAMES else None
        if tool is None:
            return f"Error: unknown tool {name!r} (tools: {', '.join(TOOL_NAMES)})"
        try:
            return tool(**arguments)
        except TypeError as error:
            return f"Error: wrong arguments for {name}: {error}"
        except ValueError as error:
            return f"Error: {error}"

    def _bash(self, command: str) -> str:
        if not isinstance(command, str) or not command.strip():
            raise ValueError("command must be a non-empty string")
        if command.strip() == f"echo {STOP_SIGNAL}":
            return self._submit()
        self.commands += 1
        return describe(self.box().run(command))

    def _read_file(self, path: str, start_line: int = 1, end_line: int | None = None) -> str:
        result = self.box().run(["cat", "--", self._path(path)])
        if not result.ok:
            return f"Error: cannot read {path}: {result.stderr.strip()[:500]}"
        lines = result.stdout.splitlines()
        start = max(1, int(start_line))
        end = len(lines) if end_line is None else min(len(lines), int(end_line))
        numbered = "\n".join(f"{n:6}\t{lines[n - 1]}" for n in range(start, end + 1))
        return cut(numbered or f"({path} has no lines {start}-{end})")

    def _write_file(self, path: str, content: str) -> str:
        self._write(path, content)
        return f"Wrote {path} ({len(content.splitlines())} lines)."

    def _edit_file(self, path: str, old_text: str, new_text: str) -> str:
        result = self.box().run(["cat", "--", self._path(path)])
        if not result.ok:
            return f"Error: cannot read {path}: {result.stderr.strip()[:500]}"
        if result.stdout_truncated:
            return f"Error: {path} is too large to edit this way; use bash"
        found = result.stdout.count(old_text) if old_text else 0
        if found != 1:
            where = "does not appear" if not found else f"appears {found} times"
            return f"Error: old_text {where} in {path}; give text that appears exactly once"
        self._write(path, result.stdout.replace(old_text, new_text, 1))
        return f"Edited {path}."

    def _send_message(self, content: str) -> str:
        if not isinstance(content, str) or not content.strip():
            raise ValueError("content must be a non-empty string")
        self.messages.append(content)
        return "Message sent to your colleague."

    def _submit(self) -> str:
        self.patch = self.current_patch()
        self.submitted = True
        lines = len(self.patch.splitlines())
        return f"Submitted: your patch has {lines} lines." if lines else "Submitted an empty patch."

    # helpers -----------------------------------------------------------------------------

    def _path(self, path: str) -> str:
        """`path` inside the copy; a path that leaves it is refused (the sandbox would refuse
        the write anyway: this names the reason)."""
        if not isinstance(path, str) or not path.strip():
            raise ValueError("path must be a non-empty string")
        root = self.box().workdir
        full = posixpath.normpath(posixpath.join(root, path))
        if full != root and not full.startswith(root.rstrip("/") + "/"):
            raise ValueError(f"{path} is outside the repository")
        return full

    def _write(self, path: str, content: str) -> None:
        target = self._path(path)
        script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
        result = self.box().run(["bash", "-c", script, "write", target], input=content.encode())
        if not result.ok:
            raise ValueError(
                f"cannot write {path}: {(result.stderr or result.stdout).strip()[:500]}"
            )


def describe(result: CommandResult) -> str:
    """A command's result as the model reads it: exit code, output, and any limit that ended it."""
    parts = [f"exit code: {result.exit_code}"]
    if result.killed:
        parts.append(f"ended by the sandbox: {result.killed} limit")
    if result.stdout:
        parts.append(
            "stdout:\n" + result.stdout + ("\n[output cut]" if result.stdout_truncated else "")
        )
    if result.stderr:
        parts.append(
            "stderr:\n" + result.stderr + ("\n[output cut]" if result.stderr_truncated else "")
        )
    return cut("\n".join(parts))


def cut(text: str, limit: int = MAX_OUTPUT_CHARS) -> str:
    """The first and last halves of a long text, with what was left out counted."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters left out ...]\n{text[-half:]}"


def default_limits() -> Limits:
    """A command's limits in an episode: a minute of CPU and of wall time, 2 GiB, 1 MiB of output."""
    return Limits(cpu_seconds=60, memory_bytes=2 * 1024**3, wall_seconds=60, output_bytes=1024**2)
