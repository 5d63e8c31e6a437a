"""Child processes the tests start (servers, workers, the engine) and what they need: the repository, the test database's environment, skipping or failing under CI."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


IN_CI = os.environ.get("PARLEY_CI") == "1"
# Which of CI's two runs this is (.ci/run): "defaults", the README's own set-up (SQLite, the
# in-memory channel layer, no Redis), or "services" (PostgreSQL and Redis).
CI_SETUP = os.environ.get("PARLEY_CI_SETUP", "services")


def need(condition: bool, why: str) -> None:
    """What a test needs besides a service (a browser, vLLM, the model, reference data): under
    CI, in both runs, its absence fails the test; on a laptop it is skipped."""
    if not condition:
        if IN_CI:
            pytest.fail(f"CI requires it: {why}")
        pytest.skip(why)


def official_tau2_dir():
    """The official tau2 folder of ../shared/reference (v0.2.0's task files), as `need` says."""
    from agents import paths

    reference = paths.reference_dir()
    folder = reference / "tau2" if reference else None
    need(
        folder is not None and (folder / "retail" / "tasks.json").is_file(),
        f"the official tau2 data in ../shared/reference (reference dir: {reference})",
    )
    return folder


def need_service(condition: bool, why: str) -> None:
    """PostgreSQL or Redis: skipped where the set-up has none by design (CI's run on the
    README's defaults, a laptop), a failure in CI's run on the services."""
    if not condition:
        if IN_CI and CI_SETUP != "defaults":
            pytest.fail(f"CI requires it: {why}")
        pytest.skip(SERVICE_SKIP + why)


SERVICE_SKIP = "a service this set-up has none of: "  # the one skip CI allows (tests/conftest.py)


CHECKPOINT_NAME = "p4g-single-cpu-step4"  # from its manifest, as training writes it


def child_env(**extra) -> dict:
    """The environment for a child process (server, worker) that must see the test database."""
    from django.db import connection

    env = dict(os.environ, **extra)
    settings = connection.settings_dict
    if connection.vendor == "postgresql":
        user = settings.get("USER") or "postgres"
        host = settings.get("HOST") or "127.0.0.1"
        port = settings.get("PORT") or 5432
        env["DATABASE_URL"] = f"postgres://{user}@{host}:{port}/{settings['NAME']}"
    else:
        env["DATABASE_URL"] = f"sqlite:///{settings['NAME']}"
    return env


def python(*args, env=None, **kwargs):
    return subprocess.run(
        [sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, **kwargs
    )


class ServeAgents:
    """`manage.py serve_agents ...` in its own process, read line by line as it prints:
    `replicas` maps each replica's URL to its process id (the leader of its process group)."""

    def __init__(self, *args: str, env: dict, timeout: float = 900):
        import queue
        import threading

        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "serve_agents", *args],
            cwd=REPO,
            env={**env, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines, self.output, self.replicas = queue.Queue(), [], {}
        threading.Thread(target=self._read, daemon=True).start()
        try:
            while not (line := self.next_line(timeout)).startswith("ready:"):
                if line.startswith("replica "):
                    _, _, url, _, pid = line.split()
                    self.replicas[url] = int(pid)
        except BaseException:
            self.interrupt()
            raise

    def _read(self):
        for line in self.process.stdout:
            self.output.append(line)
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def next_line(self, timeout: float) -> str:
        """The command's next line; fails the test if it ends or says nothing for `timeout`."""
        import queue

        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"serve_agents said nothing for {timeout:.0f}s:\n{self.log()}")
        if line is None:
            pytest.fail(f"serve_agents exited ({self.process.wait()}):\n{self.log()}")
        return line

    def next_saying(self, start: str, timeout: float = 300) -> str:
        """The command's next line that starts with `start` (httpx logs each health probe's
        request between its own lines)."""
        while not (line := self.next_line(timeout)).startswith(start):
            pass
        return line

    def log(self) -> str:
        return "".join(self.output)[-4000:]

    def interrupt(self, timeout: float = 60, sig: int = 2) -> int:
        """Ctrl-C (SIGINT, 2), as a terminal sends it, or `sig`; the exit code (killed if it
        does not stop within `timeout`)."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def engine_metric(base_url: str, name: str, **labels: str) -> float:
    """One of vLLM's Prometheus metrics (the embedded engine's /metrics gives the scheduler's
    too), summed over the series with these labels: `vllm:num_requests_running`,
    `vllm:request_success_total` with finished_reason="abort", ..."""

    import httpx

    text = httpx.get(base_url.removesuffix("/v1") + "/metrics", timeout=10).text
    total, found = 0.0, False
    for series, value in re.findall(r"^(vllm:\S+?(?:\{[^}]*\})?) (\S+)$", text, re.M):
        metric, _, rest = series.partition("{")
        given = dict(re.findall(r'(\w+)="([^"]*)"', rest))
        if metric == name and all(given.get(k) == v for k, v in labels.items()):
            total, found = total + float(value), True
    assert found, f"no {name} {labels} in {base_url}'s /metrics"
    return total
