"""Studies, participants and browsers as the studies tests build them."""

import json
import shutil
import threading

from channels.db import database_sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator

from agents.models import ModelEndpoint
from studies.chat.routing import websocket_urlpatterns
from studies.lib import domain_bridge
from studies.models import (
    Arm,
    Item,
    Message,
    Participant,
    Questionnaire,
    Scenario,
    Study,
    ToolChoice,
)
from studies.participation.arrive import arrive
from studies.participation.chat_turn import end_chat, store_user_message
from studies.participation.consent import give_consent
from studies.participation.questionnaire import submit_questionnaire
from studies.setup.scenario_pools import import_pool


def make_study(slug="s1", arms=("a", "b"), engine="http://127.0.0.1:9/v1", **fields):
    defaults = dict(
        title="Test study",
        status=Study.Status.LIVE,
        completion_code="DONE123",
        no_consent_code="NOCONS",
        timeout_code="LATE",
        min_exchanges=1,
        max_exchanges=5,
        retention_days=90,
    )
    study = Study.objects.create(slug=slug, **{**defaults, **fields})
    endpoint = ModelEndpoint.of_url(engine)
    for order, name in enumerate(arms):
        Arm.objects.create(
            study=study,
            name=name,
            order=order,
            endpoint=endpoint,
            model_name="SmolLM2-135M-Instruct",
            temperature=0,
            max_tokens=6,
            system_prompt=f"You are assistant {name}.",
        )
    q = Questionnaire.objects.create(study=study)
    Item.objects.create(questionnaire=q, order=0, key="helpful", prompt="Helpful?", kind="likert")
    Item.objects.create(
        questionnaire=q,
        order=1,
        key="frustration",
        prompt="Frustrating?",
        kind="likert",
        reverse_coded=True,
    )
    Item.objects.create(
        questionnaire=q,
        order=2,
        key="attn",
        prompt="Choose 2",
        kind="attention",
        expected_answer="2",
    )
    Item.objects.create(
        questionnaire=q,
        order=3,
        key="donation",
        prompt="How much?",
        kind="number",
        min_value=0,
        max_value=2,
    )
    Item.objects.create(
        questionnaire=q, order=4, key="comment", prompt="Comments", kind="text", required=False
    )
    return study


def at_once(step, n: int) -> list[Exception]:
    """Run step(i) for i in range(n) in n threads released together (each with its own
    database connection, closed after); the exceptions they raised, for the test to judge."""

    from django.db import connection

    start, errors = threading.Barrier(n), []

    def run(i):
        try:
            start.wait()
            step(i)
        except Exception as error:  # noqa: BLE001 - returned to the test
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def prolific(pid="5f0c0ffee0ddba11c0ffee01", study_id="study1", session_id="sess1"):
    return {"PROLIFIC_PID": pid, "STUDY_ID": study_id, "SESSION_ID": session_id}


GOOD_ANSWERS = {
    "helpful": "6",
    "frustration": "2",
    "attn": "2",
    "donation": "1.5",
    "comment": "fine",
}


def finish(study, pid, answers=GOOD_ANSWERS, arm=None, text="hi"):
    """A participant through the whole flow (arrival, consent, one message, questionnaire),
    in `arm` when named (else where assignment puts them); returned as stored."""
    from studies.models import Participant

    p, _ = arrive(study, prolific(pid=pid))
    if arm is not None:
        Participant.objects.filter(pk=p.pk).update(arm=study.arms.get(name=arm))
        p.refresh_from_db()
    give_consent(p, True)
    store_user_message(p, f"m-{pid}", text)
    end_chat(p)
    assert submit_questionnaire(p, answers) == {}
    p.refresh_from_db()
    return p


# Debian's chromium through Playwright (never a downloaded browser).
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


def change_form_data(client, url) -> dict:
    """The change form as the admin would post it back, from the page's own context."""
    context = client.get(url).context
    data = {}
    form = context["adminform"].form
    for name in form.fields:
        value = form[name].value()
        if value is None:
            continue
        data[name] = value
        if isinstance(value, bool):
            data[name] = "on" if value else ""
    for inline in context["inline_admin_formsets"]:
        formset = inline.formset
        for name in formset.management_form.fields:
            data[f"{formset.prefix}-{name}"] = formset.management_form[name].value()
        for sub in formset.forms:
            for name in sub.fields:
                value = sub[name].value()
                if value is None or value is False:
                    continue
                data[sub.add_prefix(name)] = "on" if value is True else value
    return {k: v for k, v in data.items() if v != ""}


def fill(study, answers_by_arm, attention="2"):
    """Complete participants with the given helpfulness answers, arm by arm in arrival order."""
    n = max(len(v) for v in answers_by_arm.values())
    i = 0
    for k in range(n):
        for arm in sorted(answers_by_arm):
            if k >= len(answers_by_arm[arm]):
                continue
            i += 1
            value = answers_by_arm[arm][k]
            answers = {
                "helpful": str(value),
                "frustration": str(8 - value),
                "attn": attention,
                "donation": "1",
            }
            finish(study, f"p{i}", answers, arm=arm)


@database_sync_to_async
def chatting_participant(engine_url, pid="p1", **study_fields):
    study = make_study(slug=f"s-{pid}", engine=engine_url, **study_fields)
    participant, _ = arrive(study, prolific(pid=pid))
    return give_consent(participant, True)


async def connect(sockets, participant):
    communicator = sockets(app, f"/ws/p/{participant.token}/")
    connected, _ = await communicator.connect(timeout=30)
    assert connected
    return communicator


async def receive_until(communicator, kind, timeout=60):
    """All events up to and including the first of type `kind`."""
    events = []
    while True:
        event = await communicator.receive_json_from(timeout=timeout)
        events.append(event)
        if event["type"] == kind:
            return events


@database_sync_to_async
def participant_in(engine_url, domain="retail", **arm_fields):
    """One consenting participant of a one-arm study of `domain` on `engine_url`."""
    study = make_study(slug=f"tools-{domain}", domain=domain, engine=engine_url, arms=("a",))
    study.arms.update(**arm_fields)
    import_pool(study, domain)
    if domain == "retail":  # one known task: its user's email and order are in the messages
        Scenario.objects.filter(study=study).exclude(key="retail-0").update(active=False)
    participant, _ = arrive(study, prolific(pid=f"tools-{domain}"))
    return give_consent(participant, True)


def forced(request) -> bool:
    """Whether a request forces a tool call (native: tool_choice; structured: the tag format)."""
    if request.get("tool_choice") == "required":
        return True
    tag = (request.get("response_format") or {}).get("format") or {}
    return tag.get("type") == "tags_with_separator" and tag.get("at_least_one") is True


async def first_reply_calls_a_tool(participant) -> Message:
    """One message of the retail customer through the real consumer: the reply's tool call
    comes to the page (tool_calls, then tool_result) and is stored well formed, a call of one
    of the Domain's tools with arguments that fit its schema. Returns the stored call."""
    events = await socket_turn(participant, CUSTOMER, timeout=150)
    kinds = [e["type"] for e in events]
    assert "tool_calls" in kinds and "tool_result" in kinds, events
    assert kinds.index("tool_calls") < kinds.index("tool_result")

    @database_sync_to_async
    def stored():
        agent = Message.objects.filter(
            conversation__participant=participant, tool_calls__isnull=False
        ).first()
        results = list(Message.objects.filter(conversation__participant=participant, role="tool"))
        return agent, results

    agent, results = await stored()
    domain, scenario = await database_sync_to_async(domain_bridge.domain_of)(participant)
    tools = {t["function"]["name"]: t["function"] for t in domain.tools(scenario)}
    assert agent is not None and agent.tool_calls
    for call in agent.tool_calls:
        name, arguments = call["function"]["name"], json.loads(call["function"]["arguments"])
        assert name in tools and isinstance(arguments, dict)
        assert fits(arguments, tools[name]["parameters"]), (name, arguments)
    assert [r.tool_name for r in results] == [c["function"]["name"] for c in agent.tool_calls]
    assert agent.model == "SmolLM2-135M-Instruct" and agent.finish_reason == "tool_calls"
    return agent


def demo_arm_participant(engine_url, temperature=0.0):
    """A participant of a retail arm set as the demo's (calls kept well formed, each reply
    starting with one), greedy unless told and short so that one turn stays quick."""
    return participant_in(
        engine_url,
        tool_format="structured",
        tool_choice=ToolChoice.FIRST,
        max_tokens=80,
        temperature=temperature,
    )


LONG_MESSAGE = (
    "Your submission did not follow the study instructions: the chat had no messages about the "
    "task and the questionnaire was left with default answers throughout."
)


def join(study, pid, session, status=Participant.Status.COMPLETED, arm=None, **fields):
    return Participant.objects.create(
        study=study,
        arm=arm or study.arms.first(),
        prolific_pid=pid,
        prolific_study_id=study.prolific_study_id,
        prolific_session_id=session,
        status=status,
        **fields,
    )


def at_questionnaire(study, pid, arm):
    participant, _ = arrive(study, prolific(pid=pid, session_id=f"sess-{pid}"))
    Participant.objects.filter(pk=participant.pk).update(arm=study.arms.get(name=arm))
    participant.refresh_from_db()
    give_consent(participant, True)
    store_user_message(participant, f"m-{pid}", "hi")
    return end_chat(participant)


async def talk(participant, text, client_id):
    app = URLRouter(websocket_urlpatterns)
    socket = WebsocketCommunicator(app, f"/ws/p/{participant.token}/")
    assert (await socket.connect(timeout=30))[0]
    history = await socket.receive_json_from(timeout=30)
    await socket.send_json_to({"type": "message", "id": client_id, "text": text})
    events = []
    try:
        while not events or events[-1]["type"] not in ("status", "redirect"):
            events.append(await socket.receive_json_from(timeout=30))
    finally:  # a consumer left running breaks the Redis layer for the next event loop
        await socket.disconnect()
    return history, events


app = URLRouter(websocket_urlpatterns)


def fits(arguments: dict, parameters: dict) -> bool:
    """The call's arguments against its tool's schema: required keys present, no others when
    the schema says so, each a value of its declared type."""
    types = {"string": str, "integer": int, "number": (int, float), "object": dict, "array": list}
    properties = parameters.get("properties", {})
    if not set(parameters.get("required", [])) <= set(arguments):
        return False
    for key, value in arguments.items():
        schema = properties.get(key)
        if schema is None:
            return parameters.get("additionalProperties", True) is not False
        if schema.get("type") in types and not isinstance(value, types[schema["type"]]):
            return False
    return True


CUSTOMER = "Hi, I want to cancel my order #W5785065. My email is ada.abara154@example.com."


SECRET = "whsec-test-5f0c0ffee"


TOKEN = "fake-token-123"


async def socket_turn(participant, text, timeout=30):
    """Send one message through the real consumer; the events up to the turn's status."""
    socket = WebsocketCommunicator(app, f"/ws/p/{participant.token}/")
    assert (await socket.connect(timeout=30))[0]
    await socket.receive_json_from(timeout=30)  # history
    await socket.send_json_to({"type": "message", "id": "m1", "text": text})
    events = []
    try:
        while not events or events[-1]["type"] not in ("status", "redirect", "error"):
            events.append(await socket.receive_json_from(timeout=timeout))
    finally:  # a consumer left running breaks the Redis layer for the next event loop
        await socket.disconnect()
    return events
