"""A worker keeps one client, and one connection, per arm endpoint across chat turns."""

import pytest
from channels.db import database_sync_to_async

from studies.chat import agent_turn
from studies.chat.consumers import load_participant
from studies.participation.arrive import arrive
from studies.participation.consent import give_consent
from tests.support.scripted_server import ScriptedServer
from tests.support.studies import connect, make_study, prolific, receive_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@database_sync_to_async
def two_participants(engine_url):
    """One participant on each of the study's two arms, both arms on the same endpoint."""
    study = make_study(slug="reuse", engine=engine_url, max_exchanges=10)
    participants = []
    for pid in ("p1", "p2"):
        participant, _ = arrive(study, prolific(pid=pid))
        give_consent(participant, True)
        participants.append(load_participant(participant.token))  # as the consumer reads it
    return participants


async def test_chat_turns_reuse_one_client_and_one_connection(sockets):
    replies = [{"content": f"Answer {i}."} for i in range(4)]
    with ScriptedServer(replies) as server:
        participants = await two_participants(server.url)
        assert participants[0].arm_id != participants[1].arm_id
        for participant in participants:
            window = await connect(sockets, participant)
            await window.receive_json_from()
            for turn in range(2):
                await window.send_json_to({"type": "message", "id": f"m{turn}", "text": "Hi"})
                await receive_until(window, "reply")
                await receive_until(window, "status")
            await window.disconnect()
        client = agent_turn.arm_client(participants[0].arm)
        assert agent_turn.arm_client(participants[1].arm) is client
    assert len(server.requests) == 4
    assert len(set(server.client_ports)) == 1, "each turn opened its own connection"
