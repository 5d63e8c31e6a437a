"""Domains inside studies: scenario pools, per-conversation state, server-side tool calls,
the Outcome at the end, and the P4G questionnaire outcome."""

import pytest
from channels.db import database_sync_to_async
from django.core.management import call_command
from django.urls import reverse

from agents.paths import reference_dir
from studies.lib import domain_bridge
from studies.models import Item, Message, Participant, Scenario
from studies.participation.arrive import arrive
from studies.participation.chat_turn import end_chat, store_user_message
from studies.participation.consent import give_consent
from studies.participation.questionnaire import submit_questionnaire
from studies.setup.scenario_pools import PoolError, import_pool
from tests.support.processes import need
from tests.support.scripted_server import ScriptedServer
from tests.support.studies import (
    make_study,
    prolific,
    talk,
)


@pytest.mark.django_db
def test_pool_mixes_domains_and_reimport_keeps_what_is_there():
    study = make_study(domain="retail")
    assert import_pool(study, "retail", count=8) == (8, 0)
    assert import_pool(study, "airline", count=8, seed=1) == (8, 0)
    assert import_pool(study, "retail", count=8) == (0, 8)  # same sample: nothing duplicated
    assert set(study.scenarios.values_list("domain", flat=True)) == {"retail", "airline"}
    scenario = study.scenarios.filter(domain="airline").first()
    assert "What you know" in scenario.instructions and scenario.payload["id"]
    with pytest.raises(PoolError, match="Unknown domain"):
        import_pool(study, "chess")
    with pytest.raises(PoolError, match="No data folder"):
        import_pool(study, "retail", source="/nonexistent")


@pytest.mark.django_db
def test_official_pools_import(capsys):
    reference = reference_dir()
    need(reference is not None, "needs ../shared/reference")
    study = make_study(domain="p4g")
    call_command(
        "import_scenarios",
        study=study.slug,
        domain="retail",
        count=15,
        data_dir=str(reference / "tau2" / "retail"),
        split="test",
    )
    call_command(
        "import_scenarios",
        study=study.slug,
        domain="airline",
        count=15,
        data_dir=str(reference / "tau2" / "airline"),
    )
    call_command(
        "import_scenarios",
        study=study.slug,
        domain="p4g",
        count=30,
        data_dir=str(reference / "p4g"),
    )
    counts = {d: study.scenarios.filter(domain=d).count() for d in ("retail", "airline", "p4g")}
    assert counts == {"retail": 15, "airline": 15, "p4g": 30}
    assert "15 scenario(s) added" in capsys.readouterr().out


@pytest.mark.django_db
def test_admin_import_page(admin_client):
    study = make_study()
    url = reverse("admin:studies_study_import", args=[study.pk])
    assert "Bundled data" in admin_client.get(url).content.decode()
    response = admin_client.post(
        url, {"domain": "p4g", "source": "", "split": "", "count": "5", "seed": "0"}
    )
    assert response.status_code == 302 and study.scenarios.count() == 5
    bad = admin_client.post(
        url, {"domain": "p4g", "source": "", "split": "", "count": "0", "seed": "0"}
    )
    assert bad.status_code == 200 and "greater than or equal to 1" in bad.content.decode()


@database_sync_to_async
def retail_participants(engine_url, n=2):
    study = make_study(slug="shop", domain="retail", engine=engine_url)
    study.arms.update(tool_format="native")
    study.arms.filter(name="b").update(active=False)
    import_pool(study, "retail")
    Scenario.objects.filter(study=study).exclude(key="retail-0").update(active=False)
    people = []
    for i in range(n):
        participant, _ = arrive(study, prolific(pid=f"buyer{i}"))
        people.append(give_consent(participant, True))
    return people


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_tool_calls_run_on_the_server_on_this_conversations_own_state():
    script = [
        {
            "tool_calls": [
                ("find_user_id_by_email", {"email": "ada.abara154@example.com"}),
                ("get_order_details", {"order_id": "#W5785065"}),
            ]
        },
        {
            "tool_calls": [
                ("cancel_pending_order", {"order_id": "#W5785065", "reason": "no longer needed"})
            ]
        },
        {"content": "Your order #W5785065 is cancelled."},
    ]
    with ScriptedServer(script) as server:
        first, second = await retail_participants(server.url)
        history, events = await talk(
            first, "Please cancel my order #W5785065, email ada.abara154@example.com", "c1"
        )
    assert history["messages"][0]["content"] == "Hi! How can I help you today?"  # the agent opens
    kinds = [e["type"] for e in events]
    assert (
        kinds.count("tool_calls") == 2 and kinds.count("tool_result") == 3 and kinds[-2] == "reply"
    )
    assert "tools" in server.requests[0] and server.requests[0]["tools"][0]["type"] == "function"

    roles = await database_sync_to_async(
        lambda: list(
            Message.objects.filter(conversation__participant=first).values_list("role", "tool_name")
        )
    )()
    assert roles == [
        ("assistant", ""),
        ("user", ""),
        ("assistant", ""),
        ("tool", "find_user_id_by_email"),
        ("tool", "get_order_details"),
        ("assistant", ""),
        ("tool", "cancel_pending_order"),
        ("assistant", ""),
    ]

    @database_sync_to_async
    def order_status(participant):
        participant = Participant.objects.select_related("study", "arm", "scenario").get(
            pk=participant.pk
        )
        domain, scenario = domain_bridge.domain_of(participant)
        state = domain.load_state(scenario, participant.conversation.state)
        return domain.execute_tool(state, "get_order_details", {"order_id": "#W5785065"})

    assert '"cancelled"' in await order_status(first)
    assert '"pending"' in await order_status(second)  # nobody sees another participant's changes

    ended = await database_sync_to_async(end_chat)(first)
    assert ended.outcome["reward"] == 1.0 and ended.outcome["success"] is True
    # its gold action changes the DB, so the score checked what the chat did: it may be told
    assert ended.outcome["details"]["checked"] is True
    assert ended.outcome["details"]["db"]["gold_changes_db"] is True
    # The other conversation cancelled nothing: its DB differs from the gold one, so it scores 0.
    ended_second = await database_sync_to_async(end_chat)(second, "time_limit")
    assert ended_second.outcome["reward"] == 0.0 and ended_second.outcome["success"] is False


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_tool_calls_per_turn_are_capped():
    looping = [{"tool_calls": [("get_order_details", {"order_id": "#W5785065"})]}] * 20
    with ScriptedServer(looping + [{"content": "Done."}]) as server:
        (participant,) = await retail_participants(server.url, n=1)
        cap = domain_bridge.shared_domain("retail").max_tool_calls_per_turn
        _, events = await talk(participant, "Where is my order?", "loop")
        assert [e["type"] for e in events].count("tool_result") == cap
        assert "tools" not in server.requests[-1]  # out of budget: the agent must answer
    assert events[-2]["type"] == "reply"


@pytest.mark.django_db
def test_p4g_outcome_is_the_intended_donation_with_the_chat_amount_beside_it(client):
    study = make_study(slug="give", domain="p4g")
    import_pool(study, "p4g", count=3)
    Item.objects.create(
        questionnaire=study.questionnaire,
        order=9,
        key="intended_donation",
        domain_input="donation",
        prompt="How much do you donate?",
        kind="number",
        min_value=0,
        max_value=2,
    )
    participant, _ = arrive(study, prolific(pid="giver"))
    participant = give_consent(participant, True)
    assert participant.conversation.messages.first().content  # the persuader opens
    store_user_message(participant, "g1", "Fine, I'll donate $0.50 to the children.")
    participant = Participant.objects.get(pk=participant.pk)
    assert (
        domain_bridge.end_reason(participant) is None
    )  # the persuader's closing reply comes first
    participant = end_chat(participant, "donation")
    assert participant.outcome["components"]["donation"] == 0.5
    answers = {
        "helpful": "5",
        "frustration": "3",
        "attn": "2",
        "donation": "1",
        "intended_donation": "1.5",
    }
    assert submit_questionnaire(participant, answers) == {}
    participant.refresh_from_db()
    assert participant.outcome["reward"] == pytest.approx(0.75)
    assert participant.outcome["details"]["chat_donation"] == 0.5
    debrief = client.get(reverse("studies:participant", args=[participant.token])).content.decode()
    # the amount that counts is confirmed, with the chat's beside it; no score by default
    assert "donate $1.50" in debrief and "$0.50" in debrief and "Score" not in debrief
    study.outcome_feedback = study.Feedback.SCORE
    study.save()
    debrief = client.get(reverse("studies:participant", args=[participant.token])).content.decode()
    assert "Score: 0.75" in debrief
