"""Production settings: check --deploy clean, no default hosts or example key, a CSP on every
page, a /healthz that tells nothing but health, and a limit on failed admin logins."""

import json
import re
import secrets
import uuid

import pytest
from django.contrib.auth.models import User
from django.test import Client

from tests.support.processes import python
from tests.support.studies import make_study, prolific

EXAMPLE_ENV = "platform/deploy/parley.env.example"


def production_env(**overrides) -> dict:
    """The environment of platform/deploy/parley.env.example, with a real key, no services."""
    import os

    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DJANGO_", "DATABASE_URL", "REDIS_URL", "CELERY_"))
    }
    env.update(
        DJANGO_SETTINGS_MODULE="parley.settings",
        DJANGO_DEBUG="0",
        DJANGO_SECRET_KEY=secrets.token_urlsafe(50),
        DJANGO_ALLOWED_HOSTS="study.example.org",
        DJANGO_CSRF_TRUSTED_ORIGINS="https://study.example.org",
    )
    env.update(overrides)
    return {k: v for k, v in env.items() if v is not None}


def deploy_check(**overrides):
    return python(
        "manage.py", "check", "--deploy", "--fail-level", "WARNING", env=production_env(**overrides)
    )


def test_check_deploy_is_clean_in_production():
    result = deploy_check()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_check_deploy_fails_when_https_is_turned_off():
    """A deployment may turn HSTS and the redirect off; check --deploy then says so."""
    result = deploy_check(DJANGO_SECURE_HSTS_SECONDS="0", DJANGO_SECURE_SSL_REDIRECT="0")
    assert result.returncode != 0
    assert "security.W004" in result.stderr and "security.W008" in result.stderr


def example_secret_key() -> str:
    from tests.support.processes import REPO

    text = (REPO / EXAMPLE_ENV).read_text()
    return re.search(r"^DJANGO_SECRET_KEY=(.*)$", text, re.M).group(1)


@pytest.mark.parametrize(
    "overrides, words",
    [
        ({"DJANGO_ALLOWED_HOSTS": None}, "DJANGO_ALLOWED_HOSTS must name the site's hosts"),
        ({"DJANGO_ALLOWED_HOSTS": "*"}, "DJANGO_ALLOWED_HOSTS must name the site's hosts"),
        ({"DJANGO_SECRET_KEY": None}, "DJANGO_SECRET_KEY must be set"),
        ({"DJANGO_SECRET_KEY": example_secret_key()}, "the example or a development key"),
        ({"DJANGO_SECRET_KEY": "short-but-not-empty"}, "too short or too simple"),
        ({"DJANGO_SECRET_KEY": "ab" * 40}, "too short or too simple"),
    ],
)
def test_production_refuses_to_start_without_hosts_or_a_real_key(overrides, words):
    result = python("-c", "import parley.settings", env=production_env(**overrides))
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and words in result.stderr


# --- Content-Security-Policy --------------------------------------------------------------------
def csp(response) -> dict[str, str]:
    header = response.headers["Content-Security-Policy"]
    return dict(part.strip().split(" ", 1) for part in header.split(";"))


def assert_strict_csp(response):
    policy = csp(response)
    assert policy["default-src"] == "'self'"
    for directive in ("script-src", "style-src"):
        assert "'unsafe-inline'" not in policy[directive] and "*" not in policy[directive]
    assert policy["object-src"] == "'none'" and policy["frame-ancestors"] == "'none'"
    return policy


@pytest.mark.django_db
def test_participant_pages_carry_a_csp_that_allows_their_own_script_and_socket(client):
    make_study(slug="csp")
    arrival = client.get("/s/csp/", prolific(pid="csp1"))
    consent = client.get(arrival.url)
    assert_strict_csp(consent)
    client.post(arrival.url + "consent/", {"decision": "accept"})
    chat = client.get(arrival.url)
    assert b"/ws/p/" in chat.content
    policy = assert_strict_csp(chat)
    # The chat's one inline script carries this response's nonce; every other one would be blocked.
    nonce = re.search(r"'nonce-([^']+)'", policy["script-src"]).group(1)
    inline = re.findall(rb"<script(?![^>]*\bsrc=)([^>]*)>", chat.content)
    assert inline and all(f'nonce="{nonce}"'.encode() in attrs for attrs in inline)
    assert "ws://testserver" in policy["connect-src"]
    assert "'self'" in policy["connect-src"]


@pytest.mark.django_db
def test_admin_login_and_pages_carry_the_csp(admin_client):
    assert_strict_csp(Client().get("/admin/login/"))
    assert_strict_csp(admin_client.get("/admin/"))


@pytest.mark.django_db
def test_each_response_gets_its_own_nonce(client):
    first, second = (csp(client.get("/admin/login/"))["script-src"] for _ in range(2))
    assert first != second


# --- /healthz -----------------------------------------------------------------------------------
@pytest.mark.django_db
def test_healthz_says_only_whether_it_is_healthy(client):
    import sys

    from django.conf import settings

    response = client.get("/healthz")
    assert response.status_code == 200
    body = json.loads(response.content)
    expected = {"status": "ok", "database": True}
    if settings.REDIS_URL:
        expected["redis"] = True
    assert body == expected
    text = response.content.decode()
    assert "/" not in text and sys.version.split()[0] not in text


# --- admin login limiter ------------------------------------------------------------------------
@pytest.fixture
def staff_user(db, settings):
    # A fast hasher: every attempt hashes once, and the default one takes a second here.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    name = f"staff-{uuid.uuid4().hex[:8]}"
    User.objects.create_user(name, password="right-password-1", is_staff=True)
    return name


def login(client, username, password, ip):
    return client.post(
        "/admin/login/", {"username": username, "password": password}, REMOTE_ADDR=ip
    )


def some_ip() -> str:
    # A fresh address each run: with REDIS_URL the counters outlive the test process.
    return f"10.{secrets.randbelow(250)}.{secrets.randbelow(250)}.{secrets.randbelow(250) + 1}"


def test_admin_login_answers_429_after_repeated_failures_for_a_username(staff_user, settings):
    settings.PARLEY_LOGIN_FAILURES_PER_USER = 3
    client = Client()
    for attempt in range(3):
        response = login(client, staff_user, "wrong", some_ip())
        assert response.status_code == 200, attempt  # the form again, with its error
    # From anywhere, even with the right password, until the window has passed.
    refused = login(client, staff_user, "right-password-1", some_ip())
    assert refused.status_code == 429
    assert "Too many failed sign-in attempts" in refused.content.decode()
    assert int(refused["Retry-After"]) == settings.PARLEY_LOGIN_WINDOW
    assert "_auth_user_id" not in client.session


def test_admin_login_answers_429_after_repeated_failures_from_an_address(staff_user, settings):
    settings.PARLEY_LOGIN_FAILURES_PER_IP = 4
    ip = some_ip()
    client = Client()
    for attempt in range(4):
        assert login(client, f"nobody-{attempt}-{ip}", "wrong", ip).status_code == 200
    assert login(client, staff_user, "right-password-1", ip).status_code == 429
    # Another address is not held back by this one.
    assert login(client, staff_user, "right-password-1", some_ip()).status_code == 302


def test_admin_login_succeeds_below_the_limit(staff_user, settings):
    settings.PARLEY_LOGIN_FAILURES_PER_USER = 3
    client = Client()
    for _ in range(2):
        assert login(client, staff_user, "wrong", some_ip()).status_code == 200
    assert login(client, staff_user, "right-password-1", some_ip()).status_code == 302
