"""The time limit holds without the participant's page: a periodic sweep (Celery beat) times out
everyone past their study's limit and frees their places; the chat counts down and a message
sent after the limit is refused with a notice."""

import re
from datetime import timedelta

import pytest
from django.conf import settings
from django.urls import reverse
from django.utils import timezone
from parley.celery import app

from studies import tasks
from studies.lib.flow_errors import FlowError
from studies.models import TIME_LIMIT, Participant, time_out_overdue
from studies.participation.arrive import arrive
from studies.participation.assign import arms_with_fill
from studies.participation.chat_turn import (
    chat_closed,
    chat_status,
    expire_if_overdue,
    store_user_message,
)
from studies.participation.consent import give_consent
from tests.support.studies import make_study, prolific


def arrived_minutes_ago(participant: Participant, minutes: float) -> Participant:
    Participant.objects.filter(pk=participant.pk).update(
        created_at=timezone.now() - timedelta(minutes=minutes)
    )
    participant.refresh_from_db()
    return participant


def chatting(study, pid: str, minutes_ago: float) -> Participant:
    participant, _ = arrive(study, prolific(pid=pid, session_id=f"s-{pid}"))
    participant = give_consent(participant, accepted=True)
    return arrived_minutes_ago(participant, minutes_ago)


@pytest.mark.django_db
def test_the_sweep_times_out_each_study_by_its_own_limit_and_frees_places():
    short = make_study(slug="short", arms=("a",), time_limit_minutes=20)
    long = make_study(slug="long", arms=("a",), time_limit_minutes=30)
    late_short = chatting(short, "p1", 32)  # past 20
    within_long = chatting(long, "p2", 25)  # within 30
    late_long = chatting(long, "p3", 34)  # past 30
    reading = arrived_minutes_ago(arrive(long, prolific(pid="p4"))[0], 31)  # at consent
    done = chatting(short, "p5", 60)
    Participant.objects.filter(pk=done.pk).update(status=Participant.Status.COMPLETED)

    timed_out = tasks.time_out_overdue_participants()  # what beat runs

    assert timed_out == 3
    status = dict(Participant.objects.values_list("prolific_pid", "status"))
    assert status == {
        "p1": "timed_out",
        "p2": "chat",
        "p3": "timed_out",
        "p4": "timed_out",
        "p5": "completed",
    }
    # their conversations end with everything they hold; the places are free again
    late_short.conversation.refresh_from_db()
    assert late_short.conversation.end_reason == TIME_LIMIT
    assert late_short.conversation.ended_at is not None
    within_long.conversation.refresh_from_db()
    assert within_long.conversation.ended_at is None
    fill = {arm.pk: arm.filled for arm in arms_with_fill(long)}
    assert fill == {late_long.arm_id: 1}  # p2 only: p3 and p4 gave theirs back
    assert reading.pk in set(
        Participant.objects.filter(status="timed_out").values_list("pk", flat=True)
    )
    assert tasks.time_out_overdue_participants() == 0  # a second sweep changes nothing


@pytest.mark.django_db
def test_a_participant_at_the_limit_is_left_alone_until_it_passes():
    study = make_study(time_limit_minutes=10)
    participant = chatting(study, "p1", 9.9)
    assert time_out_overdue() == []
    assert time_out_overdue(now=timezone.now() + timedelta(minutes=1)) == [participant.pk]


def test_beat_sends_the_sweep_and_a_worker_knows_it():
    entries = [
        e
        for e in settings.CELERY_BEAT_SCHEDULE.values()
        if e["task"] == "studies.tasks.time_out_overdue"
    ]
    assert len(entries) == 1 and 0 < entries[0]["schedule"] <= 300
    app.loader.import_default_modules()
    assert "studies.tasks.time_out_overdue" in app.tasks


def test_the_demo_and_deploy_run_beat_and_a_training_worker_of_its_own():
    from pathlib import Path

    from parley.celery import SERVICE_QUEUES, TRAINING_QUEUES, beat_args, worker_args

    assert "training" not in SERVICE_QUEUES and TRAINING_QUEUES == ("training",)
    assert worker_args(queues=TRAINING_QUEUES)[-1] == "training"
    assert "beat" in beat_args("/tmp/schedule")
    demo = Path("platform/parley/demo.py").read_text()
    assert "beat_args(" in demo and "queues=TRAINING_QUEUES" in demo
    deploy = Path("platform/deploy")
    procfile = (deploy / "Procfile").read_text()
    assert "celery -A parley beat" in procfile
    assert any(
        "-Q training" in line and line.startswith("trainer:") for line in procfile.splitlines()
    )
    assert "-Q training" not in procfile.split("worker:")[1].splitlines()[0]
    assert "parley beat" in (deploy / "systemd/parley-beat.service").read_text()
    assert "-Q training" in (deploy / "systemd/parley-trainer.service").read_text()


@pytest.mark.django_db
def test_a_message_after_the_limit_is_refused_with_a_notice_and_not_stored():
    study = make_study(time_limit_minutes=15)
    participant = chatting(study, "p1", 16)  # past the limit; no sweep has run yet
    with pytest.raises(FlowError) as refused:
        store_user_message(participant, "m1", "hello?")
    assert refused.value.title == "Time is up"
    assert "15 minutes" in refused.value.detail and "not sent" in refused.value.detail
    assert not participant.conversation.messages.filter(role="user").exists()
    # once timed out, the same notice (not "the chat has ended") for the consumer to send
    participant = expire_if_overdue(participant)
    assert participant.status == "timed_out"
    assert chat_closed(participant).title == "Time is up"
    with pytest.raises(FlowError, match="time limit"):
        store_user_message(participant, "m2", "anyone?")


@pytest.mark.django_db
def test_the_chat_counts_down_from_the_servers_clock(client):
    study = make_study(time_limit_minutes=30)
    participant = chatting(study, "p1", 10)
    status = chat_status(participant)
    assert 19 * 60 - 5 <= status["seconds_left"] <= 20 * 60
    assert status["can_send"] is True and status["time_limit_minutes"] == 30
    page = client.get(reverse("studies:participant", args=[participant.token])).content.decode()
    assert 'id="time-left"' in page and 'id="time-warning"' in page
    shown = int(re.search(r'data-seconds-left="(\d+)"', page).group(1))
    assert 19 * 60 - 5 <= shown <= 20 * 60
    late = chatting(study, "p2", 31)
    assert chat_status(late)["can_send"] is False
    assert chat_status(late)["seconds_left"] == 0


def test_the_page_warns_two_minutes_before_and_says_when_a_message_was_not_sent():
    from pathlib import Path

    script = Path("studies/static/studies/chat.js").read_text()
    assert "WARN_SECONDS = 120" in script
    assert "seconds_left" in script
    assert "your last message was not sent" in script


@pytest.mark.services
@pytest.mark.django_db(transaction=True)
def test_celery_beat_times_out_abandoned_participants_on_a_real_worker(celery_worker, tmp_path):
    """Nobody loads a page: beat sends the sweep, the worker runs it, the place is free."""
    import subprocess
    import sys
    import time

    from parley.celery import beat_args

    from tests.support.processes import REPO, child_env

    study = make_study(arms=("a",), time_limit_minutes=5)
    abandoned = chatting(study, "gone", 6)
    log = tmp_path / "beat.log"
    with open(log, "wb") as out:
        beat = subprocess.Popen(
            [sys.executable, *beat_args(str(tmp_path / "schedule"), "--loglevel", "INFO")],
            cwd=REPO,
            env=child_env(PARLEY_TIMEOUT_SWEEP_SECONDS="1"),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while Participant.objects.get(pk=abandoned.pk).status != "timed_out":
            assert beat.poll() is None, log.read_text()[-2000:]
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.5)
    finally:
        beat.terminate()
        beat.wait(timeout=20)
    assert "studies.tasks.time_out_overdue" in log.read_text()
    assert arms_with_fill(study)[0].filled == 0


@pytest.mark.django_db
def test_the_time_up_page_says_when_a_message_came_too_late(client):
    study = make_study(time_limit_minutes=5)
    participant = expire_if_overdue(chatting(study, "p1", 6))
    url = reverse("studies:participant", args=[participant.token])
    assert "came after the time limit" in client.get(url + "?unsent=1").content.decode()
    assert "came after the time limit" not in client.get(url).content.decode()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_late_message_over_the_socket_gets_the_time_up_notice_before_the_redirect():
    from channels.db import database_sync_to_async
    from channels.routing import URLRouter
    from channels.testing import WebsocketCommunicator

    from studies.chat.routing import websocket_urlpatterns

    participant = await database_sync_to_async(
        lambda: chatting(make_study(time_limit_minutes=5), "late", 4.99)
    )()
    socket = WebsocketCommunicator(URLRouter(websocket_urlpatterns), f"/ws/p/{participant.token}/")
    assert (await socket.connect(timeout=30))[0]
    assert (await socket.receive_json_from(timeout=30))["type"] == "history"
    await database_sync_to_async(arrived_minutes_ago)(participant, 6)
    await socket.send_json_to({"type": "message", "id": "late1", "text": "Still there?"})
    try:
        notice = await socket.receive_json_from(timeout=30)
        # not dropped by the error: the redirect that follows finds it unsent and says so
        assert (
            notice["type"] == "error" and not notice.get("drop") and notice["reply_to"] == "late1"
        )
        assert "time limit of 5 minutes has passed" in notice["message"]
        assert (await socket.receive_json_from(timeout=30))["type"] == "redirect"
    finally:
        await socket.disconnect()


@pytest.mark.services
@pytest.mark.django_db(transaction=True)
def test_the_sweep_skips_a_participant_a_flow_step_holds_on_postgresql(postgres):
    """Completing right at the limit: the sweep leaves the locked row to the step that holds it,
    so a completed participant is never turned into a timed-out one."""
    import threading

    from django.db import connection, transaction

    study = make_study(time_limit_minutes=5)
    participant = chatting(study, "edge", 6)
    locked, release, let_go = threading.Event(), threading.Event(), threading.Event()

    def finishing_step():
        try:
            with transaction.atomic():
                row = Participant.objects.select_for_update().get(pk=participant.pk)
                locked.set()
                release.wait(60)
                let_go.set()  # the lock ends after this: a sweep that waited returns after it
                row.status = Participant.Status.COMPLETED
                row.save(update_fields=["status"])
        finally:
            connection.close()

    step = threading.Thread(target=finishing_step)
    step.start()
    assert locked.wait(10)
    try:
        assert time_out_overdue() == []
        assert not let_go.is_set()  # it returned while the step held the row: skipped, not waited
    finally:
        release.set()
        step.join(10)
    assert Participant.objects.get(pk=participant.pk).status == "completed"
    assert time_out_overdue() == []  # completed: nothing to time out
