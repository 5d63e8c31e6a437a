"""Shared fixtures: real services (PostgreSQL, Redis) and a real model engine.

Under CI (PARLEY_CI=1) a test whose service is missing fails; on a laptop it is skipped.
"""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from parley.celery import worker_args

from agents.serving.process import (
    free_port,
    stop,
)
from tests.support.processes import (
    CHECKPOINT_NAME,
    IN_CI,
    REPO,
    SERVICE_SKIP,
    child_env,
    need,
    need_service,
)

# What makes a test's outcome depend on the set-up (SQLite or PostgreSQL, the in-memory channel
# layer or Redis, Celery's broker): the database (pytest-django refuses it to any other test), a
# service, or the servers and workers started on the test database.
SETUP_FIXTURES = {
    "db",
    "transactional_db",
    "django_db_reset_sequences",
    "django_db_serialized_rollback",
    "live_server",
    "postgres",
    "redis_url",
    "celery_worker",
    "web_server",
}
SETUP_FOLDERS = ("tests/studies/", "tests/platform/")  # the Django site's own tests, whole


def pytest_configure(config):
    """Ctrl-C as a terminal's foreground job has it. A suite started in the background by a
    non-interactive shell (`pytest &`, `nohup make test &`, a script's `cmd &`) inherits SIGINT
    ignored, Python keeps an ignored SIGINT ignored, and so does every server a test starts:
    each test that stops one with Ctrl-C (serve_agents, `make demo`) then waits out its minute
    and fails. Caught here, the signal is back to its default in every child (exec resets a
    caught signal, never an ignored one)."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_addoption(parser):
    parser.addoption(
        "--setup-dependent",
        action="store_true",
        help="only the tests whose outcome can depend on the set-up (database, channel layer, "
        "broker): the study app's and the platform's, and every other test that reaches the "
        "database or a service. .ci/run runs the whole suite on the README's defaults, then "
        "these on PostgreSQL and Redis.",
    )


def depends_on_setup(item) -> bool:
    path = item.nodeid.replace("\\", "/")
    return (
        path.startswith(SETUP_FOLDERS)
        or bool(SETUP_FIXTURES & set(item.fixturenames))
        or item.get_closest_marker("django_db") is not None
        or item.get_closest_marker("services") is not None
    )


def pytest_collection_modifyitems(config, items):
    if not config.getoption("--setup-dependent"):
        return
    kept = [item for item in items if depends_on_setup(item)]
    config.hook.pytest_deselected(items=[item for item in items if not depends_on_setup(item)])
    items[:] = kept


@pytest.fixture(scope="session", autouse=True)
def close_connection_pool(django_db_setup, django_db_blocker):
    """Close psycopg's pool before the test database is dropped (it keeps connections open)."""
    yield
    from django.db import connections

    with django_db_blocker.unblock():
        for connection in connections.all():
            if hasattr(connection, "close_pool"):
                connection.close_pool()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A transactional test's teardown whose flush fails says why beside the error: the cause
    (a deadlock, a pool timeout) and who else was on the test database (a worker still at work)."""
    report = yield
    if IN_CI and report.skipped and not hasattr(report, "wasxfail"):
        # CI skips nothing but a service its set-up has none of (need_service): whatever else a
        # test needs (a browser, vLLM, bubblewrap, the reference data) CI has, or should.
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if SERVICE_SKIP not in reason:
            report.outcome = "failed"
            report.longrepr = f"CI skips only for a missing service; this test skipped: {reason}"
    error = call.excinfo.value if call.excinfo is not None else None
    if call.when == "teardown" and "couldn't be flushed" in str(error):
        report.sections.append(("the failed flush", flush_failure(error)))
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    """A module skipped whole (pytest.skip at import), under the same rule as a test."""
    report = yield
    if IN_CI and report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if SERVICE_SKIP not in reason:
            report.outcome = "failed"
            report.longrepr = f"CI skips only for a missing service; this module skipped: {reason}"
    return report


def flush_failure(error: BaseException) -> str:
    from django.db import connection

    lines, cause = [], error.__cause__
    while cause is not None:
        lines.append(f"caused by {type(cause).__module__}.{type(cause).__name__}: {cause}")
        cause = cause.__cause__
    if connection.vendor != "postgresql":
        return "\n".join(lines)
    try:  # a connection of its own: Django's may be the broken one, and may be blocked here
        import psycopg

        params = {**connection.get_connection_params(), "connect_timeout": 5}
        # the database named in the error: after the last test, the test database is gone
        params["dbname"] = re.search(r"Database (.+) couldn't be flushed", str(error))[1]
        with psycopg.connect(**params, autocommit=True) as other:
            rows = other.execute(
                "SELECT pid, application_name, client_addr, client_port, state, wait_event_type,"
                " wait_event, xact_start, left(query, 300) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchall()
        lines.append(f"{len(rows)} other session(s) on {params.get('dbname')} just after:")
        lines += [repr(row) for row in rows]
    except Exception as failure:  # noqa: BLE001 - the report is a help, never a second error
        lines.append(f"pg_stat_activity not read: {failure!r}")
    return "\n".join(lines)


@pytest.fixture
def postgres(db):
    from django.db import connection

    need_service(connection.vendor == "postgresql", "needs DATABASE_URL pointing at PostgreSQL")
    return connection


@pytest.fixture
def redis_url():
    url = os.environ.get("REDIS_URL")
    need_service(bool(url), "needs REDIS_URL")
    import redis

    try:
        redis.Redis.from_url(url).ping()
    except redis.RedisError as error:
        need_service(False, f"Redis at {url} does not answer: {error}")
    return url


@pytest.fixture
async def sockets():
    """Opens chat sockets (Channels' WebsocketCommunicator) and disconnects, at the test's end and
    in its own event loop, every one still running: also after a failure or a socket the server
    closed. A consumer left running when the loop closes is cut off inside the Redis channel
    layer's receive, which leaves the layer broken for the next loop (a hang)."""
    from channels.testing import WebsocketCommunicator

    opened = []

    def open_socket(app, path):
        socket = WebsocketCommunicator(app, path)
        opened.append(socket)
        return socket

    yield open_socket
    for socket in opened:
        if socket._future is not None and not socket._future.done():
            await socket.disconnect(timeout=10)


@pytest.fixture(scope="session")
def base_model():
    from agents.serving.prepare import ensure_base_model

    return ensure_base_model()


@pytest.fixture(scope="session")
def checkpoints(base_model, tmp_path_factory) -> Path:
    """A run folder holding one checkpoint shaped like training.trainer.checkpoint's: the LoRA of
    training/configs/*.toml (r=8 on q, k, v and o) with random, large B weights, so the
    adapter's greedy reply cannot be the base model's."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    model = get_peft_model(model, config)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "lora_B" in name:
                weight.normal_(0.0, 0.05)  # peft starts B at zero: the adapter would be a no-op
    root = tmp_path_factory.mktemp("runs")
    folder = root / "p4g-single-cpu" / "checkpoints" / "step-000004"
    model.save_pretrained(folder)
    manifest = {
        "name": CHECKPOINT_NAME,
        "kind": "agent",
        "adapter": True,
        "base_model": str(base_model),
        "domain": "p4g",
        "regime": "single",
        "step": 4,
        "metrics": {"reward_mean": 0.0},
        "config": {"lora": {"r": 8, "alpha": 16}},
    }
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return root


@pytest.fixture(scope="session")
def vllm_ready():
    """The python that has vLLM (`make vllm`): its tests skip without it, and fail under CI,
    which installs it (.ci/run)."""
    from agents.paths import vllm_python
    from agents.serving.vllm import VLLMNotInstalled, check_vllm

    try:
        return check_vllm(vllm_python())
    except VLLMNotInstalled as error:
        need(False, str(error))


@pytest.fixture(scope="session")
def vllm_url(vllm_ready, base_model, checkpoints):
    """One vLLM server for the suite (a start costs a minute or more on this CPU): the base
    model and every checkpoint found as the embedded engine finds them, room for adapters
    loaded at run time (a trainer's live adapter, rank 8), and compact JSON, so a Verbalized
    simulator's k = 5 candidates fit its token budget. Servers with other settings (a Hermes
    template, a study's replicas) are started by their own tests."""
    from agents.serving.adapters import find_adapters
    from agents.serving.launch import stop_engine
    from agents.serving.vllm import start_vllm

    loras = {name: adapter.path for name, adapter in find_adapters(checkpoints).items()}
    url, process = start_vllm(
        base_model, loras=loras, runtime_lora_rank=8, compact_json=True, python=vllm_ready
    )
    yield url
    stop_engine(process, timeout=20)


@pytest.fixture(scope="session")
def engine_url(base_model):
    """The embedded engine serving SmolLM2 in its own process, as in production."""
    from agents.serving.launch import start_engine, stop_engine

    url, process = start_engine(base_model)
    yield url
    stop_engine(process)


@pytest.fixture(scope="session")
def celery_worker(django_db_setup, django_db_blocker):
    """A real Celery worker process on the configured broker, using the test database."""
    import time

    (REPO / "data").mkdir(exist_ok=True)  # a fresh checkout has none until `make model`
    log = open(REPO / "data" / "test-worker.log", "wb")  # noqa: SIM115
    with django_db_blocker.unblock():
        env = child_env(PGAPPNAME="suite celery worker")  # named in pg_stat_activity
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
