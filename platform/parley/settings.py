"""parley settings: everything from the environment, embedded defaults for a laptop.

Embedded (nothing set): SQLite in the data folder, in-memory channel layer, Celery on a
filesystem broker. Production/CI: DATABASE_URL (PostgreSQL, psycopg 3 pool), REDIS_URL
(channel layer and Celery broker), CELERY_BROKER_URL to use another broker (e.g. RabbitMQ).
"""

import secrets
import sys

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from agents.environment import InvalidSetting, Setting, setting
from agents.paths import REPO_DIR, data_dir


def env(declared: Setting, **default):
    """The declared variable read through the register (agents/environment.py): parsed as its
    kind, its default when unset or blank. A value that is not what it takes, or outside its
    bounds, stops start-up with ImproperlyConfigured naming the variable, what it must be and
    what it got. Each variable here is declared where it is read, and docs/configuration.md is
    written from the declarations (python -m parley.configuration_doc)."""
    try:
        return declared.read(**default)
    except InvalidSetting as error:
        raise ImproperlyConfigured(str(error)) from None


BASE_DIR = REPO_DIR
DATA_DIR = data_dir()  # its folders are made at start-up (parley/apps.py), not at import

# The key of platform/deploy/parley.env.example: a copy left unedited must not go live.
EXAMPLE_SECRET_KEY = "change-me-to-50-random-characters"


def production_secret_key(key: str) -> str:
    """The key when it can sign production sessions, else ImproperlyConfigured saying why."""
    if not key:
        raise ImproperlyConfigured("DJANGO_SECRET_KEY must be set when DJANGO_DEBUG is off.")
    if key == EXAMPLE_SECRET_KEY or key.startswith(("django-insecure", "dev-insecure")):
        raise ImproperlyConfigured(
            "DJANGO_SECRET_KEY is the example or a development key: generate a real one, e.g. "
            "python -c 'import secrets; print(secrets.token_urlsafe(50))'."
        )
    # Django's own bar (check --deploy, security.W009): 50 characters, 5 of them different.
    if len(key) < 50 or len(set(key)) < 5:
        raise ImproperlyConfigured(
            "DJANGO_SECRET_KEY is too short or too simple: use at least 50 random characters."
        )
    return key


# Blank is unset everywhere else; here unset means on, and a production env file's blank line
# must not turn debugging on.
_debug = setting("DJANGO_DEBUG", "bool", True, help="Django's debug mode; `0` in production")
_raw_debug = _debug.raw()
if _raw_debug is not None and not _raw_debug.strip():
    raise ImproperlyConfigured("DJANGO_DEBUG is blank: set it to 0 in production, or unset it.")
DEBUG = env(_debug)
_secret_key = setting(
    "DJANGO_SECRET_KEY",
    "str",
    "",
    shown_default="a per-process development key",
    help="required when `DJANGO_DEBUG=0`: 50+ random characters; the example's key is refused",
)
if DEBUG:
    # A development key that changes per process: fine for a laptop, never for production.
    SECRET_KEY = env(_secret_key) or "dev-insecure-" + secrets.token_urlsafe(32)
else:
    SECRET_KEY = production_secret_key(env(_secret_key))
# Any host only on a laptop; production names its hosts, or Host headers are the client's word.
_allowed_hosts = setting(
    "DJANGO_ALLOWED_HOSTS",
    "names",
    (),
    shown_default="`*` with `DJANGO_DEBUG=1`, else none",
    help="the site's host names; required (and no `*`) when `DJANGO_DEBUG=0`",
)
ALLOWED_HOSTS = list(env(_allowed_hosts, default=("*",) if DEBUG else ()))
if not DEBUG and (not ALLOWED_HOSTS or "*" in ALLOWED_HOSTS):
    raise ImproperlyConfigured(
        "DJANGO_ALLOWED_HOSTS must name the site's hosts (comma-separated, no '*') when "
        "DJANGO_DEBUG is off, e.g. DJANGO_ALLOWED_HOSTS=study.example.org."
    )
CSRF_TRUSTED_ORIGINS = list(
    env(
        setting(
            "DJANGO_CSRF_TRUSTED_ORIGINS",
            "names",
            (),
            help="origins (scheme, host and port) trusted for the admin's forms and the chat "
            "socket besides the request's own and `PARLEY_PUBLIC_URL`'s",
        )
    )
)
# Where `make demo` serves the site and the embedded engine; the URLs below default to them.
PARLEY_HOST = env(
    setting(
        "PARLEY_HOST", "str", "127.0.0.1", help="where `make demo` serves the site and the engine"
    )
)
PARLEY_PORT = env(
    setting(
        "PARLEY_PORT",
        "int",
        8000,
        least=1,
        most=65535,
        help="the port `make demo` serves the site on",
    )
)
PARLEY_ENGINE_PORT = env(
    setting(
        "PARLEY_ENGINE_PORT",
        "int",
        8001,
        least=1,
        most=65535,
        help="the port `make demo` serves the embedded engine on",
    )
)
_public_url = setting(
    "PARLEY_PUBLIC_URL",
    "url",
    None,
    shown_default="`http://PARLEY_HOST:PARLEY_PORT`",
    help="base of the participant links shown in the admin; with the request's own origin and "
    "`DJANGO_CSRF_TRUSTED_ORIGINS`, the origins (scheme, host and port) whose pages may open the "
    "chat socket",
)
PUBLIC_URL = env(_public_url, default=f"http://{PARLEY_HOST}:{PARLEY_PORT}").rstrip("/")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "parley",
    "agents",
    "training",
    "studies",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "parley.security.RequestBodyLimitMiddleware",  # 413 before a too-large body is read
    "parley.security.ContentSecurityPolicyMiddleware",
    "studies.participation.middleware.DatabaseUnavailableMiddleware",  # 503 and retry, not 500, while it is down
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "parley.urls"
ASGI_APPLICATION = "parley.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]


# --- database -----------------------------------------------------------------------------
_web_concurrency = setting(
    "WEB_CONCURRENCY",
    "int",
    1,  # uvicorn's own default for --workers
    least=1,
    help="uvicorn's web workers (it reads this too); each opens a database pool of its own",
)
_db_max_connections = setting(
    "PARLEY_DB_MAX_CONNECTIONS",
    "int",
    100,  # PostgreSQL's default
    least=1,
    help="PostgreSQL's `max_connections`: each web worker's pool opens up to `(max_connections - "
    "PARLEY_DB_OTHER_CONNECTIONS) / WEB_CONCURRENCY` (4 workers on 100: 22). An arrival waits up "
    "to `PARLEY_DB_POOL_TIMEOUT` for a pooled connection, then gets a 503: for bursts of N "
    "arrivals per worker, raise PostgreSQL's `max_connections` to at least workers x N + other "
    "and set this to it (more workers share the same total)",
)
_db_other_connections = setting(
    "PARLEY_DB_OTHER_CONNECTIONS",
    "int",
    10,
    least=0,
    help="the connections kept for Celery processes, beat, the superuser and psql",
)
_db_pool_max = setting(
    "PARLEY_DB_POOL_MAX",
    "int",
    None,
    least=1,
    shown_default="each web worker's share",
    help="a smaller pool than each web worker's share; a larger one is refused",
)


def pool_max_size() -> int:
    """The most connections one process's pool opens: its share of what PostgreSQL allows
    (max_connections less those kept for Celery, beat and the superuser) among the web
    workers, each of which opens a pool of its own. A burst of arrivals waits for a pooled
    connection, up to the pool's timeout, once a worker has them all in use."""
    workers = env(_web_concurrency)
    allowed = env(_db_max_connections)
    kept = env(_db_other_connections)
    share = (allowed - kept) // workers
    if share < 2:
        raise ImproperlyConfigured(
            f"{workers} web workers get {share} database connections each out of "
            f"PARLEY_DB_MAX_CONNECTIONS={allowed} less PARLEY_DB_OTHER_CONNECTIONS={kept}: "
            "raise PostgreSQL's max_connections (and PARLEY_DB_MAX_CONNECTIONS) or run fewer workers."
        )
    size = env(_db_pool_max)
    if size is None:
        return share
    if size > share:
        raise ImproperlyConfigured(
            f"PARLEY_DB_POOL_MAX={size} x {workers} web workers (WEB_CONCURRENCY) is more than "
            f"PARLEY_DB_MAX_CONNECTIONS={allowed} less PARLEY_DB_OTHER_CONNECTIONS={kept}; "
            f"set it to {share} or less, or leave it unset."
        )
    return size


DATABASE_URL = env(
    setting(
        "DATABASE_URL",
        "url",
        "",
        shown_default="SQLite in `data/`",
        help="e.g. `postgres://user@host:5432/parley` (psycopg 3 with a connection pool)",
    )
)
# SQLite's options wherever it is named (the default, or DATABASE_URL=sqlite:///...: the tests'
# servers and workers get the test database so): the web server, Celery and the engine's
# callbacks write to one file, so a writer waits for the lock (busy timeout) instead of
# failing, and a transaction takes it when it begins (IMMEDIATE), since one that read first
# and then writes gets "database is locked" at once, without waiting, when another holds it.
SQLITE_OPTIONS = {
    "timeout": 20,
    "transaction_mode": "IMMEDIATE",
    # A deleted row's bytes are overwritten, not left in the file's free pages: an erasure on
    # request (studies/privacy) must not leave a participant's words in the database file.
    # Debian's SQLite does it by default, other builds (macOS, python.org, conda) do not.
    "init_command": "PRAGMA secure_delete=ON;",
}
# The participant pages' hot reads compiled once (studies/lib/prepared_queries.py); off, they take
# Django's own query path: the way out if a Django upgrade changes the internals they lean on.
PARLEY_COMPILED_READS = env(
    setting(
        "PARLEY_COMPILED_READS",
        "bool",
        True,
        help="the participant pages' and chat turn's hot reads compiled once and run with new "
        "values (`studies/lib/prepared_queries.py`, which leans on Django's compiler internals, "
        "listed in [Layout, layers and tests](development.md#framework-internals)); `0` runs them "
        "through Django's own query path, at a few ms more server CPU a participant",
    )
)
# Each request's middleware and view in one thread hop (parley/http.py); off, Django's own ASGI
# handler: the way out if a Django or asgiref upgrade changes the internals it leans on.
PARLEY_ONE_HOP_HTTP = env(
    setting(
        "PARLEY_ONE_HOP_HTTP",
        "bool",
        True,
        help="each request's middleware and view run in one thread hop (`platform/parley/http.py`, "
        "which leans on Django's ASGI handler internals, listed in [Layout, layers and "
        "tests](development.md#framework-internals)); `0` serves on Django's own ASGI handler, "
        "about a dozen thread hops a request",
    )
)
# The chat socket's frames without Channels' close_old_connections hop before each
# (studies/chat/consumers.py ChatConsumer.dispatch); off, Channels' own dispatch.
PARLEY_LEAN_CHAT_DISPATCH = env(
    setting(
        "PARLEY_LEAN_CHAT_DISPATCH",
        "bool",
        True,
        help="the chat socket's frames are dispatched without Channels' hop to its sync thread "
        "before each (`studies/chat/consumers.py`, a copy of Channels' `dispatch`, listed in "
        "[Layout, layers and tests](development.md#framework-internals)); `0` runs Channels' own",
    )
)
_db_pool_timeout = setting(
    "PARLEY_DB_POOL_TIMEOUT",
    "float",
    5.0,
    above=0,
    help="seconds a request waits for a pooled PostgreSQL connection (while PostgreSQL is down, "
    "how soon the chat says a message could not be saved); connections are checked before use",
)
_db_pool_min = setting(
    "PARLEY_DB_POOL_MIN", "int", 1, least=0, help="the PostgreSQL pool's fewest open connections"
)
if DATABASE_URL:
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL)}
    if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
        DATABASES["default"]["OPTIONS"] = {
            **SQLITE_OPTIONS,
            **DATABASES["default"].get("OPTIONS", {}),
        }
    if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
        # psycopg 3 connection pool; Django then keeps no persistent connections of its own.
        DATABASES["default"]["CONN_MAX_AGE"] = 0
        # Each connection the pool hands out is checked first (one empty query): after
        # PostgreSQL restarts, its idle ones are dead, and the first request would get one.
        DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
        # Seconds a request waits for a connection: while PostgreSQL is down, this is how long
        # a participant waits to hear that something could not be saved.
        _pool_timeout = env(_db_pool_timeout)
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
            "min_size": env(_db_pool_min),
            "max_size": pool_max_size(),
            "timeout": _pool_timeout,
            # The pool's reconnection attempts back off (1, 2, 4 ... s) until this runs out; the
            # next request then tries at once. Never longer than a request waits, so the first
            # one after PostgreSQL returns is not left waiting on a long backoff.
            "reconnect_timeout": _pool_timeout,
        }
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": DATA_DIR / "parley.sqlite3",
            "OPTIONS": dict(SQLITE_OPTIONS),
            # A file, not memory, so servers started by the tests see the test database.
            "TEST": {"NAME": DATA_DIR / "test.sqlite3"},
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Redis connections ----------------------------------------------------------------------
# redis-py 8 cuts any read after 5 s by default, which is as long as channels-redis waits in
# its blocking BZPOPMIN: every idle WebSocket died every ~5 s (django/channels_redis#422). So
# each Redis client gets its options here, never from REDIS_URL's query string (which kombu
# would also read as its own options and break).
REDIS_URL = env(
    setting(
        "REDIS_URL",
        "url",
        "",
        shown_default="unset: in-memory channel layer",
        help="Redis for the Channels layer, the cache (the rate limits) and the Celery broker",
    )
)
# Seconds channels-redis's BZPOPMIN waits for a message (RedisChannelLayer.brpop_timeout).
CHANNELS_BLOCKING_READ = 5
# Longer than any blocking read (channels-redis 5 s, kombu's BRPOP 1 s), yet finite so a server
# that vanished without closing the socket is noticed: above twice channels-redis's wait.
REDIS_SOCKET_TIMEOUT = env(
    setting(
        "PARLEY_REDIS_SOCKET_TIMEOUT",
        "float",
        30.0,
        above=2 * CHANNELS_BLOCKING_READ,
        help="seconds any Redis read may take (channel layer, cache, Celery); must exceed 10: "
        "channels-redis blocks reads for 5 s (options live in settings, never in `REDIS_URL`'s "
        "query string)",
    )
)
REDIS_CONNECT_TIMEOUT = 5
REDIS_HEALTH_CHECK_INTERVAL = 25  # a PING first on a connection idle this long


def redis_options() -> dict:
    """Socket options every Redis client of the site shares (layer, cache, Celery)."""
    return {
        "socket_timeout": REDIS_SOCKET_TIMEOUT,
        "socket_connect_timeout": REDIS_CONNECT_TIMEOUT,
        "socket_keepalive": True,
        "health_check_interval": REDIS_HEALTH_CHECK_INTERVAL,
        # A timed-out write may still have happened: retrying it could deliver it twice.
        "retry_on_timeout": False,
    }


# --- channel layer ------------------------------------------------------------------------
# Names this site's keys in a Redis it may share: the layer's groups, the cache and the limits.
PARLEY_CHANNEL_PREFIX = env(
    setting(
        "PARLEY_CHANNEL_PREFIX",
        "str",
        "parley",
        help="names this site's keys in a Redis it may share: the channel layer's groups, the "
        "cache and the rate limits",
    )
)
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "studies.chat.redis_layer.ResilientRedisChannelLayer",  # a Redis outage never crashes a socket
            "CONFIG": {
                "hosts": [{"address": REDIS_URL, **redis_options()}],
                "prefix": PARLEY_CHANNEL_PREFIX,
            },
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# --- Celery ---------------------------------------------------------------------------------
# Celery's own names (a transport alias is no URL): text, not "url".
CELERY_BROKER_URL = (
    env(
        setting(
            "CELERY_BROKER_URL",
            "str",
            "",
            shown_default="`REDIS_URL`, else a filesystem broker in `data/`",
            help="e.g. `amqp://guest:guest@localhost//`",
        )
    )
    or REDIS_URL
    or "filesystem://"
)
_celery_visibility_timeout = setting(
    "PARLEY_CELERY_VISIBILITY_TIMEOUT",
    "int",
    43200,
    least=1,
    help="seconds before an unacknowledged task on the Redis broker goes to another worker; "
    "longer than the longest task",
)
CELERY_BROKER_TRANSPORT_OPTIONS = {}
if CELERY_BROKER_URL.startswith("filesystem://"):
    # A broker that needs no server: messages are files in the data folder.
    _broker_dir = DATA_DIR / "celery-broker"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "processed_folder": str(_broker_dir / "processed"),
        "control_folder": str(_broker_dir / "control"),
        "store_processed": False,
    }
elif CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        **redis_options(),
        # acks_late: a task unacknowledged this long is given to another worker, so it must
        # outlast the longest task (a training run), not kombu's default hour.
        "visibility_timeout": env(_celery_visibility_timeout),
    }
# Workers started before the broker keep trying instead of exiting (and Celery 5 asks for it).
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_CONNECTION_TIMEOUT = REDIS_CONNECT_TIMEOUT
CELERY_RESULT_BACKEND = env(
    setting(
        "CELERY_RESULT_BACKEND",
        "str",
        "",
        shown_default="`REDIS_URL`, else files in `data/celery-results`",
        help="where Celery keeps task results",
    )
) or (REDIS_URL or f"file://{DATA_DIR / 'celery-results'}")
# The result backend's own Redis client (used when it is Redis), with the same socket options.
CELERY_REDIS_SOCKET_TIMEOUT = REDIS_SOCKET_TIMEOUT
CELERY_REDIS_SOCKET_CONNECT_TIMEOUT = REDIS_CONNECT_TIMEOUT
CELERY_REDIS_SOCKET_KEEPALIVE = True
CELERY_REDIS_BACKEND_HEALTH_CHECK_INTERVAL = REDIS_HEALTH_CHECK_INTERVAL
CELERY_REDIS_RETRY_ON_TIMEOUT = False
CELERY_TASK_DEFAULT_QUEUE = "default"
CELERY_TASK_ROUTES = {
    "studies.tasks.run_analysis": {"queue": "analysis"},
    "studies.tasks.evaluate_simulators": {"queue": "analysis"},
    "training.tasks.*": {"queue": "training"},
}
CELERY_TASK_ALWAYS_EAGER = env(
    setting(
        "CELERY_TASK_ALWAYS_EAGER",
        "bool",
        False,
        help="run every task in the process that sends it, with no worker (tests)",
    )
)
# Celery beat (`make demo` and deploy/ start it): periodic tasks, one entry each.
PARLEY_TIMEOUT_SWEEP_SECONDS = env(
    setting(
        "PARLEY_TIMEOUT_SWEEP_SECONDS",
        "float",
        60.0,
        above=0,
        help="how often Celery beat times out participants past their study's time limit (their "
        "arm places are freed)",
    )
)
CELERY_BEAT_SCHEDULE = {
    # free the arm places of participants past their study's time limit
    "time-out-overdue-participants": {
        "task": "studies.tasks.time_out_overdue",
        "schedule": PARLEY_TIMEOUT_SWEEP_SECONDS,
        # a tick not run by the next one is dropped: the next sweep covers it
        "options": {"expires": PARLEY_TIMEOUT_SWEEP_SECONDS},
    },
}
# Each study's retention period (Study.retention_days): how often beat purges what is past it.
PARLEY_RETENTION_SWEEP_SECONDS = env(
    setting(
        "PARLEY_RETENTION_SWEEP_SECONDS",
        "float",
        3600.0,
        above=0,
        help="how often Celery beat purges the identifying data of participants past their "
        "study's retention period (the study's \"retention period (days)\")",
    )
)
CELERY_BEAT_SCHEDULE["purge-expired-participant-data"] = {
    "task": "studies.tasks.purge_expired_data",
    "schedule": PARLEY_RETENTION_SWEEP_SECONDS,
    "options": {"expires": PARLEY_RETENTION_SWEEP_SECONDS},  # the next sweep covers a late one
}
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ACKS_LATE = True

# --- model engine -----------------------------------------------------------------------------
# The embedded engine's URL; demo arms point here. Arms may point at any OpenAI-compatible server.
PARLEY_ENGINE_URL = env(
    setting(
        "PARLEY_ENGINE_URL",
        "url",
        None,
        shown_default="`http://PARLEY_HOST:PARLEY_ENGINE_PORT/v1`",
        help="the replica of the default model endpoint (`default`, made when first needed), "
        "where new arms point unless told otherwise",
    ),
    default=f"http://{PARLEY_HOST}:{PARLEY_ENGINE_PORT}/v1",
)
PARLEY_LLM_TIMEOUT = env(
    setting(
        "PARLEY_LLM_TIMEOUT",
        "float",
        120.0,
        above=0,
        help="seconds the site's model client (the chat's agent turns, the simulator "
        "evaluations) waits on a model request",
    )
)
# The sim-to-real report: conversations per held-out simulator and scenario of the study's pool.
PARLEY_SIM2REAL_CONVERSATIONS = env(
    setting(
        "PARLEY_SIM2REAL_CONVERSATIONS",
        "int",
        1,
        least=1,
        help="the sim-to-real report: conversations per held-out simulator and scenario of the "
        "study's pool ([Sim-to-real gap](analysis.md#sim-to-real-gap))",
    )
)
# Its behaviour section (studies/analysis/sim2real_behaviour.py): the local model folder whose
# mean-pooled hidden states embed the turns ("" = the base model, PARLEY_BASE_MODEL; nothing is
# downloaded), and the clusters of the space fit on the study's participants' turns.
PARLEY_SIM2REAL_EMBEDDER = env(
    setting(
        "PARLEY_SIM2REAL_EMBEDDER",
        "str",
        "",
        shown_default="the base model (`PARLEY_BASE_MODEL`)",
        help="the sim-to-real report's behaviour section: the local model folder whose mean-pooled "
        "hidden states embed the turns (nothing is downloaded)",
    )
)
PARLEY_SIM2REAL_CLUSTERS = env(
    setting(
        "PARLEY_SIM2REAL_CLUSTERS",
        "int",
        8,
        least=2,
        most=200,
        help="the sim-to-real report's behaviour section: the clusters of the space fit on the "
        "study's participants' turns",
    )
)
# A running training run whose worker has not beaten this long is shown as "worker lost"; the
# worker beats every quarter of it.
PARLEY_TRAINING_LOST_AFTER = env(
    setting(
        "PARLEY_TRAINING_LOST_AFTER",
        "float",
        120.0,
        above=0,
        help="seconds without a heartbeat (the worker beats every quarter of it) before a running "
        'training run shows "worker lost"',
    )
)
# Model endpoints (agents/models.py): how often beat probes every replica's /health and /v1/models
PARLEY_ENDPOINT_CHECK_INTERVAL = env(
    setting(
        "PARLEY_ENDPOINT_CHECK_INTERVAL",
        "float",
        30.0,
        above=0,
        help="seconds between Celery beat's health checks of every model endpoint replica (`GET "
        "/health`, `GET /v1/models`); stored results older than this are checked again before an "
        "arm is saved",
    )
)
CELERY_BEAT_SCHEDULE["check-model-endpoints"] = {
    "task": "agents.tasks.check_endpoints",
    "schedule": PARLEY_ENDPOINT_CHECK_INTERVAL,
    "options": {"expires": PARLEY_ENDPOINT_CHECK_INTERVAL},  # a late check is superseded
}
# An arm pointed at a model no healthy replica serves: "refuse" the save, or only "warn".
PARLEY_ARM_MODEL_CHECK = env(
    setting(
        "PARLEY_ARM_MODEL_CHECK",
        "choice",
        "refuse",
        choices=("refuse", "warn"),
        help="an arm pointed at a model no healthy replica of its endpoint serves: `refuse` the "
        "save (with the served names), or `warn` and save",
    )
)


# --- the chat's guards (studies/chat/consumers.py, chat.py, ratelimit.py, middleware.py) ------------

# s without a token mid-reply (a notice well within 10 s), and before the first one (a busy
# engine may be slow to start: prefill, a queue; until then the page is only told it is slow)
PARLEY_STALL_TIMEOUT = env(
    setting(
        "PARLEY_STALL_TIMEOUT",
        "float",
        8.0,
        least=0,
        help="seconds without a token (text or tool call, shown or not) mid-reply before the chat "
        "says the engine stalled",
    )
)
PARLEY_FIRST_TOKEN_TIMEOUT = env(
    setting(
        "PARLEY_FIRST_TOKEN_TIMEOUT",
        "float",
        45.0,
        least=0,
        help="seconds before the first token before the chat says the engine stalled",
    )
)
# a larger chat frame closes the socket (1009); a message is far smaller
PARLEY_MAX_FRAME_BYTES = env(
    setting(
        "PARLEY_MAX_FRAME_BYTES",
        "int",
        64 * 1024,
        least=0,
        help="a larger chat frame closes the socket (1009)",
    )
)
PARLEY_DB_RETRY_AFTER = env(
    setting(
        "PARLEY_DB_RETRY_AFTER",
        "int",
        5,
        least=0,
        help="seconds a 503 (the database unavailable) asks the page to wait (`Retry-After`)",
    )
)
# per minute; 0 turns a limit off. Loopback is exempt from the per-IP limits (bots, load runs).
_rate_window = (
    "per minute, in a window that opens at its first event, counted on the cache's Redis (each "
    "process on its own without it); `0` turns it off"
)
PARLEY_RATE_ARRIVALS_PER_IP = env(
    setting(
        "PARLEY_RATE_ARRIVALS_PER_IP",
        "int",
        30,
        least=0,
        help="arrivals from one address " + _rate_window,
    )
)
PARLEY_RATE_MESSAGES_PER_PARTICIPANT = env(
    setting(
        "PARLEY_RATE_MESSAGES_PER_PARTICIPANT",
        "int",
        20,
        least=0,
        help="chat messages from one participant " + _rate_window,
    )
)
PARLEY_RATE_MESSAGES_PER_IP = env(
    setting(
        "PARLEY_RATE_MESSAGES_PER_IP",
        "int",
        120,
        least=0,
        help="chat messages from one address " + _rate_window,
    )
)
PARLEY_RATE_EXEMPT_IPS = env(
    setting(
        "PARLEY_RATE_EXEMPT_IPS",
        "names",
        ("127.0.0.1", "::1"),
        help="addresses not limited by address (bots, load runs); blank: none",
    )
)

# --- Prolific (studies/prolific/api.py): the token and the webhook secret live only here, in memory;
# never in the database or a log. Both unset: the Prolific features say they are not configured.
PROLIFIC_API_TOKEN = env(
    setting(
        "PROLIFIC_API_TOKEN",
        "str",
        "",
        help="the researcher's Prolific API token ([Prolific](prolific.md)); unset: the Prolific "
        "features say they are not configured",
    )
).strip()
PROLIFIC_WEBHOOK_SECRET = env(
    setting(
        "PROLIFIC_WEBHOOK_SECRET",
        "str",
        "",
        help="the secret Prolific signs its webhooks with ([Prolific](prolific.md))",
    )
).strip()
PROLIFIC_API_URL = env(
    setting(
        "PROLIFIC_API_URL",
        "url",
        "https://api.prolific.com",
        help="Prolific's API (another for a stand-in in tests)",
    )
).rstrip("/")
PROLIFIC_TIMEOUT = env(
    setting("PROLIFIC_TIMEOUT", "float", 30.0, least=0, help="seconds per Prolific API request")
)
# A webhook whose X-Prolific-Request-Timestamp is further than this from now is refused (s).
PROLIFIC_WEBHOOK_MAX_AGE = env(
    setting(
        "PROLIFIC_WEBHOOK_MAX_AGE",
        "int",
        300,
        least=0,
        help="seconds a webhook's `X-Prolific-Request-Timestamp` may be from now; older or newer "
        "is refused",
    )
)
PROLIFIC_SYNC_INTERVAL = env(
    setting(
        "PROLIFIC_SYNC_INTERVAL",
        "float",
        300.0,
        least=0,
        help="seconds between Celery beat's syncs of Prolific submissions, both ways",
    )
)
# Prolific submissions both ways (studies/prolific/sync.py), beside the webhook's fast path.
CELERY_BEAT_SCHEDULE["prolific-sync"] = {
    "task": "studies.tasks.sync_prolific",
    "schedule": PROLIFIC_SYNC_INTERVAL,
}
# Seconds after a bonus pay call of unknown result (timeout, 5xx, crash) before, if no submission
# shows the bonus, it counts as unpaid and may be paid again (the pay call is asynchronous).
PROLIFIC_BONUS_CONFIRM_AFTER = env(
    setting(
        "PROLIFIC_BONUS_CONFIRM_AFTER",
        "float",
        3600.0,
        least=0,
        help="seconds after a bonus pay call of unknown result before, if no submission shows the "
        "bonus, it counts as unpaid and may be paid again",
    )
)

# --- the demo's admin account (make demo; seed_demo) -----------------------------------------
PARLEY_ADMIN_USER = env(setting("PARLEY_ADMIN_USER", "str", "admin", help="the demo's admin user"))
PARLEY_ADMIN_PASSWORD = env(
    setting(
        "PARLEY_ADMIN_PASSWORD",
        "str",
        "",
        shown_default="generated once into `data/demo-admin-password`",
        help="the demo's admin password (`seed_demo --admin-password` also takes it)",
    )
)

# --- i18n / static --------------------------------------------------------------------------
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"
# WhiteNoise serves static files from the ASGI server; finders spare the demo a collectstatic.
WHITENOISE_USE_FINDERS = True

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # The one list of what every log line passes through (parley/server_log.py): a client's
    # fault or a refusal in one line, then participants' tokens and Prolific ids masked. uvicorn's
    # and Celery's own handlers get the same filters (server_log.attach).
    "filters": {
        "client_faults": {"()": "parley.server_log.ClientFaultsInOneLine"},
        "participants": {"()": "parley.server_log.RedactParticipants"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "stream": sys.stderr,
            "filters": ["client_faults", "participants"],
        }
    },
    "root": {
        "handlers": ["console"],
        "level": env(
            setting(
                "PARLEY_LOG_LEVEL",
                "choice",
                "INFO",
                choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"),
                help="the root logger's level",
            )
        ),
    },
    # Django's own console handler (DEBUG) would print its records a second time, unfiltered.
    "loggers": {"django": {"handlers": [], "level": "INFO", "propagate": True}},
}

# --- cache; the rate limits count on its Redis, or in each process (studies/participation/ratelimit.py) ------
if REDIS_URL:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": PARLEY_CHANNEL_PREFIX,
            "OPTIONS": redis_options(),
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# --- admin login limiter (parley/security.py): failures within the window, then 429 ---------
PARLEY_LOGIN_FAILURES_PER_USER = env(
    setting(
        "PARLEY_LOGIN_FAILURES_PER_USER",
        "int",
        5,
        least=1,
        help="failed admin logins for one username within `PARLEY_LOGIN_WINDOW` before the login "
        "answers 429",
    )
)
PARLEY_LOGIN_FAILURES_PER_IP = env(
    setting(
        "PARLEY_LOGIN_FAILURES_PER_IP",
        "int",
        20,
        least=1,
        help="failed admin logins from one address within `PARLEY_LOGIN_WINDOW` before the login "
        "answers 429",
    )
)
PARLEY_LOGIN_WINDOW = env(
    setting(
        "PARLEY_LOGIN_WINDOW", "int", 900, least=1, help="the failed logins' window, in seconds"
    )
)

# --- HTTPS (production) ---------------------------------------------------------------------
# Read only with DJANGO_DEBUG=0; declared here whatever it is, so the docs always list them.
_behind_tls_proxy = setting(
    "DJANGO_BEHIND_TLS_PROXY",
    "bool",
    True,
    help="with `DJANGO_DEBUG=0`: trust the proxy's `X-Forwarded-Proto: https` "
    "(`SECURE_PROXY_SSL_HEADER`)",
)
_ssl_redirect = setting(
    "DJANGO_SECURE_SSL_REDIRECT",
    "bool",
    True,
    help="with `DJANGO_DEBUG=0`: redirect http to https (not `/healthz`)",
)
_hsts = "with `DJANGO_DEBUG=0`: the HSTS header (the defaults pass `check --deploy`)"
_hsts_seconds = setting(
    "DJANGO_SECURE_HSTS_SECONDS", "int", 365 * 24 * 3600, least=0, help=_hsts + ": its max-age"
)
_hsts_subdomains = setting(
    "DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", "bool", True, help=_hsts + ": includeSubDomains"
)
_hsts_preload = setting("DJANGO_SECURE_HSTS_PRELOAD", "bool", True, help=_hsts + ": preload")
if not DEBUG:
    # Behind a proxy that terminates TLS (platform/deploy/nginx.conf) and sets
    # X-Forwarded-Proto itself, overwriting any client's: that header says the request was https.
    if env(_behind_tls_proxy):
        SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = env(_ssl_redirect)
    # Probes reach the workers directly over http: /healthz answers there without a redirect.
    SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
    SECURE_HSTS_SECONDS = env(_hsts_seconds)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env(_hsts_subdomains)
    SECURE_HSTS_PRELOAD = env(_hsts_preload)
    SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = True
