"""Faults around the participant's path: the broker, Redis and PostgreSQL briefly unreachable,
a Celery message delivered twice. The completion of the last participant never waits on any of
them, and the study gets exactly one automatic analysis."""

import asyncio
import base64
import json
import shutil
import socket
import subprocess
import threading
import time
from datetime import timedelta

import pytest
import redis
from django.db import IntegrityError, connections, transaction
from django.urls import reverse
from django.utils import timezone
from parley.celery import app as celery_app

from agents.serving.process import free_port
from studies import tasks
from studies.models import AnalysisRun, Participant
from studies.participation.arrive import arrive
from studies.participation.chat_turn import end_chat, store_user_message
from studies.participation.complete import completion_url
from studies.participation.consent import give_consent
from studies.participation.questionnaire import submit_questionnaire
from tests.support.processes import need_service
from tests.support.studies import (
    GOOD_ANSWERS,
    at_questionnaire,
    make_study,
    prolific,
)


def study_one_short_of_target(slug="faults"):
    """Target 1 per arm; arm a is full, so the next completion in arm b reaches the target."""
    study = make_study(slug=slug, target_per_arm=1)
    assert submit_questionnaire(at_questionnaire(study, f"{slug}-a", "a"), GOOD_ANSWERS) == {}
    return study


# --- the broker ---------------------------------------------------------------------------------


def start_redis(port: int) -> subprocess.Popen:
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port, db=14)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.1)
    return process


class BrokerOut:
    def __init__(self, port: int):
        self.port = port
        self.wanted, self.back = threading.Event(), threading.Event()

    def bring_back(self):
        self.wanted.set()


@pytest.fixture
def broker_out_for_a_while(monkeypatch):
    """Celery's broker at a port that takes connections and never answers (a partition, the
    worst case: no quick refusal) until the test brings it back (at most 60 s); then a real
    Redis answers there. Out until asked, not for a fixed time: a slow machine changes nothing."""
    need_service(
        shutil.which("redis-server") is not None, "needs redis-server to bring the broker back"
    )
    port = free_port()
    monkeypatch.setitem(celery_app.conf, "broker_url", f"redis://127.0.0.1:{port}/14")
    hole = socket.socket()
    hole.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    hole.bind(("127.0.0.1", port))
    hole.listen(64)
    broker, out = [], BrokerOut(port)

    def come_back():
        out.wanted.wait(60)
        out.back.set()
        hole.close()  # resets the connections it held
        broker.append(start_redis(port))

    returning = threading.Thread(target=come_back, daemon=True)
    returning.start()
    yield out
    out.bring_back()
    returning.join(timeout=20)
    for process in broker:
        process.kill()
        process.wait()


@pytest.mark.django_db(transaction=True)
def test_the_last_completion_returns_at_once_with_the_broker_out_and_is_sent_later(
    client, broker_out_for_a_while
):
    study = study_one_short_of_target()
    last = at_questionnaire(study, "last", "b")

    started = time.monotonic()
    response = client.post(reverse("studies:questionnaire", args=[last.token]), GOOD_ANSWERS)
    elapsed = time.monotonic() - started
    # Answered with the broker still out. A request that waited on it would hang until its
    # 30 s socket timeout (PARLEY_REDIS_SOCKET_TIMEOUT): 10 s leaves a loaded machine room.
    assert response.status_code == 302 and not broker_out_for_a_while.back.is_set()
    assert elapsed < 10, elapsed
    last.refresh_from_db()
    assert last.status == Participant.Status.COMPLETED
    # The automatic run is stored, waiting for the broker, and nothing is lost meanwhile.
    run = AnalysisRun.objects.get(study=study)
    assert run.trigger == AnalysisRun.Trigger.TARGET and run.status == AnalysisRun.Status.QUEUED

    # The broker comes back: the sender, still trying, delivers the run to the analysis queue.
    broker_out_for_a_while.bring_back()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            queued = redis.Redis(port=broker_out_for_a_while.port, db=14).lrange("analysis", 0, -1)
        except redis.ConnectionError:
            queued = []
        if queued:
            break
        time.sleep(0.3)
    assert len(queued) == 1
    args, _kwargs, _options = json.loads(base64.b64decode(json.loads(queued[0])["body"]))
    assert args == [run.pk]


@pytest.mark.django_db
def test_one_automatic_analysis_per_study_is_kept_by_the_database():
    study = study_one_short_of_target()
    submit_questionnaire(at_questionnaire(study, "last", "b"), GOOD_ANSWERS)
    first = tasks.analyse_if_target_reached(study.pk)
    assert first is not None and first.trigger == AnalysisRun.Trigger.TARGET
    # Every later completion asks again; the database answers with the one run already there.
    assert tasks.analyse_if_target_reached(study.pk) is None
    with pytest.raises(IntegrityError), transaction.atomic():
        AnalysisRun.objects.create(study=study, trigger=AnalysisRun.Trigger.TARGET)
    tasks.start_analysis(study)  # a researcher's runs are not limited
    assert study.analysis_runs.filter(trigger=AnalysisRun.Trigger.TARGET).count() == 1
    assert study.analysis_runs.count() == 2


def test_the_last_two_finishing_together_start_one_analysis(
    postgres, transactional_db, monkeypatch
):
    """The race of the report (2 of 16 studies got two): two threads on two connections each
    complete the last participant of an arm, and both commits land before either trigger runs
    (a barrier between each commit and its on_commit trigger)."""
    # Kept here, not sent: the suite's shared worker (conftest's celery_worker) computed them on
    # the test database into the next tests, and its last write deadlocked with their flush.
    sent = []
    monkeypatch.setattr(tasks, "send_in_background", lambda task, *args: sent.append((task, args)))
    for round_ in range(3):
        study = make_study(slug=f"race{round_}", target_per_arm=1)
        pair = [at_questionnaire(study, f"r{round_}-{arm}", arm) for arm in ("a", "b")]
        both_committed = threading.Barrier(2)
        errors = []

        def complete(participant, barrier=both_committed, errors=errors):
            try:
                with transaction.atomic():
                    # Registered first, so it runs after the commit and before the trigger.
                    transaction.on_commit(lambda: barrier.wait(timeout=10))
                    assert submit_questionnaire(participant, GOOD_ANSWERS) == {}
            except Exception as error:  # noqa: BLE001 - reported by the main thread
                errors.append(error)
            finally:
                connections.close_all()

        threads = [threading.Thread(target=complete, args=(p,)) for p in pair]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert errors == []
        assert study.participants.filter(status=Participant.Status.COMPLETED).count() == 2
        automatic = study.analysis_runs.filter(trigger=AnalysisRun.Trigger.TARGET)
        assert automatic.count() == 1, list(automatic.values("pk", "created_at"))
        assert sent == [(tasks.run_analysis, (automatic.get().pk,))]  # and one message for it
        sent.clear()


# --- a message delivered twice -------------------------------------------------------------------


def deliver(run_id: int, redelivered: bool = False) -> str:
    """Run the task as a worker would for a message with this delivery flag."""
    tasks.run_analysis.push_request(delivery_info={"redelivered": redelivered})
    try:
        return tasks.run_analysis.run(run_id)
    finally:
        tasks.run_analysis.pop_request()


@pytest.mark.django_db
def test_an_analysis_delivered_twice_is_computed_once():
    study = study_one_short_of_target()
    run = tasks.start_analysis(study)
    assert deliver(run.pk) == AnalysisRun.Status.DONE
    run.refresh_from_db()
    finished, results = run.finished_at, run.results
    assert deliver(run.pk) == AnalysisRun.Status.DONE  # e.g. acks_late after a lost ack
    assert deliver(run.pk, redelivered=True) == AnalysisRun.Status.DONE
    run.refresh_from_db()
    assert run.finished_at == finished and run.results == results
    assert AnalysisRun.objects.filter(study=study).count() == 1


@pytest.mark.django_db
def test_a_running_analysis_is_left_alone_unless_its_worker_was_lost():
    study = study_one_short_of_target()
    run = tasks.start_analysis(study)
    AnalysisRun.objects.filter(pk=run.pk).update(status=AnalysisRun.Status.RUNNING)
    # A duplicate message while another worker computes it: nothing is computed twice.
    assert deliver(run.pk) == AnalysisRun.Status.RUNNING
    run.refresh_from_db()
    assert run.results is None and run.finished_at is None
    # The broker gives the message again because its worker died mid-task: it is taken over.
    assert deliver(run.pk, redelivered=True) == AnalysisRun.Status.DONE
    run.refresh_from_db()
    assert run.status == AnalysisRun.Status.DONE and run.results["participants"]
    assert deliver(9_999_999) == "missing"  # a run deleted meanwhile is no error


@pytest.mark.django_db
def test_a_run_deleted_while_it_is_computed_stays_deleted(monkeypatch):
    """A researcher deletes the run (or its study) in the admin while a worker computes it: the
    worker's result is dropped, not stored again as the run it had."""
    study = study_one_short_of_target()
    run = tasks.start_analysis(study)

    def deleted_meanwhile(study):  # the last section computed
        AnalysisRun.objects.filter(pk=run.pk).delete()
        return {}, {}

    monkeypatch.setattr(tasks.simulator_evaluations, "analysis_section", deleted_meanwhile)
    assert deliver(run.pk) == "missing"
    assert not AnalysisRun.objects.filter(pk=run.pk).exists()


def test_analysis_and_training_tasks_are_acknowledged_late():
    from training.tasks import run_training

    for task in (tasks.run_analysis, run_training):
        assert task.acks_late and task.reject_on_worker_lost, task.name


# --- Redis (channel layer) -----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_participant_completes_over_http_with_the_channel_layer_down(client, settings):
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "studies.chat.redis_layer.ResilientRedisChannelLayer",
            "CONFIG": {"hosts": [f"redis://127.0.0.1:{free_port()}/14"]},
        }
    }
    study = make_study(slug="nolayer")
    page = client.get(f"/s/{study.slug}/", prolific(pid="nolayer"))
    participant = Participant.objects.get(prolific_pid="nolayer")
    client.post(reverse("studies:consent", args=[participant.token]), {"decision": "accept"})
    store_user_message(participant, "m1", "hello")
    end_chat(participant)
    started = time.monotonic()
    done = client.post(reverse("studies:questionnaire", args=[participant.token]), GOOD_ANSWERS)
    assert page.status_code == 302 and done.status_code == 302
    assert time.monotonic() - started < 2
    participant.refresh_from_db()
    assert participant.status == Participant.Status.COMPLETED
    assert completion_url(participant).endswith("cc=DONE123")


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_the_chat_socket_rides_out_redis_away_and_rejoins_when_it_returns(settings, sockets):
    """With the layer's Redis unreachable the socket opens, keeps the participant's message and
    stays open (no 1011); once Redis is back, a second window takes over the first as usual."""
    from channels.db import database_sync_to_async
    from channels.layers import get_channel_layer
    from channels.routing import URLRouter

    from studies.chat.routing import websocket_urlpatterns

    need_service(shutil.which("redis-server") is not None, "needs redis-server to bring Redis back")
    port = free_port()
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "studies.chat.redis_layer.ResilientRedisChannelLayer",
            "CONFIG": {"hosts": [f"redis://127.0.0.1:{port}/14"]},
        }
    }

    @database_sync_to_async
    def chatting():
        study = make_study(slug="redis-away")
        participant, _ = arrive(study, prolific(pid="redis-away"))
        return give_consent(participant, True)

    participant = await chatting()
    app = URLRouter(websocket_urlpatterns)
    first = sockets(app, f"/ws/p/{participant.token}/")
    assert (await first.connect(timeout=60))[0]
    assert (await first.receive_json_from(timeout=60))["type"] == "history"
    await first.send_json_to({"type": "message", "id": "away-1", "text": "Still there?"})
    assert (await first.receive_json_from(timeout=30))["type"] == "ack"
    stored = await database_sync_to_async(
        lambda: list(participant.conversation.messages.values_list("client_id", flat=True))
    )()
    assert stored == ["away-1"]

    redis_back = await asyncio.to_thread(start_redis, port)
    try:
        layer = get_channel_layer()
        for _ in range(100):  # the first socket's layer receive tries again and joins its group
            if not getattr(layer, "groups_to_join", None):
                break
            await asyncio.sleep(0.2)
        second = sockets(app, f"/ws/p/{participant.token}/")
        assert (await second.connect(timeout=30))[0]
        events = []
        while not events or events[-1].get("type") != "superseded":
            events.append(await first.receive_json_from(timeout=30))
        assert (await first.receive_output(timeout=10)) == {"type": "websocket.close", "code": 4409}
        await second.disconnect()
    finally:
        redis_back.kill()
        redis_back.wait()


@pytest.mark.django_db(transaction=True)
def test_an_analysis_whose_worker_is_killed_mid_task_is_finished_once(redis_url, tmp_path):
    """A real prefork worker on Redis: its child is killed (SIGKILL) while it computes; the
    broker gives the message again (acks_late, reject_on_worker_lost) and the run ends done,
    computed by the next child, one run."""
    import os
    import signal
    import sys

    import psutil

    from tests.support.processes import REPO, child_env
    from tests.support.studies import fill

    study = make_study(slug="killed", target_per_arm=50)
    fill(study, {"a": [5, 6, 7, 6, 5, 6], "b": [2, 3, 3, 4, 2, 3]})
    queue = f"analysis-kill-{os.getpid()}"  # this worker alone, whatever else is running
    log = tmp_path / "worker.log"
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "parley",
            "worker",
            "-Q",
            queue,
            "--pool",
            "prefork",
            "-c",
            "1",
            "--loglevel",
            "INFO",
            "-n",
            f"kill-{os.getpid()}@%h",
        ],
        cwd=REPO,
        env=child_env(),
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while b"ready." not in log.read_bytes():
            assert worker.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.2)
        run = AnalysisRun.objects.create(study=study)
        tasks.run_analysis.apply_async((run.pk,), queue=queue)
        deadline = time.monotonic() + 90  # a loaded machine (2 cores, shared) can be slow
        while AnalysisRun.objects.get(pk=run.pk).status == AnalysisRun.Status.QUEUED:
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.01)
        children = psutil.Process(worker.pid).children()
        assert len(children) == 1
        os.kill(children[0].pid, signal.SIGKILL)  # mid-task: status is running, nothing saved

        while AnalysisRun.objects.get(pk=run.pk).status != AnalysisRun.Status.DONE:
            assert time.monotonic() < deadline + 90, log.read_text()[-3000:]
            time.sleep(0.2)
        assert AnalysisRun.objects.filter(study=study).count() == 1
        assert b"WorkerLostError" in log.read_bytes()  # it was killed mid-task, not after
    finally:
        worker.terminate()
        worker.wait(timeout=30)


@pytest.mark.django_db
def test_a_starting_worker_sends_again_what_was_left_queued_or_abandoned(monkeypatch):
    monkeypatch.setitem(celery_app.conf, "task_always_eager", True)  # "sent" = computed here
    study = study_one_short_of_target()
    long_ago = timezone.now() - timedelta(hours=1)
    left_queued, abandoned, fresh, busy = (tasks.start_analysis(study) for _ in range(4))
    AnalysisRun.objects.filter(pk__in=[left_queued.pk, abandoned.pk]).update(created_at=long_ago)
    AnalysisRun.objects.filter(pk=abandoned.pk).update(status="running", started_at=long_ago)
    AnalysisRun.objects.filter(pk=busy.pk).update(status="running", started_at=timezone.now())

    tasks.resend_on_worker_start()  # what the worker_ready signal calls
    status = dict(AnalysisRun.objects.values_list("pk", "status"))
    assert status[left_queued.pk] == status[abandoned.pk] == AnalysisRun.Status.DONE
    # Just sent, or running now on another worker: left to their own message.
    assert (status[fresh.pk], status[busy.pk]) == ("queued", "running")
