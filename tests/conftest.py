"""Shared fixtures: real services (PostgreSQL, Redis) and a real model engine.

Under CI (PARLEY_CI=1) a test whose service is missing fails; on a laptop it is skipped.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from parley.celery import worker_args

from agents.serving.process import free_port, stop  # noqa: F401 - tests import free_port from here

REPO = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("PARLEY_CI") == "1"


def need(condition: bool, why: str) -> None:
    if not condition:
        if IN_CI:
            pytest.fail(f"CI requires it: {why}")
        pytest.skip(why)


@pytest.fixture(scope="session", autouse=True)
def close_connection_pool(django_db_setup, django_db_blocker):
    """Close psycopg's pool before the test database is dropped (it keeps connections open)."""
    yield
    from django.db import connections

    with django_db_blocker.unblock():
        for connection in connections.all():
            if hasattr(connection, "close_pool"):
                connection.close_pool()


@pytest.fixture
def postgres(db):
    from django.db import connection

    need(connection.vendor == "postgresql", "needs DATABASE_URL pointing at PostgreSQL")
    return connection


@pytest.fixture
def redis_url():
    url = os.environ.get("REDIS_URL")
    need(bool(url), "needs REDIS_URL")
    import redis

    try:
        redis.Redis.from_url(url).ping()
    except redis.RedisError as error:
        need(False, f"Redis at {url} does not answer: {error}")
    return url


@pytest.fixture(scope="session")
def base_model():
    from agents.serving.prepare import ensure_base_model

    return ensure_base_model()


@pytest.fixture(scope="session")
def engine_url(base_model):
    """The embedded engine serving SmolLM2 in its own process, as in production."""
    from agents.serving.launch import start_engine, stop_engine

    url, process = start_engine(base_model)
    yield url
    stop_engine(process)


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


@pytest.fixture(scope="session")
def celery_worker(django_db_setup, django_db_blocker):
    """A real Celery worker process on the configured broker, using the test database."""
    import time

    log = open(REPO / "data" / "test-worker.log", "wb")  # noqa: SIM115
    with django_db_blocker.unblock():
        env = child_env()
    process = subprocess.Popen(
        [
            sys.executable,
            *worker_args(),
            "--pool",
            "solo",
            "--loglevel",
            "INFO",
            "-n",
            f"test-{os.getpid()}@%h",
        ],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while b"ready." not in (REPO / "data" / "test-worker.log").read_bytes():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(
                "the Celery worker did not start: "
                + (REPO / "data" / "test-worker.log").read_text()[-2000:]
            )
        time.sleep(0.3)
    yield process
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()


@pytest.fixture
def web_server(transactional_db):
    """The real ASGI server (uvicorn) in its own process, on the test database."""
    import time
    import urllib.request

    port = free_port()
    process = subprocess.Popen(
        # a socket left open by a test must not hold the server's shutdown past teardown
        [
            sys.executable,
            "-m",
            "uvicorn",
            "parley.asgi:application",
            "--port",
            str(port),
            "--timeout-graceful-shutdown",
            "2",
        ],
        cwd=REPO,
        env=child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(url + "/healthz", timeout=2)
            break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                pytest.fail(
                    "the ASGI server did not start: " + process.stderr.read().decode()[-2000:]
                )
            time.sleep(0.2)
    yield url
    stop(process, timeout=10)
