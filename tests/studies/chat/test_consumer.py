"""The chat consumer against the real embedded engine (SmolLM2): streaming, storage, resume."""

import pytest
from channels.db import database_sync_to_async

from agents.models import ModelEndpoint
from agents.serving.process import free_port
from studies.models import Arm, Message, Participant, StudyError
from studies.participation.chat_turn import store_user_message
from tests.support.studies import (
    app,
    chatting_participant,
    connect,
    receive_until,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@database_sync_to_async
def messages_of(participant):
    return list(Message.objects.filter(conversation__participant=participant).order_by("seq"))


async def test_reply_streams_and_everything_is_stored(engine_url, sockets):
    participant = await chatting_participant(engine_url)
    chat = await connect(sockets, participant)
    history = await chat.receive_json_from()
    assert history["type"] == "history" and history["messages"] == [] and not history["can_end"]

    await chat.send_json_to({"type": "message", "id": "m-1", "text": "Tell me about the sea."})
    ack = await chat.receive_json_from(timeout=30)
    assert ack == {"type": "ack", "id": "m-1", "seq": 1, "duplicate": False}
    stored = await messages_of(participant)  # stored before the acknowledgement arrived
    assert [(m.role, m.content, m.client_id) for m in stored] == [
        ("user", "Tell me about the sea.", "m-1")
    ]

    events = await receive_until(chat, "reply")
    assert events[0]["type"] == "start"
    deltas = [e["text"] for e in events if e["type"] == "delta"]
    assert len(deltas) >= 2, "the reply must arrive token by token"
    reply = events[-1]["message"]
    assert reply["role"] == "assistant"
    assert reply["content"].strip() == "".join(deltas).strip() != ""
    status = await chat.receive_json_from(timeout=30)
    assert status["type"] == "status" and status["can_end"] and status["sent"] == 1

    stored = await messages_of(participant)
    assert [m.role for m in stored] == ["user", "assistant"]
    agent = stored[1]
    assert agent.reply_to_id == stored[0].id and agent.content == reply["content"]
    assert agent.model == "SmolLM2-135M-Instruct"
    assert 0 < agent.ttft_ms <= agent.latency_ms
    assert agent.completion_tokens and agent.completion_tokens <= 6
    await chat.disconnect()


async def test_resent_message_is_idempotent(engine_url, sockets):
    participant = await chatting_participant(engine_url, pid="p2")
    chat = await connect(sockets, participant)
    await chat.receive_json_from()
    await chat.send_json_to({"type": "message", "id": "same-id", "text": "Hi"})
    first = await receive_until(chat, "reply")
    await chat.receive_json_from(timeout=30)  # status

    await chat.send_json_to({"type": "message", "id": "same-id", "text": "Hi"})
    ack = await chat.receive_json_from(timeout=30)
    assert ack["duplicate"] is True and ack["seq"] == 1
    again = await chat.receive_json_from(timeout=30)
    assert again["type"] == "reply"  # the stored answer, not a new generation
    assert again["message"] == first[-1]["message"]
    assert len(await messages_of(participant)) == 2
    await chat.disconnect()


async def test_reopening_resumes_with_history(engine_url, sockets):
    participant = await chatting_participant(engine_url, pid="p3")
    chat = await connect(sockets, participant)
    await chat.receive_json_from()
    await chat.send_json_to({"type": "message", "id": "a1", "text": "Hello"})
    await receive_until(chat, "status")
    await chat.disconnect()

    chat = await connect(sockets, participant)
    history = await chat.receive_json_from()
    assert [(m["role"], m["client_id"]) for m in history["messages"]] == [
        ("user", "a1"),
        ("assistant", None),
    ]
    assert history["can_end"] and history["sent"] == 1
    await chat.disconnect()


async def test_unanswered_message_is_answered_on_reconnect(engine_url, sockets):
    participant = await chatting_participant(engine_url, pid="p4")
    await database_sync_to_async(store_user_message)(participant, "lost", "Are you there?")
    chat = await connect(sockets, participant)
    history = await chat.receive_json_from()
    assert [m["client_id"] for m in history["messages"]] == ["lost"]
    events = await receive_until(chat, "reply")
    assert events[-1]["reply_to"] == "lost"
    assert [m.role for m in await messages_of(participant)] == ["user", "assistant"]
    await chat.disconnect()


async def test_engine_down_keeps_the_message_and_retry_answers_it(engine_url, sockets):
    participant = await chatting_participant(engine_url, pid="p5")
    dead = f"http://127.0.0.1:{free_port()}/v1"
    await database_sync_to_async(
        lambda: Arm.objects.filter(pk=participant.arm_id).update(
            endpoint=ModelEndpoint.of_url(dead)
        )
    )()
    chat = await connect(sockets, participant)
    await chat.receive_json_from()
    await chat.send_json_to({"type": "message", "id": "r1", "text": "Hello?"})
    assert (await chat.receive_json_from(timeout=30))["type"] == "ack"
    events = await receive_until(chat, "error", timeout=60)
    assert events[-1]["retry"] is True and events[-1]["reply_to"] == "r1"
    assert [m.role for m in await messages_of(participant)] == ["user"]
    # The cause is kept where the researcher sees it (the monitor), not only in the log.
    problems = await database_sync_to_async(
        lambda: list(StudyError.objects.filter(participant=participant).values("title", "detail"))
    )()
    assert len(problems) == 1 and problems[0]["title"] == "The agent could not answer"
    assert dead in problems[0]["detail"] and "Could not connect" in problems[0]["detail"]

    await database_sync_to_async(
        lambda: Arm.objects.filter(pk=participant.arm_id).update(
            endpoint=ModelEndpoint.of_url(engine_url)
        )
    )()
    await receive_until(chat, "status")
    await chat.send_json_to({"type": "message", "id": "r1", "text": "Hello?"})
    assert (await chat.receive_json_from(timeout=30))["duplicate"] is True
    await receive_until(chat, "reply")
    assert [m.role for m in await messages_of(participant)] == ["user", "assistant"]
    await chat.disconnect()


@pytest.mark.parametrize(
    "payload, words",
    [
        ({"type": "message", "id": "bad id!", "text": "x"}, "needs an id"),
        ({"type": "message", "id": "ok", "text": "   "}, "type a message"),
        ({"type": "message", "id": "ok"}, "needs text"),
        ({"type": "message", "id": "ok", "text": "x" * 3000}, "the limit is 2,000"),
        ({"type": "dance"}, "Unknown message type"),
        ({"type": "end"}, "at least 1"),
    ],
)
async def test_bad_input_gets_a_clear_error_and_stores_nothing(engine_url, payload, words, sockets):
    participant = await chatting_participant(engine_url, pid="p6")
    chat = await connect(sockets, participant)
    await chat.receive_json_from()
    await chat.send_json_to(payload)
    error = await chat.receive_json_from(timeout=30)
    assert error["type"] == "error" and words in error["message"]
    assert await messages_of(participant) == []
    await chat.disconnect()


async def test_ending_the_chat_moves_to_the_questionnaire(engine_url, sockets):
    participant = await chatting_participant(engine_url, pid="p7")
    chat = await connect(sockets, participant)
    await chat.receive_json_from()
    await chat.send_json_to({"type": "message", "id": "e1", "text": "Bye"})
    await receive_until(chat, "status")
    await chat.send_json_to({"type": "end"})
    redirect = await chat.receive_json_from(timeout=30)
    assert redirect == {"type": "redirect", "url": f"/p/{participant.token}/"}
    refreshed = await database_sync_to_async(Participant.objects.get)(pk=participant.pk)
    assert refreshed.status == "questionnaire" and refreshed.chat_ended_at
    await chat.disconnect()
    # A late socket for a finished chat is only told where to go.
    late = await connect(sockets, participant)
    assert (await late.receive_json_from())["type"] == "redirect"
    await late.disconnect()


async def test_unknown_participant_is_refused(engine_url, sockets):
    communicator = sockets(app, "/ws/p/00000000-0000-0000-0000-000000000000/")
    connected, code = await communicator.connect(timeout=30)
    assert not connected and code == 4404


async def test_second_window_supersedes_the_first_over_redis(
    engine_url, redis_url, settings, sockets
):
    from channels.layers import channel_layers
    from parley.settings import redis_options

    # The site's socket options: without its read timeout redis-py's 5 s one races the layer's
    # 5 s blocking read, and the consumer's receive fails with a TimeoutError.
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {
                "hosts": [{"address": redis_url, **redis_options()}],
                "prefix": "parley-test",
            },
        }
    }

    channel_layers.backends.clear()
    try:
        participant = await chatting_participant(engine_url, pid="p8")
        first = await connect(sockets, participant)
        await first.receive_json_from()
        second = await connect(sockets, participant)
        await second.receive_json_from()
        notice = await first.receive_json_from(timeout=30)
        assert notice["type"] == "superseded"
        assert (await first.receive_output(timeout=30))["type"] == "websocket.close"
        await second.disconnect()
        await first.disconnect()  # as the server does after its close: the consumer ends
    finally:
        channel_layers.backends.clear()
