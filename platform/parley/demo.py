"""`make demo`: prepare, migrate, seed, start the engine, Celery (a worker for studies' queues,
one for training, beat for the periodic tasks) and the web server.

The engine (`manage.py serve_agents`, serving the checkpoints folder) is the embedded one, or
vLLM with `make demo ENGINE=vllm` (`python -m parley.demo --engine vllm`).

Prints the admin URL with its credentials and a participant link; Ctrl-C stops everything.
A child that stops is started again (after 1 s, longer if it keeps stopping); the rest go on.
"""

import argparse
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings

from agents.paths import REPO_DIR, base_model_dir, data_dir
from agents.serving.fleet import ENGINES
from agents.serving.process import (
    StartError,
    Supervised,
    port_is_free,
    spawn,
    stop,
    wait_healthy,
)
from parley.celery import SERVICE_QUEUES, TRAINING_QUEUES, beat_args, worker_args
from parley.credentials import admin_password

# The host, ports and admin account come from parley's settings, as in every child process.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "parley.settings")
HOST, WEB_PORT, ENGINE_PORT = (
    settings.PARLEY_HOST,
    settings.PARLEY_PORT,
    settings.PARLEY_ENGINE_PORT,
)
PY = sys.executable


def run(*args: str) -> None:
    subprocess.run([PY, *args], cwd=REPO_DIR, check=True)


def wait_for(url: str, name: str, process: subprocess.Popen, seconds: float = 600) -> None:
    try:
        wait_healthy(process, url, seconds, name, interval=0.5)
    except StartError as error:
        sys.exit(f"{error}\n(whole log: {log_path(name)})")


def participant_link(base: str, slug: str) -> str:
    """A link with sample Prolific parameters, as Prolific would send a new participant."""
    pid, study_id, session_id = (secrets.token_hex(12) for _ in range(3))
    return f"{base}/s/{slug}/?PROLIFIC_PID={pid}&STUDY_ID={study_id}&SESSION_ID={session_id}"


def log_path(name: str) -> Path:
    return data_dir() / "logs" / f"{name}.log"


def start(name: str, *args: str) -> subprocess.Popen:
    """A child that logs to data/logs/NAME.log and dies with the demo."""
    return spawn([PY, *args], log_path(name), append=True, cwd=REPO_DIR)


def engine_command(engine: str, checkpoints: Path) -> list[str]:
    """The engine child: `manage.py serve_agents` running `engine` on ENGINE_PORT, serving the
    checkpoints folder, as the `default` endpoint (PARLEY_ENGINE_URL, where the seeded arms
    point)."""
    where = ["--host", HOST, "--port", str(ENGINE_PORT), "--adapters", str(checkpoints)]
    return [
        "manage.py",
        "serve_agents",
        "--engine",
        engine,
        "--model",
        str(base_model_dir()),
        *where,
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m parley.demo", description=__doc__)
    parser.add_argument("--engine", choices=ENGINES, default="embedded", help="The model engine.")
    engine = parser.parse_args(argv).engine
    for port in (WEB_PORT, ENGINE_PORT):
        if not port_is_free(HOST, port):
            sys.exit(
                f"Port {port} on {HOST} is taken; stop what runs there or set PARLEY_PORT / PARLEY_ENGINE_PORT."
            )
    engine_url = f"http://{HOST}:{ENGINE_PORT}/v1"
    run("-m", "agents.serving.prepare")
    run("manage.py", "migrate", "--noinput", "-v", "0")
    seeded = subprocess.run(
        [PY, "manage.py", "seed_demo", "--engine-url", engine_url],
        # the password travels in the environment, never on a command line others can read
        env={**os.environ, "PARLEY_ADMIN_PASSWORD": admin_password()},
        cwd=REPO_DIR,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    slugs = [
        line.split()[0].removeprefix("study=")
        for line in seeded.splitlines()
        if line.startswith("study=")
    ]
    checkpoints = data_dir() / "checkpoints"
    checkpoints.mkdir(parents=True, exist_ok=True)
    launchers = {
        "engine": lambda: start("engine", *engine_command(engine, checkpoints)),
        # analysis and bot runs never queue behind a training run: each has its own worker
        "worker": lambda: start(
            "worker",
            *worker_args("--concurrency", "1", "--loglevel", "INFO", queues=SERVICE_QUEUES),
        ),
        "trainer": lambda: start(
            "trainer",
            *worker_args(
                "--concurrency",
                "1",
                "--loglevel",
                "INFO",
                "-n",
                "trainer@%h",
                queues=TRAINING_QUEUES,
            ),
        ),
        # the periodic tasks: participants past the time limit are timed out, places freed
        "beat": lambda: start(
            "beat", *beat_args(str(data_dir() / "celerybeat-schedule"), "--loglevel", "INFO")
        ),
        "web": lambda: start(
            "web",
            "-m",
            "uvicorn",
            "parley.asgi:application",
            "--host",
            HOST,
            "--port",
            str(WEB_PORT),
        ),
    }
    # one child that stops is started again; the others go on (a dead engine replica is
    # serve_agents' to start again, and the endpoint's other replicas serve meanwhile)
    children = {name: Supervised(name, launch(), launch) for name, launch in launchers.items()}

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        serve(children, engine_url, slugs, engine)
    except KeyboardInterrupt:
        print("\nStopping...", flush=True)
    finally:  # whatever happens, no server is left behind
        # serve_agents stops its replicas first
        stop(*(child.process for child in children.values()), timeout=30)


def serve(children: dict[str, Supervised], engine_url: str, slugs: list[str], engine: str) -> None:
    print("Waiting for the model engine and the web server...", flush=True)
    # vLLM's first start compiles for minutes (later ones take about one)
    seconds = 900 if engine == "vllm" else 600
    wait_for(f"http://{HOST}:{ENGINE_PORT}/health", "engine", children["engine"].process, seconds)
    wait_for(f"http://{HOST}:{WEB_PORT}/healthz", "web", children["web"].process)
    base = f"http://{HOST}:{WEB_PORT}"
    links = "\n".join(f"  Participant:  {participant_link(base, slug)}" for slug in slugs)
    print(
        f"""
parley demo is running (logs in {log_path("web").parent}).

  Admin:        {base}/admin/
                user: {settings.PARLEY_ADMIN_USER}   password: {admin_password()}
{links}
                (change PROLIFIC_PID for a new participant; the same one resumes)
  Model engine: {engine_url}  ({engine}, OpenAI-compatible; serves {base_model_dir().name})

Press Ctrl-C to stop.""",
        flush=True,
    )
    keep_running(children.values())


def keep_running(children) -> None:
    """Until Ctrl-C: each child that stops is reported and started again."""
    while True:
        for child in children:
            if line := child.check():
                print(line, flush=True)
        time.sleep(1)


if __name__ == "__main__":
    main()
