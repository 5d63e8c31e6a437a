"""The project layout and settings: `platform` stays the standard library everywhere."""

import ast
import json
import os
import re
import sys
import sysconfig
import time
import tomllib
import urllib.request
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

from tests.support.processes import REPO, child_env, python

STDLIB = Path(sysconfig.get_paths()["stdlib"]).resolve()


def is_stdlib(path: str) -> bool:
    return Path(path).resolve().parent == STDLIB


def test_layout():
    for name in [
        "platform/parley/settings.py",
        "agents",
        "training",
        "studies",
        "tests",
        "manage.py",
        "pyproject.toml",
        "Makefile",
        "README.md",
        ".ci/run",
    ]:
        assert (REPO / name).exists(), name
    assert not (REPO / "platform" / "__init__.py").exists()


def parse(source: str) -> ast.AST:
    """ast.parse, again if CPython 3.11.7's ast conversion trips over another thread's (its
    recursion count is the interpreter's, not the thread's: "AST constructor recursion depth
    mismatch", CPython gh-106905, fixed in 3.11.8); the suite's servers leave threads behind."""
    for attempt in range(5):
        try:
            return ast.parse(source)
        except SystemError:
            if attempt == 4:
                raise
            time.sleep(0.1)


def imported_modules(folder: Path) -> dict[str, str]:
    """Top-level module -> a file importing it, for every absolute import under `folder`; a
    Domain's bundled data (`data/`: CooperBench's task repository) is not parley's code."""
    found = {}
    for path in sorted(folder.rglob("*.py")):
        if "data" in path.relative_to(folder).parts:
            continue
        for node in ast.walk(parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], str(path.relative_to(REPO)))
    return found


def test_every_imported_package_is_declared():
    """A package the code imports is a declared dependency, not one that arrives only because
    another needs it today (openai brings httpx2; the next openai may not)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = {
        re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9_.-]+", spec)[0]).lower()
        for spec in project["dependencies"]
    }
    distributions = packages_distributions()
    first_party = {"agents", "training", "studies", "parley"}
    # installed apart, never in parley's venv: vLLM has its own (`make vllm`), where parley's
    # plugin for it runs (agents/serving/vllm-plugin), and a GPU trainer pushing its weights
    # by NCCL imports vLLM's engine where vLLM is installed (training/rollouts/weight_sync.py)
    apart = {"vllm"}
    undeclared = {}
    for folder in ["agents", "training", "studies", "platform"]:
        for module, path in imported_modules(REPO / folder).items():
            if module in sys.stdlib_module_names or module in first_party | apart:
                continue
            names = {re.sub(r"[-_.]+", "-", d).lower() for d in distributions.get(module, [])}
            if not names & declared:
                undeclared[module] = path
    assert not undeclared, f"imported but not in pyproject's dependencies: {undeclared}"


def test_platform_under_pytest():
    import platform

    assert is_stdlib(platform.__file__)
    assert callable(platform.python_version)


def test_platform_from_repo_root():
    result = python("-c", "import platform, parley; print(platform.__file__)")
    assert result.returncode == 0, result.stderr
    assert is_stdlib(result.stdout.strip())


def test_platform_from_manage_py():
    result = python("manage.py", "shell", "-c", "import platform; print(platform.__file__)")
    assert result.returncode == 0, result.stderr
    assert is_stdlib(result.stdout.strip().splitlines()[-1])


def test_asgi_server_answers_healthz(web_server):
    # /healthz no longer shows the server's paths (issue 10): the ASGI app importing and
    # answering from the repository root is the check; test_platform_from_repo_root has the path.
    with urllib.request.urlopen(web_server + "/healthz", timeout=10) as response:
        body = json.load(response)
    assert body["status"] == "ok" and body["database"] is True


def test_platform_in_celery_worker(celery_worker):
    from parley.celery import health

    result = health.delay().get(timeout=60)
    assert is_stdlib(result["platform_file"])


SETTINGS_PROBE = (
    "import json; from django.conf import settings as s; import django; django.setup(); "
    "print(json.dumps({'db': s.DATABASES['default']['ENGINE'], 'pool': 'pool' in s.DATABASES['default'].get('OPTIONS', {}), "
    "'layer': s.CHANNEL_LAYERS['default']['BACKEND'], 'broker': s.CELERY_BROKER_URL, "
    "'layer_read_timeout': [h.get('socket_timeout') for h in s.CHANNEL_LAYERS['default'].get('CONFIG', {}).get('hosts', [])], "
    "'broker_read_timeout': s.CELERY_BROKER_TRANSPORT_OPTIONS.get('socket_timeout')}))"
)


def probe(**env):
    clean = {
        k: v
        for k, v in child_env().items()
        if k not in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL")
    }
    result = python(
        "-c", SETTINGS_PROBE, env={**clean, "DJANGO_SETTINGS_MODULE": "parley.settings", **env}
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.django_db
def test_embedded_settings_need_no_server():
    got = probe()
    assert got == {
        "db": "django.db.backends.sqlite3",
        "pool": False,
        "layer": "channels.layers.InMemoryChannelLayer",
        "broker": "filesystem://",
        "layer_read_timeout": [],
        "broker_read_timeout": None,
    }


SQLITE_PROBE = (
    "import json, django; from django.conf import settings as s; django.setup(); "
    "print(json.dumps(s.DATABASES['default'].get('OPTIONS', {})))"
)


@pytest.mark.django_db
@pytest.mark.parametrize("url", [None, "sqlite:////tmp/elsewhere.sqlite3"], ids=["default", "url"])
def test_sqlite_waits_for_its_lock_however_it_is_named(url):
    """The tests' servers and workers get the test database as DATABASE_URL=sqlite:///...: it
    lost the busy timeout and IMMEDIATE transactions, and concurrent bots got "database is
    locked" (a 503) at once."""
    env = {"DATABASE_URL": url} if url else {}
    clean = {k: v for k, v in child_env().items() if k != "DATABASE_URL"}
    result = python("-c", SQLITE_PROBE, env={**clean, **env})
    assert result.returncode == 0, result.stderr
    options = json.loads(result.stdout.strip().splitlines()[-1])
    assert options["timeout"] >= 20 and options["transaction_mode"] == "IMMEDIATE"


@pytest.mark.django_db
def test_production_settings_from_environment():
    got = probe(
        DATABASE_URL="postgres://u@db.example:5432/parley", REDIS_URL="redis://cache:6379/1"
    )
    assert (
        got
        == {
            "db": "django.db.backends.postgresql",
            "pool": True,
            "layer": "studies.chat.redis_layer.ResilientRedisChannelLayer",  # channels-redis, outage-proof
            "broker": "redis://cache:6379/1",
            # Longer than channels-redis's 5 s blocking read (redis-py 8 would cut it at 5 s).
            "layer_read_timeout": [30.0],
            "broker_read_timeout": 30.0,
        }
    )


POOL_PROBE = (
    "import json, django; from django.conf import settings as s; django.setup(); "
    "print(json.dumps(s.DATABASES['default']['OPTIONS']['pool']['max_size']))"
)


def pool_size(**env):
    return python(
        "-c",
        POOL_PROBE,
        env={
            **child_env(),
            "DJANGO_SETTINGS_MODULE": "parley.settings",
            "DATABASE_URL": "postgres://u@db.example:5432/parley",
            **env,
        },
    )


def test_pool_is_each_web_workers_share_of_max_connections():
    """Every web worker opens a pool of its own: together they stay within what PostgreSQL
    allows, and each gets all of its share (a burst waits on a small pool, then gets 503s)."""
    sized = pool_size(WEB_CONCURRENCY="4", PARLEY_DB_MAX_CONNECTIONS="100")
    assert sized.returncode == 0, sized.stderr
    assert json.loads(sized.stdout) == (100 - 10) // 4
    assert json.loads(pool_size(WEB_CONCURRENCY="2", PARLEY_DB_MAX_CONNECTIONS="200").stdout) == 95
    assert json.loads(pool_size(PARLEY_DB_POOL_MAX="8").stdout) == 8  # a smaller pool, if set

    too_big = pool_size(WEB_CONCURRENCY="4", PARLEY_DB_POOL_MAX="30")
    assert too_big.returncode != 0
    assert "PARLEY_DB_POOL_MAX=30 x 4 web workers" in too_big.stderr
    assert "set it to 22 or less" in too_big.stderr
    crowded = pool_size(WEB_CONCURRENCY="60")
    assert crowded.returncode != 0
    assert "60 web workers get 1 database connections each" in crowded.stderr
    bad = pool_size(WEB_CONCURRENCY="four")
    assert "WEB_CONCURRENCY must be a whole number of 1 or more (got 'four')" in bad.stderr


def import_settings(probe: str = "", **env):
    return python("-c", "import parley.settings as s; " + probe, env={**os.environ, **env})


@pytest.mark.parametrize(
    "name, value, expected",
    [
        ("PARLEY_LOGIN_WINDOW", "15m", "a whole number of 1 or more"),
        ("PARLEY_LLM_TIMEOUT", "two minutes", "a number above 0"),
        ("CELERY_TASK_ALWAYS_EAGER", "sometimes", "a yes or no: 1/0, true/false, yes/no or on/off"),
        ("PARLEY_PORT", "80800", "a whole number from 1 to 65535"),
        ("PARLEY_REDIS_SOCKET_TIMEOUT", "5", "a number above 10"),
        ("PARLEY_ARM_MODEL_CHECK", "ask", "one of refuse, warn"),
    ],
)
def test_a_bad_value_stops_start_up_naming_the_variable_and_what_it_must_be(name, value, expected):
    """One error for every variable, whatever its type: an int, a float, a bool, a bounded one
    and a choice each stop settings with ImproperlyConfigured, the name, the rule and the value."""
    result = import_settings(**{name: value})
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1] == (
        f"django.core.exceptions.ImproperlyConfigured: {name} must be {expected} (got {value!r})."
    )


def test_a_blank_value_is_unset_but_a_blank_list_is_empty_and_a_blank_debug_is_refused():
    """A `NAME=` line left blank in an env file: the default, for a number as for text; an empty
    list (no address exempt from the limits); and never debugging on in production."""
    probe = "print(json.dumps([s.PARLEY_LOGIN_WINDOW, s.PARLEY_HOST, s.PARLEY_RATE_EXEMPT_IPS]))"
    blank = import_settings(
        "import json; " + probe, PARLEY_LOGIN_WINDOW=" ", PARLEY_HOST="", PARLEY_RATE_EXEMPT_IPS=""
    )
    assert json.loads(blank.stdout) == [900, "127.0.0.1", []], blank.stderr
    debug = import_settings(DJANGO_DEBUG="")
    assert debug.returncode != 0 and "DJANGO_DEBUG is blank" in debug.stderr


@pytest.mark.django_db
def test_production_refuses_missing_secret():
    result = python(
        "-c",
        "import django; django.setup()",
        env={
            **child_env(),
            "DJANGO_SETTINGS_MODULE": "parley.settings",
            "DJANGO_DEBUG": "0",
            "DJANGO_SECRET_KEY": "",
        },
    )
    assert result.returncode != 0
    assert "DJANGO_SECRET_KEY must be set" in result.stderr


def test_a_deployments_own_settings_module_can_extend_parleys(tmp_path):
    """`from parley.settings import *` in a deployment's settings (the load bench has one):
    importing parley must not read settings before they exist (Celery's beat schedule once did)."""
    (tmp_path / "site_settings.py").write_text(
        "from parley.settings import *  # noqa\nSITE_MARK = 'site'\n"
    )
    result = python(
        "-c",
        "import django; django.setup(); from django.conf import settings; "
        "from parley.celery import app; print(settings.SITE_MARK, sorted(app.conf.beat_schedule))",
        env={
            **child_env(),
            "DJANGO_SETTINGS_MODULE": "site_settings",
            "PYTHONPATH": f"{tmp_path}:{REPO}:{REPO / 'platform'}",
        },
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[0] == "site" and "prolific-sync" in result.stdout


@pytest.mark.parametrize(
    "order", [["agents", "training", "studies"], ["studies", "training", "agents"]]
)
def test_one_checkpoint_admin_whatever_the_order_of_the_apps(tmp_path, order):
    """agents' registry, training's run column and studies' attach action are composed in one
    place (platform/parley/admin.py), not by each app extending whatever the last registered."""
    (tmp_path / "reordered.py").write_text(
        "from parley.settings import *  # noqa\n"
        f"INSTALLED_APPS = [a for a in INSTALLED_APPS if a not in {order!r}] + {order!r}\n"
    )
    result = python(
        "-c",
        "import django; django.setup(); from django.contrib import admin; "
        "from django.contrib.auth.models import User; from django.test import RequestFactory; "
        "from agents.models import Checkpoint; r = RequestFactory().get('/'); "
        "r.user = User(is_superuser=True, is_staff=True); "
        "m = admin.site.get_model_admin(Checkpoint); "
        "print(type(m).__name__, m.get_list_display(r)[-1], sorted(m.get_actions(r)))",
        env={
            **child_env(),
            "DJANGO_SETTINGS_MODULE": "reordered",
            "PYTHONPATH": f"{tmp_path}:{REPO}:{REPO / 'platform'}",
        },
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        "ProjectCheckpointAdmin",
        "training_run",
        "['attach_to_arm',",
        "'delete_selected']",
    ]


@pytest.mark.django_db
def test_the_favicon_is_served_not_a_404(client):
    response = client.get("/favicon.ico")
    assert response.status_code == 200 and response["Content-Type"] == "image/svg+xml"
    assert response.content.startswith(b"<svg") and "max-age=86400" in response["Cache-Control"]
