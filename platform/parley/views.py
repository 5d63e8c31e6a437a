import platform

from django.db import connection
from django.http import JsonResponse


def healthz(request):
    """Liveness for the proxy and the demo launcher; also proves `platform` is the stdlib's."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse(
        {
            "ok": True,
            "database": connection.vendor,
            "platform_file": getattr(platform, "__file__", None),
        }
    )
