"""An arm's tool choice: how its agent is asked to call the Domain's tools (issue 12, point 7).

SmolLM2 left to decide ("auto") chose a tool in 0 of 40 tau2 retail turns, so the demo never
showed a tool card; with "first" each reply starts with a call the engine keeps well formed.
The requests are read off a scripted engine; the last test has the real model answer.
"""

import json
import time

import pytest
from channels.routing import URLRouter
from django.core.exceptions import ValidationError
from django.urls import reverse

from agents.models import ModelEndpoint
from studies.chat import agent_turn
from studies.chat.routing import websocket_urlpatterns
from studies.lib import domain_bridge
from studies.models import Arm, ToolChoice
from studies.rehearsal.demo_studies import seed_domain_studies
from tests.support.scripted_server import ScriptedServer
from tests.support.studies import (
    change_form_data,
    demo_arm_participant,
    first_reply_calls_a_tool,
    forced,
    make_study,
    participant_in,
    socket_turn,  # noqa: F401
)

app = URLRouter(websocket_urlpatterns)
CALL = {"tool_calls": [("get_order_details", {"order_id": "#W5785065"})]}


pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.asyncio
@pytest.mark.parametrize("tool_format", ["structured", "native"])
async def test_first_forces_a_call_at_the_start_of_each_reply_only(tool_format):
    with ScriptedServer([CALL, {"content": "It is pending."}]) as server:
        participant = await participant_in(
            server.url, tool_format=tool_format, tool_choice=ToolChoice.FIRST
        )
        events = await socket_turn(participant, "Where is my order #W5785065?")
    kinds = [e["type"] for e in events]
    assert kinds.count("tool_calls") == 1 and kinds.count("tool_result") == 1, kinds
    first, second = server.requests
    assert forced(first) and not forced(second)  # after its call the agent may answer
    if tool_format == "native":
        assert "tool_choice" not in second  # "auto" is left to the engine, as before
    else:  # the second step still keeps any call well formed, only not forced
        assert second["response_format"]["format"]["type"] == "triggered_tags"


@pytest.mark.asyncio
async def test_required_forces_calls_until_the_domain_budget_then_text():
    budget = domain_bridge.shared_domain("retail").max_tool_calls_per_turn
    with ScriptedServer([CALL] * budget + [{"content": "Done."}]) as server:
        participant = await participant_in(
            server.url, tool_format="native", tool_choice=ToolChoice.REQUIRED
        )
        events = await socket_turn(participant, "Where is my order #W5785065?")
    assert [e["type"] for e in events].count("tool_result") == budget
    assert all(forced(r) for r in server.requests[:budget])
    last = server.requests[budget]
    assert "tools" not in last and "tool_choice" not in last  # out of budget: it must answer
    assert events[-2]["type"] == "reply" and events[-2]["message"]["content"].strip() == "Done."


@pytest.mark.asyncio
async def test_a_forced_call_has_room_for_a_whole_call_and_text_keeps_the_arms_budget():
    """Issue 23: a forced airline call cut off by the arm's 96 tokens reached the page as raw
    `<tool_call>` text; the forced step gets room for a whole call, the text step the arm's."""
    with ScriptedServer([CALL, {"content": "It is pending."}]) as server:
        participant = await participant_in(
            server.url, tool_format="structured", tool_choice=ToolChoice.FIRST, max_tokens=96
        )
        await socket_turn(participant, "Where is my order #W5785065?")
    first, second = server.requests
    assert forced(first) and first["max_tokens"] == agent_turn.FORCED_CALL_TOKENS
    assert not forced(second) and second["max_tokens"] == 96


# A forced call as JSON text in the content (what tool_format "structured" gets from vLLM),
# indented so that it streams in several pieces; the client holds it back from the page.
JSON_CALL = {
    "content": "<tool_call>"
    + json.dumps(
        {"name": CALL["tool_calls"][0][0], "arguments": CALL["tool_calls"][0][1]}, indent=1
    )
    + "</tool_call>"
}


@pytest.mark.asyncio
@pytest.mark.parametrize("tool_format, call", [("native", CALL), ("structured", JSON_CALL)])
async def test_a_forced_call_streaming_for_longer_than_the_timeouts_is_not_a_stall(
    tool_format, call, settings
):
    """A forced call shows no text until it is whole; its tokens, a chunk every PACE seconds
    for several times the stall and first-token timeouts, keep the turn alive (issue 12)."""
    timeout = 1.5
    settings.PARLEY_STALL_TIMEOUT = settings.PARLEY_FIRST_TOKEN_TIMEOUT = timeout
    with ScriptedServer([call, {"content": "It is pending."}], pace=0.5) as server:
        participant = await participant_in(
            server.url, tool_format=tool_format, tool_choice=ToolChoice.FIRST
        )
        began = time.monotonic()
        events = await socket_turn(participant, "Where is my order #W5785065?")
        took = time.monotonic() - began
    kinds = [e["type"] for e in events]
    assert "error" not in kinds and "slow" not in kinds, events
    assert kinds.index("tool_calls") < kinds.index("delta"), kinds  # the call showed no text
    card = events[kinds.index("tool_calls")]["message"]["tool_calls"][0]
    assert card["function"]["name"] == "get_order_details"
    assert events[-2]["type"] == "reply"
    assert events[-2]["message"]["content"].strip() == "It is pending."
    assert took > 2 * timeout  # the call did stream for longer than the timeouts


@pytest.mark.asyncio
async def test_auto_sends_the_same_request_as_before():
    with ScriptedServer([{"content": "Hello."}]) as server:
        participant = await participant_in(server.url, tool_format="native")
        await socket_turn(participant, "Hi")
    (request,) = server.requests
    assert request["tools"] and "tool_choice" not in request and not forced(request)


@pytest.mark.asyncio
async def test_a_domain_without_tools_is_never_sent_a_tool_choice():
    with ScriptedServer([{"content": "Would you donate?"}] * 3) as server:
        participant = await participant_in(
            server.url,
            domain="p4g",
            tool_format="native",
            tool_choice=ToolChoice.REQUIRED,
            extra_params={"tool_choice": "required"},  # stored before clean() refused it
        )
        await socket_turn(participant, "Hello")
    assert server.requests
    for request in server.requests:
        assert "tools" not in request and "tool_choice" not in request
        assert "response_format" not in request


@pytest.mark.django_db
def test_the_admin_refuses_tool_choices_that_cannot_hold():
    arm = make_study(slug="bad-tools", domain="retail").arms.first()
    arm.tool_choice = "always"
    with pytest.raises(ValidationError) as refused:
        arm.full_clean()
    assert "not a valid choice" in str(refused.value.message_dict["tool_choice"])

    arm.tool_choice, arm.tool_format = ToolChoice.FIRST, "json"
    with pytest.raises(ValidationError) as refused:
        arm.full_clean()
    assert "needs the tool format 'structured' or 'native'" in str(refused.value)

    arm.tool_choice, arm.tool_format = ToolChoice.AUTO, "structured"
    arm.extra_params = {"tool_choice": "required"}
    with pytest.raises(ValidationError) as refused:
        arm.full_clean()
    assert "Tool choice field" in str(refused.value.message_dict["extra_params"])


@pytest.mark.django_db
def test_the_admin_form_says_why_and_saves_nothing(admin_client):
    study = make_study(slug="form-tools", domain="retail", arms=("a",))
    url = reverse("admin:studies_study_change", args=[study.pk])
    data = change_form_data(admin_client, url)
    assert data["arms-0-tool_choice"] == ToolChoice.AUTO  # the default: what arms did before
    data.update({"arms-0-tool_choice": "first", "arms-0-tool_format": "json"})
    response = admin_client.post(url, data)
    assert response.status_code == 200  # the form again, not a redirect
    assert "needs the tool format" in response.content.decode()
    assert study.arms.get().tool_choice == ToolChoice.AUTO
    data["arms-0-tool_format"] = "structured"
    assert admin_client.post(url, data).status_code == 302
    assert study.arms.get().tool_choice == ToolChoice.FIRST


@pytest.mark.django_db
def test_vllm_arms_never_send_a_seed():
    arm = make_study(slug="seeded", arms=("a",)).arms.get()
    arm.extra_params = {"seed": 7}
    arm.full_clean()  # the embedded engine honours a seed
    assert arm.generation_params()["seed"] == 7

    vllm = ModelEndpoint.register("cpu-vllm", "vllm", ["http://127.0.0.1:9/v1"])
    arm.endpoint = vllm
    with pytest.raises(ValidationError) as refused:
        arm.clean()
    assert "CPU Generator does not use offset" in str(refused.value.message_dict["extra_params"])
    # pointed at vLLM without the admin (serve_agents): the seed stays stored, unsent
    Arm.objects.filter(pk=arm.pk).update(endpoint=vllm, extra_params={"seed": 7})
    arm = Arm.objects.select_related("endpoint").get(pk=arm.pk)
    assert arm.extra_params == {"seed": 7} and "seed" not in arm.generation_params()


@pytest.mark.django_db
def test_the_demo_asks_tau2_arms_for_a_call_first_and_leaves_p4g_alone():
    studies = {s.domain: s for s in seed_domain_studies("http://127.0.0.1:9/v1")}
    assert {a.tool_choice for a in studies["retail"].arms.all()} == {ToolChoice.FIRST}
    for arm in studies["retail"].arms.all():
        arm.full_clean()  # the seeded arms pass the admin's checks


# --- the real model ------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_smollm2_makes_a_well_formed_tool_call_of_the_domain(engine_url, settings):
    # The prefill of the 3,235-token prompt alone took 21 s on a loaded 2-core machine; after
    # the first token the call's tokens keep the turn alive (the stall timeout) though unshown.
    settings.PARLEY_FIRST_TOKEN_TIMEOUT = 120
    await first_reply_calls_a_tool(await demo_arm_participant(engine_url))
