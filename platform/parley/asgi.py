"""ASGI entry point: HTTP through Django, WebSockets through Channels."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "parley.settings")

from parley import http  # noqa: E402 - after the settings module is named

django_asgi_app = http.application()  # Django's ASGI app, its middleware in one thread hop
# (or Django's own handler: PARLEY_ONE_HOP_HTTP=0)

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
