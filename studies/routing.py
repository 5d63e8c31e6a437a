from django.urls import path

from .consumers import ChatConsumer

websocket_urlpatterns = [path("ws/p/<uuid:token>/", ChatConsumer.as_asgi())]
