"""parley settings: everything from the environment, embedded defaults for a laptop.

Embedded (nothing set): SQLite in the data folder, in-memory channel layer, Celery on a
filesystem broker. Production/CI: DATABASE_URL (PostgreSQL, psycopg 3 pool), REDIS_URL
(channel layer and Celery broker), CELERY_BROKER_URL to use another broker (e.g. RabbitMQ).
"""

import os
import secrets
import sys

import dj_database_url
import environs
from django.core.exceptions import ImproperlyConfigured

from agents.paths import REPO_DIR, data_dir

# Every variable is parsed here, one way: environs (marshmallow's fields and validators) rather
# than django-environ, which casts with int()/float() (an error that names no variable) and
# takes any bool it does not know as False.
_environment = environs.Env()


@_environment.parser_for("names")
def _names(value: str) -> tuple[str, ...]:
    """A comma-separated list, each name stripped, empty ones dropped."""
    return tuple(part.strip() for part in value.split(",") if part.strip())


def env(kind: str, name: str, default, *, least=None, most=None, above=None, among=None):
    """The variable `name` parsed as `kind` ("str", "int", "float", "bool", "names"), or
    `default` when it is unset or blank (a `NAME=` line left in an env file), except that a
    blank list is the empty one. A value that is no `kind`, or outside the bounds, stops
    start-up with ImproperlyConfigured naming the variable, what it must be and what it got."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    if not raw.strip():
        return () if kind == "names" else default
    rules = []
    if least is not None or most is not None:
        rules.append(environs.validate.Range(min=least, max=most))
    if above is not None:
        rules.append(environs.validate.Range(min=above, min_inclusive=False))
    if among is not None:
        rules.append(environs.validate.OneOf(among))
    try:
        return getattr(_environment, kind)(name, **({"validate": rules} if rules else {}))
    except environs.EnvError:
        expected = {
            "int": "a whole number",
            "float": "a number",
            "bool": "a yes or no: 1/0, true/false, yes/no or on/off",
        }.get(kind, "text")
        if among is not None:
            expected = "one of " + ", ".join(among)
        elif least is not None and most is not None:
            expected += f" from {least} to {most}"
        elif least is not None:
            expected += f" of {least} or more"
        elif most is not None:
            expected += f" of {most} or less"
        elif above is not None:
            expected += f" above {above}"
        raise ImproperlyConfigured(f"{name} must be {expected} (got {raw!r}).") from None


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
if "DJANGO_DEBUG" in os.environ and not os.environ["DJANGO_DEBUG"].strip():
    raise ImproperlyConfigured("DJANGO_DEBUG is blank: set it to 0 in production, or unset it.")
DEBUG = env("bool", "DJANGO_DEBUG", True)
if DEBUG:
    # A development key that changes per process: fine for a laptop, never for production.
    SECRET_KEY = env("str", "DJANGO_SECRET_KEY", "") or "dev-insecure-" + secrets.token_urlsafe(32)
else:
    SECRET_KEY = production_secret_key(env("str", "DJANGO_SECRET_KEY", ""))
# Any host only on a laptop; production names its hosts, or Host headers are the client's word.
ALLOWED_HOSTS = list(env("names", "DJANGO_ALLOWED_HOSTS", ("*",) if DEBUG else ()))
if not DEBUG and (not ALLOWED_HOSTS or "*" in ALLOWED_HOSTS):
    raise ImproperlyConfigured(
        "DJANGO_ALLOWED_HOSTS must name the site's hosts (comma-separated, no '*') when "
        "DJANGO_DEBUG is off, e.g. DJANGO_ALLOWED_HOSTS=study.example.org."
    )
CSRF_TRUSTED_ORIGINS = list(env("names", "DJANGO_CSRF_TRUSTED_ORIGINS", ()))
# Where `make demo` serves the site and the embedded engine; the URLs below default to them.
PARLEY_HOST = env("str", "PARLEY_HOST", "127.0.0.1")
PARLEY_PORT = env("int", "PARLEY_PORT", 8000, least=1, most=65535)
PARLEY_ENGINE_PORT = env("int", "PARLEY_ENGINE_PORT", 8001, least=1, most=65535)
PUBLIC_URL = env("str", "PARLEY_PUBLIC_URL", f"http://{PARLEY_HOST}:{PARLEY_PORT}").rstrip("/")

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
def pool_max_size() -> int:
    """The most connections one process's pool opens: its share of what PostgreSQL allows
    (max_connections less those kept for Celery, beat and the superuser) among the web
    workers, each of which opens a pool of its own. A burst of arrivals waits for a pooled
    connection, up to the pool's timeout, once a worker has them all in use."""
    workers = env("int", "WEB_CONCURRENCY", 1, least=1)  # uvicorn's own default for --workers
    allowed = env("int", "PARLEY_DB_MAX_CONNECTIONS", 100, least=1)  # PostgreSQL's default
    kept = env("int", "PARLEY_DB_OTHER_CONNECTIONS", 10, least=0)
    share = (allowed - kept) // workers
    if share < 2:
        raise ImproperlyConfigured(
            f"{workers} web workers get {share} database connections each out of "
            f"PARLEY_DB_MAX_CONNECTIONS={allowed} less PARLEY_DB_OTHER_CONNECTIONS={kept}: "
            "raise PostgreSQL's max_connections (and PARLEY_DB_MAX_CONNECTIONS) or run fewer workers."
        )
    size = env("int", "PARLEY_DB_POOL_MAX", None, least=1)
    if size is None:
        return share
    if size > share:
        raise ImproperlyConfigured(
            f"PARLEY_DB_POOL_MAX={size} x {workers} web workers (WEB_CONCURRENCY) is more than "
            f"PARLEY_DB_MAX_CONNECTIONS={allowed} less PARLEY_DB_OTHER_CONNECTIONS={kept}; "
            f"set it to {share} or less, or leave it unset."
        )
    return size


DATABASE_URL = env("str", "DATABASE_URL", "")
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
PARLEY_COMPILED_READS = env("bool", "PARLEY_COMPILED_READS", True)
# Each request's middleware and view in one thread hop (parley/http.py); off, Django's own ASGI
# handler (a dozen hops a request): the way out if a Django or asgiref upgrade changes its internals.
PARLEY_ONE_HOP_HTTP = env("bool", "PARLEY_ONE_HOP_HTTP", True)
# The chat socket's frames without Channels' close_old_connections hop before each
# (studies/chat/consumers.py ChatConsumer.dispatch); off, Channels' own dispatch.
PARLEY_LEAN_CHAT_DISPATCH = env("bool", "PARLEY_LEAN_CHAT_DISPATCH", True)
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
        _pool_timeout = env("float", "PARLEY_DB_POOL_TIMEOUT", 5.0, above=0)
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
            "min_size": env("int", "PARLEY_DB_POOL_MIN", 1, least=0),
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
REDIS_URL = env("str", "REDIS_URL", "")
# Seconds channels-redis's BZPOPMIN waits for a message (RedisChannelLayer.brpop_timeout).
CHANNELS_BLOCKING_READ = 5
# Longer than any blocking read (channels-redis 5 s, kombu's BRPOP 1 s), yet finite so a server
# that vanished without closing the socket is noticed: above twice channels-redis's wait.
REDIS_SOCKET_TIMEOUT = env(
    "float", "PARLEY_REDIS_SOCKET_TIMEOUT", 30.0, above=2 * CHANNELS_BLOCKING_READ
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
PARLEY_CHANNEL_PREFIX = env("str", "PARLEY_CHANNEL_PREFIX", "parley")
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
CELERY_BROKER_URL = env("str", "CELERY_BROKER_URL", "") or REDIS_URL or "filesystem://"
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
        "visibility_timeout": env("int", "PARLEY_CELERY_VISIBILITY_TIMEOUT", 43200, least=1),
    }
# Workers started before the broker keep trying instead of exiting (and Celery 5 asks for it).
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_CONNECTION_TIMEOUT = REDIS_CONNECT_TIMEOUT
CELERY_RESULT_BACKEND = env("str", "CELERY_RESULT_BACKEND", "") or (
    REDIS_URL or f"file://{DATA_DIR / 'celery-results'}"
)
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
CELERY_TASK_ALWAYS_EAGER = env("bool", "CELERY_TASK_ALWAYS_EAGER", False)
# Celery beat (`make demo` and deploy/ start it): periodic tasks, one entry each.
PARLEY_TIMEOUT_SWEEP_SECONDS = env("float", "PARLEY_TIMEOUT_SWEEP_SECONDS", 60.0, above=0)
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
PARLEY_RETENTION_SWEEP_SECONDS = env("float", "PARLEY_RETENTION_SWEEP_SECONDS", 3600.0, above=0)
CELERY_BEAT_SCHEDULE["purge-expired-participant-data"] = {
    "task": "studies.tasks.purge_expired_data",
    "schedule": PARLEY_RETENTION_SWEEP_SECONDS,
    "options": {"expires": PARLEY_RETENTION_SWEEP_SECONDS},  # the next sweep covers a late one
}
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ACKS_LATE = True

# --- model engine -----------------------------------------------------------------------------
# The embedded engine's URL; demo arms point here. Arms may point at any OpenAI-compatible server.
PARLEY_ENGINE_URL = env("str", "PARLEY_ENGINE_URL", f"http://{PARLEY_HOST}:{PARLEY_ENGINE_PORT}/v1")
PARLEY_LLM_TIMEOUT = env("float", "PARLEY_LLM_TIMEOUT", 120.0, above=0)
# The sim-to-real report: conversations per held-out simulator and scenario of the study's pool.
PARLEY_SIM2REAL_CONVERSATIONS = env("int", "PARLEY_SIM2REAL_CONVERSATIONS", 1, least=1)
# Its behaviour section (studies/analysis/sim2real_behaviour.py): the local model folder whose
# mean-pooled hidden states embed the turns ("" = the base model, PARLEY_BASE_MODEL; nothing is
# downloaded), and the clusters of the space fit on the study's participants' turns.
PARLEY_SIM2REAL_EMBEDDER = env("str", "PARLEY_SIM2REAL_EMBEDDER", "")
PARLEY_SIM2REAL_CLUSTERS = env("int", "PARLEY_SIM2REAL_CLUSTERS", 8, least=2, most=200)
# A running training run whose worker has not beaten this long is shown as "worker lost"; the
# worker beats every quarter of it.
PARLEY_TRAINING_LOST_AFTER = env("float", "PARLEY_TRAINING_LOST_AFTER", 120.0, above=0)
# Model endpoints (agents/models.py): how often beat probes every replica's /health and /v1/models
PARLEY_ENDPOINT_CHECK_INTERVAL = env("float", "PARLEY_ENDPOINT_CHECK_INTERVAL", 30.0, above=0)
CELERY_BEAT_SCHEDULE["check-model-endpoints"] = {
    "task": "agents.tasks.check_endpoints",
    "schedule": PARLEY_ENDPOINT_CHECK_INTERVAL,
    "options": {"expires": PARLEY_ENDPOINT_CHECK_INTERVAL},  # a late check is superseded
}
# An arm pointed at a model no healthy replica serves: "refuse" the save, or only "warn".
PARLEY_ARM_MODEL_CHECK = env("str", "PARLEY_ARM_MODEL_CHECK", "refuse", among=("refuse", "warn"))


# --- the chat's guards (studies/chat/consumers.py, chat.py, ratelimit.py, middleware.py) ------------

# s without a token mid-reply (a notice well within 10 s), and before the first one (a busy
# engine may be slow to start: prefill, a queue; until then the page is only told it is slow)
PARLEY_STALL_TIMEOUT = env("float", "PARLEY_STALL_TIMEOUT", 8.0, least=0)
PARLEY_FIRST_TOKEN_TIMEOUT = env("float", "PARLEY_FIRST_TOKEN_TIMEOUT", 45.0, least=0)
# a larger chat frame closes the socket (1009); a message is far smaller
PARLEY_MAX_FRAME_BYTES = env("int", "PARLEY_MAX_FRAME_BYTES", 64 * 1024, least=0)
PARLEY_DB_RETRY_AFTER = env("int", "PARLEY_DB_RETRY_AFTER", 5, least=0)  # s, a 503's Retry-After
# per minute; 0 turns a limit off. Loopback is exempt from the per-IP limits (bots, load runs).
PARLEY_RATE_ARRIVALS_PER_IP = env("int", "PARLEY_RATE_ARRIVALS_PER_IP", 30, least=0)
PARLEY_RATE_MESSAGES_PER_PARTICIPANT = env(
    "int", "PARLEY_RATE_MESSAGES_PER_PARTICIPANT", 20, least=0
)
PARLEY_RATE_MESSAGES_PER_IP = env("int", "PARLEY_RATE_MESSAGES_PER_IP", 120, least=0)
PARLEY_RATE_EXEMPT_IPS = env("names", "PARLEY_RATE_EXEMPT_IPS", ("127.0.0.1", "::1"))

# --- Prolific (studies/prolific/api.py): the token and the webhook secret live only here, in memory;
# never in the database or a log. Both unset: the Prolific features say they are not configured.
PROLIFIC_API_TOKEN = env("str", "PROLIFIC_API_TOKEN", "").strip()
PROLIFIC_WEBHOOK_SECRET = env("str", "PROLIFIC_WEBHOOK_SECRET", "").strip()
PROLIFIC_API_URL = env("str", "PROLIFIC_API_URL", "https://api.prolific.com").rstrip("/")
PROLIFIC_TIMEOUT = env("float", "PROLIFIC_TIMEOUT", 30.0, least=0)  # seconds per API request
# A webhook whose X-Prolific-Request-Timestamp is further than this from now is refused (s).
PROLIFIC_WEBHOOK_MAX_AGE = env("int", "PROLIFIC_WEBHOOK_MAX_AGE", 300, least=0)
PROLIFIC_SYNC_INTERVAL = env("float", "PROLIFIC_SYNC_INTERVAL", 300.0, least=0)  # s between syncs
# Prolific submissions both ways (studies/prolific/sync.py), beside the webhook's fast path.
CELERY_BEAT_SCHEDULE["prolific-sync"] = {
    "task": "studies.tasks.sync_prolific",
    "schedule": PROLIFIC_SYNC_INTERVAL,
}
# Seconds after a bonus pay call of unknown result (timeout, 5xx, crash) before, if no submission
# shows the bonus, it counts as unpaid and may be paid again (the pay call is asynchronous).
PROLIFIC_BONUS_CONFIRM_AFTER = env("float", "PROLIFIC_BONUS_CONFIRM_AFTER", 3600.0, least=0)

# --- the demo's admin account (make demo; seed_demo) -----------------------------------------
PARLEY_ADMIN_USER = env("str", "PARLEY_ADMIN_USER", "admin")
PARLEY_ADMIN_PASSWORD = env("str", "PARLEY_ADMIN_PASSWORD", "")  # "" = one kept in DATA_DIR

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
            "str",
            "PARLEY_LOG_LEVEL",
            "INFO",
            among=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"),
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
PARLEY_LOGIN_FAILURES_PER_USER = env("int", "PARLEY_LOGIN_FAILURES_PER_USER", 5, least=1)
PARLEY_LOGIN_FAILURES_PER_IP = env("int", "PARLEY_LOGIN_FAILURES_PER_IP", 20, least=1)
PARLEY_LOGIN_WINDOW = env("int", "PARLEY_LOGIN_WINDOW", 900, least=1)  # seconds

# --- HTTPS (production) ---------------------------------------------------------------------
if not DEBUG:
    # Behind a proxy that terminates TLS (platform/deploy/nginx.conf) and sets
    # X-Forwarded-Proto itself, overwriting any client's: that header says the request was https.
    if env("bool", "DJANGO_BEHIND_TLS_PROXY", True):
        SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = env("bool", "DJANGO_SECURE_SSL_REDIRECT", True)
    # Probes reach the workers directly over http: /healthz answers there without a redirect.
    SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
    SECURE_HSTS_SECONDS = env("int", "DJANGO_SECURE_HSTS_SECONDS", 365 * 24 * 3600, least=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env("bool", "DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = env("bool", "DJANGO_SECURE_HSTS_PRELOAD", True)
    SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = True
