"""A participant's chat on an endpoint with two replicas (real HTTP servers): the conversation
keeps to one; when it stops, the next turn is served by the other, and each stored agent
message names its replica with its timing and token counts."""

import pytest
from channels.db import database_sync_to_async

from agents.llm import replicas
from studies.models import Message
from studies.participation.arrive import arrive
from studies.participation.consent import give_consent
from studies.setup.arm_endpoints import point_arms, register_endpoint
from tests.support.scripted_server import ScriptedServer
from tests.support.studies import connect, make_study, prolific, receive_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@database_sync_to_async
def participant_on(urls: list[str]):
    study = make_study(slug="replicas", engine=urls[0], max_exchanges=10)
    point_arms(study, register_endpoint("pair", "vllm", urls), {"a": "m", "b": "m"})
    participant, _ = arrive(study, prolific(pid="p1"))
    return give_consent(participant, True)


@database_sync_to_async
def agent_messages(participant) -> list[Message]:
    return list(
        Message.objects.filter(conversation__participant=participant, role="assistant").order_by(
            "seq"
        )
    )


async def turn(window, n: int) -> None:
    await window.send_json_to({"type": "message", "id": f"m{n}", "text": "Hello"})
    await receive_until(window, "reply")
    await receive_until(window, "status")


async def test_a_conversation_keeps_its_replica_then_fails_over_to_the_other(sockets):
    replicas._down_until.clear()
    script = [{"content": "A reply of five words."}] * 10
    with ScriptedServer(script, models=["m"]) as a, ScriptedServer(script, models=["m"]) as b:
        servers = {a.url: a, b.url: b}
        participant = await participant_on([a.url, b.url])
        window = await connect(sockets, participant)
        await window.receive_json_from()
        for n in range(3):
            await turn(window, n)
        stored = await agent_messages(participant)
        home = stored[0].replica
        assert home in servers and {m.replica for m in stored} == {home}  # it stays there
        assert len(servers[home].requests) == 3
        other = b.url if home == a.url else a.url

        servers[home].__exit__(None, None, None)  # the replica serving this conversation stops
        await turn(window, 3)
        last = (await agent_messages(participant))[-1]
        assert last.replica == other and len(servers[other].requests) == 1
        # the one place that records the serving: timing and token counts come with it
        assert last.ttft_ms is not None and last.latency_ms >= last.ttft_ms
        assert (last.prompt_tokens, last.completion_tokens, last.model) == (10, 5, "m")
        await window.disconnect()
    replicas._down_until.clear()
