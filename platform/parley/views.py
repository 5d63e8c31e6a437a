from django.conf import settings
from django.core.cache import cache
from django.db import DatabaseError, connection
from django.http import JsonResponse
from django.views.decorators.cache import never_cache


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
