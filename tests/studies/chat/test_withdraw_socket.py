"""Stopping from inside the chat over its socket (issue 39): the chat in progress ends, the
socket closes cleanly, and the page goes on to ask whether the data may be kept."""

import pytest
from channels.db import database_sync_to_async

from studies.models import Conversation, Participant, Withdrawal
from studies.participation import withdraw
from tests.support.scripted_server import ScriptedServer
from tests.support.studies import chatting_participant, connect, receive_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@database_sync_to_async
def stored(participant):
    return (
        Participant.objects.get(pk=participant.pk),
        Conversation.objects.get(participant=participant),
        Withdrawal.objects.filter(participant=participant).first(),
    )


async def test_withdrawing_over_the_socket_closes_the_chat_cleanly(sockets):
    with ScriptedServer([{"content": "Hello, how can I help?"}]) as engine:
        participant = await chatting_participant(engine.url, pid="leaver")
        chat = await connect(sockets, participant)
        assert (await chat.receive_json_from())["type"] == "history"
        await chat.send_json_to({"type": "message", "id": "m1", "text": "Hi there"})
        await receive_until(chat, "status", timeout=30)

        await chat.send_json_to({"type": "withdraw"})
        assert await chat.receive_json_from(timeout=30) == {"type": "withdrawn"}
        assert await chat.receive_json_from(timeout=30) == {
            "type": "redirect",
            "url": f"/p/{participant.token}/",
        }
        closed = await chat.receive_output(timeout=10)
        assert closed == {"type": "websocket.close", "code": 1000}

    now, conversation, withdrawal = await stored(participant)
    assert now.status == Participant.Status.WITHDRAWN
    assert conversation.end_reason == withdraw.WITHDRAWN and conversation.ended_at
    assert withdrawal.stage == "chat" and withdrawal.data_kept is None
    assert await conversation_size(conversation) == 2  # the message and its reply are kept
    # A socket opened afterwards takes nothing: it is sent on to the question about the data.
    late = await connect(sockets, participant)
    assert (await late.receive_json_from())["type"] == "redirect"
    await late.disconnect()


@database_sync_to_async
def conversation_size(conversation):
    return conversation.messages.count()
