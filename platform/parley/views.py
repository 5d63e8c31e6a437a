from django.conf import settings
from django.core.cache import cache
from django.db import DatabaseError, connection
from django.http import HttpResponse, JsonResponse
from django.views.decorators.cache import cache_control, never_cache
from django.views.decorators.http import require_GET

# Every browser asks for /favicon.ico on every site; a 404 there filled the web log. Two
# speech bubbles in the participant pages' accent colour; browsers take SVG under this name.
FAVICON = (
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16">'
    '<rect x="1" y="2" width="10" height="7" rx="2" fill="#2457c5"/>'
    '<rect x="5" y="7" width="10" height="7" rx="2" fill="#5d6575"/></svg>'
)


def database_answers() -> bool:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return True
    except DatabaseError:
        return False


def redis_answers() -> bool:
    try:
        cache.set("parley:healthz", 1, timeout=10)
        return cache.get("parley:healthz") == 1
    except Exception:  # any client error means "not reachable", never a 500 here
        return False


@never_cache
def healthz(request):
    """Health for the proxy and the demo launcher: up or not, and nothing about the server."""
    checks = {"database": database_answers()}
    if settings.REDIS_URL:
        checks["redis"] = redis_answers()
    healthy = all(checks.values())
    return JsonResponse(
        {"status": "ok" if healthy else "unavailable", **checks}, status=200 if healthy else 503
    )


@require_GET
@cache_control(public=True, max_age=86400)
def favicon(request):
    return HttpResponse(FAVICON, content_type="image/svg+xml")
