"""The Redis channel layer, built from settings, holds an idle participant.

redis-py 8 cut every blocking read after 5 s (django/channels_redis#422): with the layer's hosts
as a bare REDIS_URL, each idle WebSocket died every ~5 s. These tests idle 20 s (four cut reads) on the real
layer and a real Redis and require the same connection, and the same consumer, afterwards.
"""

import asyncio
import uuid

import pytest
from channels.db import database_sync_to_async
from channels.layers import channel_layers
from channels.routing import URLRouter
from django.conf import settings
from django.utils.module_loading import import_string

from studies.chat.routing import websocket_urlpatterns
from studies.participation.arrive import arrive
from studies.participation.consent import give_consent
from tests.support.processes import need_service
from tests.support.studies import make_study, prolific

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True), pytest.mark.asyncio]
IDLE = 20  # seconds: four of redis-py 8's default read timeouts (the CI's time is counted)


@pytest.fixture
def redis_layer(redis_url):
    """settings.CHANNEL_LAYERS as the site builds it, fresh, its sockets named for the test."""
    config = settings.CHANNEL_LAYERS["default"]
    need_service("Redis" in config["BACKEND"], "needs REDIS_URL when settings load")
    name = f"parley-idle-{uuid.uuid4().hex[:8]}"
    # The settings' own options, plus a client name to find the layer's sockets in Redis.
    hosts = [{**host, "client_name": name} for host in config["CONFIG"]["hosts"]]
    layer = import_string(config["BACKEND"])(**{**config["CONFIG"], "hosts": hosts})
    channel_layers.backends.clear()
    channel_layers.backends["default"] = layer  # what the consumer gets too
    yield layer, name
    channel_layers.backends.clear()


async def sockets_named(layer, name) -> dict[str, int]:
    """Redis's view of the layer's sockets: client id -> age in seconds."""
    import redis.asyncio as redis

    async with redis.Redis.from_url(layer.hosts[0]["address"]) as admin:
        clients = await admin.client_list()
    return {c["id"]: int(c["age"]) for c in clients if c.get("name") == name}


@database_sync_to_async
def chatting_participant():
    tag = uuid.uuid4().hex[:8]
    study = make_study(slug=f"idle-{tag}")
    participant, _ = arrive(study, prolific(pid=f"idle-{tag}", session_id=f"s-{tag}"))
    return give_consent(participant, True)


async def test_idle_participant_on_redis_layer_without_reconnect(redis_layer, sockets):
    """A bare receive and the real chat consumer idle together for IDLE seconds, then still hear."""
    layer, name = redis_layer
    channel = await layer.new_channel()
    waiting = asyncio.ensure_future(layer.receive(channel))

    app = URLRouter(websocket_urlpatterns)
    participant = await chatting_participant()
    first = sockets(app, f"/ws/p/{participant.token}/")
    assert (await first.connect(timeout=30))[0]
    assert (await first.receive_json_from(timeout=10))["type"] == "history"
    before = await sockets_named(layer, name)
    assert before, "the layer holds no connection to Redis"

    # A cut read ends the receive with redis.exceptions.TimeoutError and the consumer with it
    # (its output is then the error): while idle nothing may come and nothing may end.
    assert await first.receive_nothing(timeout=IDLE, interval=1)
    assert not first.future.done(), first.future.exception()
    assert not waiting.done(), waiting.exception() if waiting.done() else None
    after = await sockets_named(layer, name)
    assert set(before) <= set(after), "the layer reconnected while idle"
    assert min(after[i] for i in before) >= IDLE

    # A message sent after the idle time reaches the waiting receive...
    await layer.send(channel, {"type": "chat.ping", "text": "after the idle time"})
    assert await asyncio.wait_for(waiting, timeout=10) == {
        "type": "chat.ping",
        "text": "after the idle time",
    }
    # ...and a second window tells the first one through the Redis group: it still listens.
    second = sockets(app, f"/ws/p/{participant.token}/")
    assert (await second.connect(timeout=30))[0]
    assert (await first.receive_json_from(timeout=15))["type"] == "superseded"
    await second.disconnect()
    assert (await first.receive_output(timeout=10))["type"] == "websocket.close"
