"""An answer with no text: asked again once, and never shown as an empty bubble.

Seen in CI (tests/test_demo.py on demo-retail): SmolLM2 spent its ten tool calls, the last
step, offered no tools, came back empty, and the page showed an empty assistant bubble. The
engine is scripted here: the tests are about what the chat does with the answer.
"""

import pytest
from channels.db import database_sync_to_async

from studies.chat import agent_turn
from studies.lib import domain_bridge
from studies.models import Message, ToolChoice
from tests.support.scripted_server import ScriptedServer
from tests.support.studies import participant_in, socket_turn

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

CALL = {"tool_calls": [("get_product_details", {"product_id": "nope"})]}


@database_sync_to_async
def assistant_messages(participant):
    """The agent's messages in answer to the participant (not the Domain's stored greeting)."""
    return list(
        Message.objects.filter(
            conversation__participant=participant,
            role=Message.Role.ASSISTANT,
            reply_to__isnull=False,
        ).order_by("seq")
    )


def replies(events):
    return [e for e in events if e["type"] == "reply"]


async def test_an_empty_answer_is_asked_again_and_only_the_answer_is_stored():
    with ScriptedServer([{"content": ""}, {"content": "Hello."}, {"content": "Never."}]) as server:
        participant = await participant_in(server.url, tool_format="native")
        events = await socket_turn(participant, "Hi")
    kinds = [e["type"] for e in events]
    assert kinds.count("start") == 1, kinds  # the re-ask streams into the step's one bubble
    (reply,) = replies(events)
    assert reply["message"]["content"].strip() == "Hello." and "notice" not in reply
    assert len(server.requests) == 2 and server.requests[0] == server.requests[1]
    (stored,) = await assistant_messages(participant)
    assert stored.content.strip() == "Hello." and stored.tool_calls is None
    assert stored.completion_tokens == 1  # the metrics of the attempt stored, not the empty one


async def test_out_of_tool_budget_an_empty_answer_is_asked_again_without_tools():
    """The CI case: every call spent, the step offered no tools answers nothing at first."""
    budget = domain_bridge.shared_domain("retail").max_tool_calls_per_turn
    script = [CALL] * budget + [{"content": ""}, {"content": "Sorry, I found nothing."}]
    with ScriptedServer(script) as server:
        participant = await participant_in(
            server.url, tool_format="native", tool_choice=ToolChoice.REQUIRED
        )
        events = await socket_turn(participant, "Tell me about product nope.")
    kinds = [e["type"] for e in events]
    assert kinds.count("start") == budget + 1, kinds  # one a step, none for the re-ask
    assert kinds.count("tool_result") == budget
    (reply,) = replies(events)
    assert reply["message"]["content"].strip() == "Sorry, I found nothing."
    asked, again = server.requests[budget:]
    assert asked == again and "tools" not in again  # the same request, still without tools
    stored = await assistant_messages(participant)
    assert len(stored) == budget + 1 and all(m.tool_calls for m in stored[:budget])
    assert stored[-1].content.strip() == "Sorry, I found nothing."


async def test_an_answer_empty_twice_is_stored_and_the_page_is_told():
    # whitespace only counts as nothing too ("\n" streams as "\n ")
    with ScriptedServer([{"content": "\n"}, {"content": ""}, {"content": "Never."}]) as server:
        participant = await participant_in(server.url, tool_format="native")
        events = await socket_turn(participant, "Hi")
        assert len(server.requests) == 2  # asked once more, not again
        (reply,) = replies(events)
        assert reply["message"]["content"] == ""
        assert reply["notice"] == agent_turn.EMPTY_REPLY_NOTICE
        assert [e["type"] for e in events].count("start") == 1
        (stored,) = await assistant_messages(participant)  # what the agent did is kept
        assert stored.content == "" and stored.tool_calls is None

        # the same message sent again (a reconnect): the stored empty reply, with the notice
        again = await socket_turn(participant, "Hi")
    assert [e["type"] for e in again] == ["ack", "reply", "status"]
    assert again[0]["duplicate"] is True
    assert again[1]["notice"] == agent_turn.EMPTY_REPLY_NOTICE
    assert len(server.requests) == 2 and len(await assistant_messages(participant)) == 1


async def test_an_answer_with_text_is_asked_for_once():
    with ScriptedServer([{"content": "Hello."}, {"content": "Never."}]) as server:
        participant = await participant_in(server.url, tool_format="native")
        events = await socket_turn(participant, "Hi")
    assert len(server.requests) == 1
    (reply,) = replies(events)
    assert reply["message"]["content"].strip() == "Hello." and "notice" not in reply
    assert len(await assistant_messages(participant)) == 1
