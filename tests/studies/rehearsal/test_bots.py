"""Bot participants through the real server (uvicorn, HTTP + WebSocket) and a streaming engine:
they complete, balance the arms among themselves, get the code, and stay out of the data."""

import json

import httpx
import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse

from studies.models import Message, Participant
from studies.participation.arrive import arrive
from studies.participation.consent import give_consent
from studies.rehearsal import bots
from studies.research import analysis_runs, exports
from tests.support.processes import child_env, python
from tests.support.scripted_server import ScriptedServer
from tests.support.studies import make_study, prolific


@pytest.fixture
def server(monkeypatch, transactional_db, request):
    """The ASGI server in its own process, with no DJANGO_SECRET_KEY: its development key is
    its own, unlike this process's, as in `make demo` (bots are signed under the database's
    study key, not the settings' key)."""
    # Concurrent bots write at once: on SQLite (the README's default) the server's writers wait
    # for the file's lock (settings.SQLITE_OPTIONS, also under DATABASE_URL=sqlite:///...).
    monkeypatch.delenv("DJANGO_SECRET_KEY", raising=False)
    return request.getfixturevalue("web_server")


@pytest.fixture
def engine():
    with ScriptedServer([{"content": "Happy to help with that."}] * 40) as scripted:
        yield scripted


def rows(stream) -> list[list]:
    return list(stream)


def test_bots_complete_balanced_coded_and_absent_from_exports(server, engine, capsys):
    study = make_study(slug="rehearse", engine=engine.url, min_exchanges=2)
    person, _ = arrive(study, prolific(pid="areal0person"))  # a real participant, arm a

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
    assert list(analysis_runs.participant_table(study)["participant"]) == ["areal0person"]
    assert len(analysis_runs.participant_table(study, include_bots=True)) == 5


def test_bots_run_from_another_process_are_bots_to_the_web_server(server, engine, admin_client):
    """`manage.py run_bots` in its own process against the web server in another, neither with
    DJANGO_SECRET_KEY (so each has its own development key): the bots are stored as bots, the
    monitor counts them, and they take no real participant's place."""
    study = make_study(slug="elsewhere", engine=engine.url, target_per_arm=1)
    ran = python(
        "manage.py",
        "run_bots",
        "--study",
        "elsewhere",
        "--n",
        "2",
        "--concurrency",
        "2",
        "--url",
        server,
        "--json",
        env=child_env(),
        timeout=300,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr[-3000:]
    assert json.loads(ran.stdout)["completed"] == 2

    made = Participant.objects.filter(study=study)
    assert made.count() == 2 and all(p.is_bot for p in made)
    shown = admin_client.get(reverse("admin:studies_study_monitor_json", args=[study.pk])).json()
    assert "2 bot(s)" in shown["html"]
    # Both arms' one place is still free: a person arriving by the link is placed, not refused.
    link = f"{server}/s/elsewhere/?PROLIFIC_PID=areal0person&STUDY_ID=X&SESSION_ID=S1"
    arrived = httpx.get(link, follow_redirects=True, timeout=30)
    assert arrived.status_code == 200 and "full" not in arrived.text, arrived.text[:500]
    person = study.participants.get(prolific_pid="areal0person")
    assert not person.is_bot and person.status == Participant.Status.CONSENT


@pytest.mark.django_db
def test_only_the_site_can_mark_a_bot(settings):
    study = make_study(slug="marks")
    forged = arrive(study, prolific(pid="BOTabc-0123456789abcdef0123"))[0]
    signed = arrive(study, prolific(pid=bots.bot_pid(study)))[0]
    other = make_study(slug="other")
    elsewhere = arrive(other, prolific(pid=bots.bot_pid(study)))[0]
    assert (forged.is_bot, signed.is_bot, elsewhere.is_bot) == (False, True, False)
    # The mark is the study's stored key, not the process's: another SECRET_KEY still knows it,
    # another study key (another installation's) does not, and a study without one marks none.
    settings.SECRET_KEY = "another process"
    assert bots.is_bot_pid(study, signed.prolific_pid)
    study.bot_key = "another installation"
    assert not bots.is_bot_pid(study, signed.prolific_pid)
    study.bot_key = ""
    assert not bots.is_bot_pid(study, signed.prolific_pid)
    with pytest.raises(ValueError, match="no bot key"):
        bots.bot_pid(study)


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
    assert not analysis_runs.target_reached(study)


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


def test_the_migration_gives_each_existing_study_its_own_bot_key(transactional_db):
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    before, after = [("studies", "0013_arm_tool_choice")], [("studies", "0014_study_bot_key")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    old = executor.loader.project_state(before).apps.get_model("studies", "Study")
    for slug in ("one", "two"):
        old.objects.create(slug=slug, title=slug)
    try:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(after)
        new = executor.loader.project_state(after).apps.get_model("studies", "Study")
        keys = list(new.objects.values_list("bot_key", flat=True))
        assert len(keys) == 2 and all(len(k) >= 40 for k in keys) and keys[0] != keys[1]
    finally:
        MigrationExecutor(connection).migrate(
            MigrationExecutor(connection).loader.graph.leaf_nodes()
        )


def test_bots_rehearse_an_annotation_study_without_taking_peoples_places(server, capsys):
    from studies.models import AnnotationSetup, RatedConversation, RatingAssignment

    study = make_study(slug="rate", arms=("raters",))
    AnnotationSetup.objects.create(
        study=study, raters_per_conversation=1, conversations_per_rater=2
    )
    for i in range(2):
        RatedConversation.objects.create(
            study=study, source="person", transcript=[{"speaker": "user", "text": f"hi {i}"}]
        )
    call_command("run_bots", study="rate", n=3, concurrency=2, url=server, json=True)
    report = json.loads(capsys.readouterr().out)
    assert report["completed"] == 3 and report["failed"] == 0, report["errors"]
    assert RatingAssignment.objects.filter(status="rated").count() == 6  # 3 bots x 2, k aside
    person, _ = arrive(study, prolific(pid="areal0rater"))
    assert len(give_consent(person, True).rating_assignments.all()) == 2


def test_a_page_that_fails_is_reported_with_its_status_not_as_a_missing_form():
    """On SQLite a compiled read once failed every participant page with a 500, and the bots
    said only "no form on the page"."""
    import httpx

    from studies.rehearsal.bots import BotFailed, csrf_of

    request = httpx.Request("GET", "http://testserver/p/abc/")
    failed = httpx.Response(500, text="<h1>Server Error</h1>", request=request)
    with pytest.raises(BotFailed, match="/p/abc/ answered 500"):
        csrf_of(failed)
    formless = httpx.Response(200, text="<p>no form here</p>", request=request)
    with pytest.raises(BotFailed, match="no form on /p/abc/"):
        csrf_of(formless)
    form = '<input type="hidden" name="csrfmiddlewaretoken" value="tok123">'
    assert csrf_of(httpx.Response(200, text=form, request=request)) == "tok123"
