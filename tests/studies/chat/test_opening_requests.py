"""The opening request an engine is warmed with (`opening_requests`, passed on by `manage.py
serve_agents`) is the participant's first turn without the participant's message: the same
system prompt, greeting, tools and parameters, so the prompt the engine renders from it is the
first turn's, token for token, up to that message (issue 36, point 4)."""

import pytest
from asgiref.sync import sync_to_async

from studies.chat.agent_turn import opening_requests
from studies.models import ToolChoice
from tests.support.scripted_server import ScriptedServer
from tests.support.studies import participant_in, socket_turn  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)

CALL = {"tool_calls": [("get_order_details", {"order_id": "#W5785065"})]}


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "domain, arm, replies",
    [
        ("retail", dict(tool_format="structured", tool_choice=ToolChoice.FIRST), [CALL, {}]),
        ("retail", dict(tool_format="native", system_prompt="Be brief."), [{}]),
        ("p4g", dict(tool_format="structured", greeting="Hello there!"), [{}]),
    ],
)
async def test_the_opening_request_is_the_first_turn_without_the_participants_message(
    domain, arm, replies
):
    replies = [reply or {"content": "Sure."} for reply in replies]
    with ScriptedServer(replies) as server:
        participant = await participant_in(server.url, domain=domain, **arm)
        await socket_turn(participant, "Where is my order #W5785065?")
    (opening,) = await sync_to_async(opening_requests)(participant.arm)
    first = server.requests[0]
    assert first["messages"][:-1] == opening["messages"]
    assert first["messages"][-1] == {"role": "user", "content": "Where is my order #W5785065?"}
    unsent = ("messages", "stream", "stream_options")
    assert {k: v for k, v in first.items() if k not in unsent} == {
        k: v for k, v in opening.items() if k != "messages"
    }
    assert (
        opening["messages"][0]["role"] == "system" and opening["messages"][1]["role"] == "assistant"
    )
