from channels.generic.websocket import AsyncWebsocketConsumer
from django.urls import path, re_path

from studies.chat.consumers import ChatConsumer


class NoSuchChat(AsyncWebsocketConsumer):
    """Any other socket address (a malformed token): a clean close, not an unrouted crash."""

    async def connect(self):
        await self.close(code=4404)


websocket_urlpatterns = [
    path("ws/p/<uuid:token>/", ChatConsumer.as_asgi()),
    re_path(r"", NoSuchChat.as_asgi()),
]
