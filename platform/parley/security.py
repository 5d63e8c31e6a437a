"""The site's own guards: a Content-Security-Policy on every response, a limit on admin logins.

Django 5.2 has no CSP of its own (6.0 does). The policy allows this site's own files only; the
few inline blocks in templates carry the per-request nonce, `nonce="{{ request.csp_nonce }}"`.
"""

import hashlib
import logging
import secrets
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.contrib import admin
from django.http import HttpResponse
from django.http.request import split_domain_port, validate_host

from studies.participation import ratelimit

log = logging.getLogger(__name__)


def content_security_policy(request) -> str:
    # The chat's WebSocket goes to this same host; CSP3's 'self' covers ws:/wss: there, and the
    # explicit origin keeps browsers that predate that rule working too.
    socket = ("wss://" if request.is_secure() else "ws://") + request.get_host()
    nonce = f"'nonce-{request.csp_nonce}'"
    return "; ".join(
        [
            "default-src 'self'",
            f"script-src 'self' {nonce}",
            f"style-src 'self' {nonce}",
            "img-src 'self' data:",
            f"connect-src 'self' {socket}",
            "object-src 'none'",
            "base-uri 'self'",
            "form-action 'self'",
            "frame-ancestors 'none'",
        ]
    )


class RequestBodyLimitMiddleware:
    """A body declared over DATA_UPLOAD_MAX_MEMORY_SIZE is refused 413 before anything reads it
    (Django would read it, then answer 400 with a traceback in the log). Multipart bodies are
    Django's to judge: their files do not count against that limit."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        length = request.META.get("CONTENT_LENGTH") or ""
        if (
            limit is not None
            and length.isdigit()
            and int(length) > limit
            and not request.content_type.startswith("multipart/")
        ):
            return HttpResponse("Request body too large.", status=413, content_type="text/plain")
        return self.get_response(request)


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        request.csp_nonce = secrets.token_urlsafe(16)
        response = self.get_response(request)
        # Django's debug error pages style and script themselves inline: spare them in DEBUG.
        if settings.DEBUG and response.status_code >= 500:
            return response
        response.setdefault("Content-Security-Policy", content_security_policy(request))
        return response


# --- admin login limiter -----------------------------------------------------------------------
def login_limits() -> tuple[int, int, int]:
    """(failures per username, failures per address, window in seconds), from settings."""
    return (
        settings.PARLEY_LOGIN_FAILURES_PER_USER,
        settings.PARLEY_LOGIN_FAILURES_PER_IP,
        settings.PARLEY_LOGIN_WINDOW,
    )


def login_failure_keys(request) -> tuple[tuple[str, str], tuple[str, str]]:
    """What failures count against: the username typed, and the address it came from."""
    username = request.POST.get("username", "").strip().lower()
    # Hashed: any text may be typed there, and storage keys must be short and plain.
    username = hashlib.sha256(username.encode()).hexdigest()[:32]
    # REMOTE_ADDR is the client's own: uvicorn --proxy-headers takes it from the trusted proxy.
    return ("login-fail-user", username), ("login-fail-ip", request.META.get("REMOTE_ADDR", ""))


def limited_admin_login(request, extra_context=None):
    """admin.site.login, answering 429 once a username or an address has failed too often
    within the window (which opens at the first failure)."""
    per_user, per_ip, window = login_limits()
    if request.method != "POST":
        return admin.site.login(request, extra_context)
    user, ip = login_failure_keys(request)
    limits = [
        (ratelimit.per_window(per_user, window), user),
        (ratelimit.per_window(per_ip, window), ip),
    ]
    try:
        failures = ratelimit.limiter()
        refused = not all(failures.test(item, *key) for item, key in limits)
    except Exception:  # Redis is down: log in as Django would rather than 500
        log.warning("admin login limiter: storage unavailable, not limiting")
        return admin.site.login(request, extra_context)
    if refused:
        minutes = max(1, window // 60)
        response = HttpResponse(
            f"Too many failed sign-in attempts. Try again in {minutes} minutes.",
            status=429,
            content_type="text/plain; charset=utf-8",
        )
        response["Retry-After"] = str(window)
        return response
    response = admin.site.login(request, extra_context)
    try:
        if request.user.is_authenticated and request.user.is_staff:
            failures.clear(limits[0][0], *user)
        else:  # wrong password, unknown or non-staff account: the form is shown again
            for item, key in limits:
                failures.hit(item, *key)
    except Exception:
        log.warning("admin login limiter: storage unavailable, failure not counted")
    return response


# --- the chat's WebSocket: only pages of this site may open it -----------------------------------
DEFAULT_PORTS = {"http": 80, "https": 443}


def origin_of(url: str) -> str | None:
    """scheme://host:port, the port always written: "https://a.org" and "https://a.org:443" are
    one origin, "http://a.org" and "https://a.org:8443" are others."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port or DEFAULT_PORTS.get(parts.scheme.lower())
    except ValueError:  # a port that is no number
        return None
    if parts.scheme.lower() not in DEFAULT_PORTS or not parts.hostname or port is None:
        return None
    return f"{parts.scheme.lower()}://{parts.hostname.lower()}:{port}"


def site_origins(scope) -> set[str]:
    """The origins whose pages may open a socket, as Django's CSRF check allows forms: the
    site's own (the scheme and Host of this request, when the host is allowed), its public URL
    and CSRF_TRUSTED_ORIGINS."""
    origins = {settings.PUBLIC_URL, *settings.CSRF_TRUSTED_ORIGINS}
    host = dict(scope.get("headers") or []).get(b"host", b"").decode("latin1")
    if host and validate_host(split_domain_port(host)[0], settings.ALLOWED_HOSTS):
        scheme = "https" if scope.get("scheme") in ("wss", "https") else "http"
        origins.add(f"{scheme}://{host}")
    return {origin for origin in map(origin_of, origins) if origin}


class SameOriginWebSocket:
    """Channels' AllowedHostsOriginValidator compares the Origin's host alone: a page of the
    site's host on another port or scheme (another service there) could open a participant's
    chat. This compares scheme, host and port. No Origin (not a browser) only where every host
    is allowed (a laptop), as Channels did."""

    def __init__(self, application):
        self.application = application

    async def __call__(self, scope, receive, send):
        raw = dict(scope.get("headers") or []).get(b"origin")
        if raw is None:
            allowed = "*" in settings.ALLOWED_HOSTS
        else:
            allowed = origin_of(raw.decode("latin1")) in site_origins(scope)
        if not allowed:
            return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)
