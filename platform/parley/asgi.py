"""ASGI entry point: HTTP through Django, WebSockets through Channels."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "parley.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from parley import server_log  # noqa: E402
from parley.security import SameOriginWebSocket  # noqa: E402
from studies.chat.routing import websocket_urlpatterns  # noqa: E402

server_log.install()

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": SameOriginWebSocket(URLRouter(websocket_urlpatterns)),
    }
)
