"""The live monitor: places per arm by status, live conversations, time per stage, endpoint
health, the latest errors with their participant, and the pause switch; it refreshes itself."""

import importlib
import json
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.core.cache import cache
from django.urls import reverse
from django.utils import timezone

from agents.models import ModelEndpoint
from studies.models import Arm, Participant, Study, StudyError
from studies.participation.arrive import arrive
from studies.participation.chat_turn import end_chat, store_user_message
from studies.participation.consent import give_consent
from studies.participation.questionnaire import submit_questionnaire
from studies.participation.start import start_preview
from studies.research import monitor
from tests.support.scripted_server import ScriptedServer
from tests.support.studies import GOOD_ANSWERS, make_study, prolific

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_remembered_health():
    """Endpoint health is cached briefly; each test asks afresh."""
    cache.clear()


@pytest.fixture
def engine():
    with ScriptedServer([], models=["SmolLM2-135M-Instruct"]) as server:
        yield server


@pytest.fixture
def running(engine):
    """Arm a on a healthy endpoint, arm b on one that does not answer; people at every stage."""
    study = make_study(engine=engine.url)
    Arm.objects.filter(study=study, name="b").update(
        endpoint=ModelEndpoint.of_url("http://127.0.0.1:9/v1")
    )
    people = {}
    for pid in ("done", "chatting", "reading"):
        p, _ = arrive(study, prolific(pid=pid, session_id=pid))
        Participant.objects.filter(pk=p.pk).update(arm=study.arms.get(name="a"))
        people[pid] = Participant.objects.get(pk=p.pk)
    done = people["done"]
    give_consent(done, True)
    store_user_message(done, "d1", "hi")
    end_chat(done)
    submit_questionnaire(done, GOOD_ANSWERS)
    start = timezone.now() - timedelta(minutes=10)
    Participant.objects.filter(pk=done.pk).update(
        created_at=start,
        consented_at=start + timedelta(seconds=30),
        chat_ended_at=start + timedelta(seconds=330),
        completed_at=start + timedelta(seconds=390),
    )
    give_consent(people["chatting"], True)
    store_user_message(people["chatting"], "c1", "hello there")
    Participant.objects.filter(pk=people["chatting"].pk).update(
        created_at=start, consented_at=start + timedelta(seconds=90)
    )
    start_preview(study.arms.get(name="b"))
    StudyError.objects.create(
        study=study, participant=people["reading"], title="Boom", detail="it broke", path="/p/x/"
    )
    return study


def test_the_snapshot_counts_times_health_and_errors(running):
    data = monitor.snapshot(running, identities=True)
    a, b = data["arms"]
    assert a["counts"]["completed"] == 1 and a["counts"]["chat"] == 1
    assert a["counts"]["consent"] == 1 and a["holding"] == 3
    assert sum(b["counts"].values()) == 0  # the preview is counted apart
    assert data["others"] == {"bots": 0, "previews": 1}
    assert a["healthy"] is True and b["healthy"] is False and "no replica" in b["health"]
    assert data["stages"]["consent"] == 60 and data["stages"]["chat"] == 300
    assert data["stages"]["questionnaire"] == 60 and data["stages"]["total"] == 390
    [active] = data["active"]
    assert active["pid"] == "chatting" and active["sent"] == 1 and active["last_activity"]
    [error] = data["errors"]
    assert error["pid"] == "reading" and error["title"] == "Boom"


def test_the_page_and_its_json_refresh(admin_client, running, engine):
    page = admin_client.get(reverse("admin:studies_study_monitor", args=[running.pk]))
    assert page.status_code == 200
    text = page.content.decode()
    assert "monitor.js" in text and "data-refresh-url" in text
    assert "chatting" in text and "Boom" in text and "unhealthy" in text
    asked = engine.model_lists
    response = admin_client.get(reverse("admin:studies_study_monitor_json", args=[running.pk]))
    data = response.json()
    assert data["study"]["status"] == "live" and "Boom" in data["html"]
    assert engine.model_lists == asked  # health is cached between refreshes


def staff(username, *codenames) -> User:
    user = User.objects.create(username=username, is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    return user


def test_the_pause_switch_needs_the_change_permission_and_a_post(client, running):
    url = reverse("admin:studies_study_switch", args=[running.pk])
    client.force_login(staff("viewer", "view_study"))
    page = client.get(reverse("admin:studies_study_monitor", args=[running.pk])).content
    assert b"pause-switch" not in page  # offered only to those who may use it
    assert client.post(url, {"to": "paused"}).status_code == 403
    assert Study.objects.get(pk=running.pk).status == Study.Status.LIVE

    client.force_login(staff("editor", "view_study", "change_study"))
    assert (
        b"pause-switch"
        in client.get(reverse("admin:studies_study_monitor", args=[running.pk])).content
    )
    assert client.get(url).status_code == 405
    assert client.post(url, {"to": "paused"}).status_code == 302
    assert Study.objects.get(pk=running.pk).status == Study.Status.PAUSED
    # Resuming is going live: the checks run (arm b's endpoint does not answer).
    response = client.post(url, {"to": "live"}, follow=True)
    assert "cannot go live" in response.content.decode()
    assert Study.objects.get(pk=running.pk).status == Study.Status.PAUSED
    Arm.objects.filter(study=running, name="b").update(active=False)
    client.post(url, {"to": "live"})
    assert Study.objects.get(pk=running.pk).status == Study.Status.LIVE


def test_the_switch_checks_csrf(running):
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(User.objects.create_superuser("root", "r@example.org", "pw"))
    response = strict.post(
        reverse("admin:studies_study_switch", args=[running.pk]), {"to": "paused"}
    )
    assert response.status_code == 403
    assert Study.objects.get(pk=running.pk).status == Study.Status.LIVE


def test_a_participant_error_reaches_the_monitor(client, admin_client, running):
    arrival = reverse("studies:arrive", args=[running.slug])
    client.get(arrival, {"PROLIFIC_PID": "only-a-pid"})  # an incomplete link
    text = admin_client.get(reverse("admin:studies_study_monitor", args=[running.pk])).content
    assert b"This link is incomplete" in text


def test_the_page_shows_local_readable_times_and_the_json_keeps_iso(
    admin_client, running, settings
):
    settings.TIME_ZONE = "Europe/Berlin"
    moment = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
    Participant.objects.filter(prolific_pid="chatting").update(consented_at=moment)
    StudyError.objects.filter(title="Boom").update(created_at=moment)
    page = admin_client.get(reverse("admin:studies_study_monitor", args=[running.pk]))
    text = page.content.decode()
    assert text.count("4 Mar 2026, 06:06:07 CET") == 2  # started, and the error's time
    assert "2026-03-04T" not in text
    data = admin_client.get(reverse("admin:studies_study_monitor_json", args=[running.pk])).json()
    assert data["active"][0]["started"] == "2026-03-04T05:06:07+00:00"
    assert "4 Mar 2026, 06:06:07 CET" in data["html"]


# --- participants' credentials (issue 36 point 5) -------------------------------------------


def test_a_view_only_user_sees_no_prolific_id_and_no_token(client, running):
    """A view-only user took a token from monitor.json, read that participant's conversation and
    wrote as them: the problem's path keeps no token, and Prolific ids need the participants
    permission."""
    reading = running.participants.get(prolific_pid="reading")
    chatting = running.participants.get(prolific_pid="chatting")
    # a real problem through the real page: the consent form sent without a choice
    page = f"/p/{reading.token}/consent/"
    assert client.post(page, {}).status_code == 400
    problem = StudyError.objects.filter(study=running, title="Please choose").get()
    assert problem.path == "/p/[token]/consent/" and str(reading.token) not in problem.path

    client.force_login(staff("viewer", "view_study"))
    html = client.get(reverse("admin:studies_study_monitor", args=[running.pk])).content.decode()
    data = client.get(reverse("admin:studies_study_monitor_json", args=[running.pk])).json()
    text = html + json.dumps(data)
    for secret in (str(reading.token), str(chatting.token), "reading", "chatting"):
        assert secret not in text, secret
    assert "/p/[token]/consent/" in text
    assert f"#{chatting.pk}" in data["html"]  # the participant by number
    assert all("pid" not in row for row in data["active"] + data["errors"])

    client.force_login(staff("researcher", "view_study", "view_participant"))
    data = client.get(reverse("admin:studies_study_monitor_json", args=[running.pk])).json()
    assert [row["pid"] for row in data["active"]] == ["chatting"]
    assert "reading" in data["html"] and str(reading.token) not in data["html"]


def test_the_problem_admin_names_participants_only_with_the_permission(client, running):
    problem = StudyError.objects.get(study=running)
    url = reverse("admin:studies_studyerror_change", args=[problem.pk])
    listing = reverse("admin:studies_studyerror_changelist")
    client.force_login(staff("viewer", "view_study", "view_studyerror"))
    for page in (url, listing):
        response = client.get(page)
        assert response.status_code == 200 and "reading" not in response.content.decode(), page
    # nor can a Prolific id be found by searching for it
    assert "0 results" in client.get(listing + "?q=reading").content.decode()
    assert f"#{problem.participant_id}" in client.get(url).content.decode()
    client.force_login(staff("researcher", "view_studyerror", "view_participant"))
    assert "reading" in client.get(url).content.decode()


def test_stored_problem_paths_lose_their_token_in_the_data_migration(running):
    from django.apps import apps

    migration = importlib.import_module("studies.migrations.0020_mask_problem_paths")
    token = str(running.participants.get(prolific_pid="reading").token)
    StudyError.objects.filter(study=running).update(path=f"/p/{token}/questionnaire/")
    socket = StudyError.objects.create(study=running, title="Chat", path=f"/ws/p/{token}/")
    other = StudyError.objects.create(study=running, title="Arrival", path="/s/s1/")
    migration.mask_paths(apps, None)
    paths = dict(StudyError.objects.values_list("pk", "path"))
    assert paths[socket.pk] == "/ws/p/[token]/" and paths[other.pk] == "/s/s1/"
    assert "/p/[token]/questionnaire/" in paths.values()
    assert not any(token in path for path in paths.values())
