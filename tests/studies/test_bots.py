"""Bot participants through the real server (uvicorn, HTTP + WebSocket) and a streaming engine:
they complete, balance the arms among themselves, get the code, and stay out of the data."""

import json

import pytest
from django.core.management import CommandError, call_command

from studies import bots, exports, flow, reports
from studies.models import Message, Participant
from tests.conftest import need
from tests.scripted_server import ScriptedServer
from tests.studies.conftest import make_study, prolific

SECRET = "bots-test-secret-shared-by-the-test-and-its-server"


@pytest.fixture
def server(monkeypatch, settings, transactional_db, request):
    """The ASGI server, sharing this process's secret key so both sign bots alike."""
    from django.db import connection

    # Concurrent bots write at once, and SQLite answers concurrent writers "database is locked"
    # (a 503 page); the production layout and CI run on PostgreSQL.
    need(connection.vendor == "postgresql", "concurrent bots need DATABASE_URL on PostgreSQL")
    monkeypatch.setenv("DJANGO_SECRET_KEY", SECRET)
    settings.SECRET_KEY = SECRET
    return request.getfixturevalue("web_server")


@pytest.fixture
def engine():
    with ScriptedServer([{"content": "Happy to help with that."}] * 40) as scripted:
        yield scripted


def rows(stream) -> list[list]:
    return list(stream)


def test_bots_complete_balanced_coded_and_absent_from_exports(server, engine, capsys):
    study = make_study(slug="rehearse", engine=engine.url, min_exchanges=2)
    person, _ = flow.arrive(study, prolific(pid="areal0person"))  # a real participant, arm a

    call_command("run_bots", study="rehearse", n=4, concurrency=2, url=server, json=True)
    report = json.loads(capsys.readouterr().out)
    assert report["completed"] == 4 and report["failed"] == 0, report["errors"]
    assert report["arms"] == {"a": 2, "b": 2}  # bots balance among bots, despite the person
    assert report["codes"] == {"DONE123": 4}
    assert report["turns"] == 8 and report["ttft_ms"]["p50"] is not None
    assert len(engine.requests) == 8

    made = Participant.objects.filter(is_bot=True)
    assert made.count() == 4 and all(p.status == "completed" for p in made)
    assert not Participant.objects.get(pk=person.pk).is_bot
    # The bots answered every item validly, attention check included.
    assert all(p.attention_passed for p in made)

    everyone = study.participants.all()
    header, *people = rows(exports.response_rows(everyone))
    assert [r[header.index("prolific_pid")] for r in people] == ["areal0person"]
    transcripts = rows(exports.transcript_rows(everyone))[1:]
    assert transcripts == []  # the person has not chatted; the bots' 16 messages are left out
    assert len(rows(exports.response_rows(everyone, include_bots=True))) == 1 + 5
    assert len(rows(exports.transcript_rows(everyone, include_bots=True))) == 1 + 16
    assert list(reports.participant_table(study)["participant"]) == ["areal0person"]
    assert len(reports.participant_table(study, include_bots=True)) == 5


@pytest.mark.django_db
def test_only_the_server_can_mark_a_bot(settings):
    study = make_study(slug="marks")
    forged = flow.arrive(study, prolific(pid="BOTabc-0123456789abcdef0123"))[0]
    signed = flow.arrive(study, prolific(pid=bots.bot_pid(study)))[0]
    other = make_study(slug="other")
    elsewhere = flow.arrive(other, prolific(pid=bots.bot_pid(study)))[0]
    assert (forged.is_bot, signed.is_bot, elsewhere.is_bot) == (False, True, False)
    settings.SECRET_KEY = "another server"
    assert not bots.is_bot_pid(study, signed.prolific_pid)


@pytest.mark.django_db
def test_bots_only_run_on_a_live_study(admin_client):
    study = make_study(slug="draft", status="draft")
    with pytest.raises(CommandError, match="not live"):
        call_command("run_bots", study="draft", n=1, concurrency=1)
    response = admin_client.post(
        "/admin/studies/study/", {"action": "run_bots", "_selected_action": [study.pk]}, follow=True
    )
    assert "is not live: no bots" in response.content.decode()


@pytest.mark.django_db
def test_bots_do_not_count_towards_the_target(settings):
    study = make_study(slug="target", target_per_arm=1)
    for arm in study.arms.all():
        bot = Participant.objects.create(
            study=study, arm=arm, prolific_pid=bots.bot_pid(study), is_bot=True, status="completed"
        )
        assert bot.is_bot
    assert not reports.target_reached(study)


def test_the_simulator_plays_the_participant(server, engine, settings):
    settings.PARLEY_ENGINE_URL = engine.url  # where the simulator's model is served
    study = make_study(slug="simulated", engine=engine.url, min_exchanges=1)
    report = bots.run_bots(study, 2, 2, server, kind="simulator")
    assert report.completed == 2, report.to_dict()["errors"]
    # Each turn: the simulator asks the engine for the user's message (a whole reply, under the
    # generic participant prompt of an open chat), then the agent streams its answer.
    asked = [r for r in engine.requests if not r.get("stream")]
    assert len(asked) == 2 and all(
        r["messages"][0]["content"] == bots.OPEN_CHAT_USER for r in asked
    )
    said = Message.objects.filter(conversation__participant__study=study, role="user")
    assert [m.content for m in said] == ["Happy to help with that."] * 2


def test_the_admin_runs_bots_on_a_study(server, engine, admin_client, settings):
    from parley.celery import app

    study = make_study(slug="from-admin", engine=engine.url, min_exchanges=1)
    # The task runs in this process (eager) against the live server; its queue is `default`.
    assert app.amqp.router.route({}, "studies.tasks.run_bots")["queue"].name == "default"
    settings.PUBLIC_URL = server
    app.conf.task_always_eager = True
    try:
        response = admin_client.post(
            "/admin/studies/study/",
            {"action": "run_bots", "_selected_action": [study.pk]},
            follow=True,
        )
    finally:
        app.conf.task_always_eager = False
    assert "4 bots queued on Test study" in response.content.decode()
    made = Participant.objects.filter(study=study)
    assert made.count() == 4 and all(p.is_bot and p.status == "completed" for p in made)
    # The study's downloads leave them out unless asked for.
    for name, with_bots in (("responses", 4), ("transcripts", 8)):
        url = f"/admin/studies/study/{study.pk}/{name}.csv"
        lines = b"".join(admin_client.get(url).streaming_content).decode().splitlines()
        assert len(lines) == 1  # the header
        lines = b"".join(admin_client.get(url + "?bots=1").streaming_content).decode().splitlines()
        assert len(lines) == 1 + with_bots
