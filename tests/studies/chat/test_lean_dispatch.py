"""Why ChatConsumer overrides Channels' dispatch, and its way out (PARLEY_LEAN_CHAT_DISPATCH).

Channels' own dispatch awaits `aclose_old_connections` before every frame's handler: a hop to
Channels' one sync thread for each frame. The chat's database work gives its connections back
itself (studies/lib/db_threads.py), so its dispatch skips the hop; with the setting off it runs
Channels' own, hop and all, and the chat works the same."""

import channels.consumer
import pytest

from tests.support.studies import chatting_participant, connect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture
def closes(monkeypatch):
    """Every call of Channels' aclose_old_connections from its dispatch, counted."""
    counted = []
    original = channels.consumer.aclose_old_connections

    async def counting():
        counted.append(1)
        await original()

    monkeypatch.setattr(channels.consumer, "aclose_old_connections", counting)
    return counted


async def frames(sockets, participant):
    chat = await connect(sockets, participant)
    history = await chat.receive_json_from(timeout=30)
    assert history["type"] == "history"
    await chat.send_json_to({"type": "message", "id": "m-1", "text": "Hello there."})
    ack = await chat.receive_json_from(timeout=30)
    assert ack["type"] == "ack" and ack["seq"] == 1
    await chat.disconnect()


async def test_the_chat_skips_channels_connection_hop_per_frame(engine_url, sockets, closes):
    await frames(sockets, await chatting_participant(engine_url, pid="lean"))
    assert closes == []


async def test_off_it_runs_channels_own_dispatch_and_chats_the_same(
    engine_url, sockets, closes, settings
):
    settings.PARLEY_LEAN_CHAT_DISPATCH = False
    await frames(sockets, await chatting_participant(engine_url, pid="stock"))
    assert len(closes) >= 2  # the connect frame and the message frame at least
