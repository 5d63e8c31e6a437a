"""A researcher in a real browser: creates a study in the admin, rehearses it with bots run by a
real Celery worker through the real server, and reads what the bots left."""

import subprocess
import sys
import time

import pytest

from agents.models import ModelEndpoint
from studies.models import Item, Participant, Questionnaire, Study
from tests.support.processes import REPO, child_env
from tests.support.scripted_server import ScriptedServer

pytestmark = pytest.mark.browser


@pytest.fixture
def isolated(monkeypatch, tmp_path, transactional_db):
    """The children's own data folder and broker, so no other test's worker takes the task."""
    import os

    # No shared key: the web server and the worker each make their own development key, as in
    # `make demo`, and still agree on who is a bot (the study's key is in the database).
    monkeypatch.delenv("DJANGO_SECRET_KEY", raising=False)
    monkeypatch.setenv("PARLEY_DATA_DIR", str(tmp_path))
    if os.environ.get("REDIS_URL"):
        monkeypatch.setenv("CELERY_BROKER_URL", os.environ["REDIS_URL"].rsplit("/", 1)[0] + "/7")
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright's sync API keeps a loop
    return tmp_path


@pytest.fixture
def worker(isolated, request):
    """A Celery worker whose bots go to this test's web server."""
    from parley.celery import worker_args

    url = request.getfixturevalue("web_server")
    log = isolated / "worker.log"
    process = subprocess.Popen(
        [
            sys.executable,
            *worker_args(
                "--pool",
                "solo",
                "--without-mingle",
                "--without-gossip",
                "--loglevel",
                "INFO",
                "-n",
                f"bots-{time.time_ns()}@%h",
            ),
        ],
        cwd=REPO,
        env=child_env(PARLEY_PUBLIC_URL=url),
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 180  # a busy machine starts a worker slowly
        while b"ready." not in log.read_bytes():
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.3)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=20)


def test_researcher_creates_a_study_rehearses_it_with_bots_and_reads_them(
    isolated, worker, browser
):
    from django.contrib.auth import get_user_model

    get_user_model().objects.create_superuser("researcher", "r@example.org", "pw")
    web = worker
    with ScriptedServer([{"content": "Glad to help."}] * 20) as engine:
        endpoint = ModelEndpoint.of_url(engine.url)  # registered; the arms choose it by name
        page = browser.new_page()
        page.goto(f"{web}/admin/login/?next=/admin/")
        page.fill("#id_username", "researcher")
        page.fill("#id_password", "pw")
        page.click("input[type=submit]")
        page.wait_for_selector("#user-tools")

        # A study as data: its fields, then two arms inline.
        page.goto(f"{web}/admin/studies/study/add/")
        page.fill("#id_title", "Rehearsal")  # the admin fills the slug from the title
        # codes inline, each of a Prolific code type and given at one ending
        page.click("#completion_codes-group .add-row a")
        page.select_option("#id_completion_codes-0-code_type", "COMPLETED")
        page.fill("#id_completion_codes-0-code", "REHEARSED")
        page.select_option("#id_completion_codes-0-ending", "completed")
        page.click("#completion_codes-group .add-row a")  # the way back for those who decline
        page.select_option("#id_completion_codes-1-code_type", "OTHER")
        page.fill("#id_completion_codes-1-code", "OTHERWAY")
        page.select_option("#id_completion_codes-1-ending", "problem")
        page.fill("#id_min_exchanges", "1")
        page.fill("#id_max_exchanges", "3")
        page.fill("#id_retention_days", "90")  # going live asks for it (issue 39)
        for i, name in enumerate(["warm", "brief"]):
            page.click("#arms-group .add-row a")
            page.fill(f"#id_arms-{i}-name", name)
            page.fill(f"#id_arms-{i}-order", str(i))
            page.select_option(f"#id_arms-{i}-endpoint", label=endpoint.name)
            page.fill(f"#id_arms-{i}-model_name", "SmolLM2-135M-Instruct")
        page.click("input[name=_save]")
        page.wait_for_selector(".messagelist .success, .errornote")
        study = Study.objects.filter(slug="rehearsal").first()
        assert study is not None, page.inner_text("#content")[:3000]
        assert list(study.arms.values_list("name", flat=True)) == ["warm", "brief"]

        # Live only after the go-live checks: the questionnaire is missing, then added.
        page.goto(f"{web}/admin/studies/study/")
        page.check(f"input[name=_selected_action][value='{study.pk}']")
        page.select_option("select[name=action]", "go_live")
        page.click("button[name=index]")
        assert "There is no questionnaire" in page.inner_text(".messagelist")
        questionnaire = Questionnaire.objects.create(study=study)
        Item.objects.create(questionnaire=questionnaire, key="helpful", prompt="Helpful?")
        page.check(f"input[name=_selected_action][value='{study.pk}']")
        page.select_option("select[name=action]", "go_live")
        page.click("button[name=index]")
        assert "is live" in page.inner_text(".messagelist")

        # Rehearse: the action queues bots on the worker, which drives them through the server.
        page.goto(f"{web}/admin/studies/study/")
        page.check(f"input[name=_selected_action][value='{study.pk}']")
        page.select_option("select[name=action]", "run_bots")
        page.click("button[name=index]")
        assert "bots queued" in page.inner_text(".messagelist")
        deadline = time.monotonic() + 120
        done = Participant.objects.filter(study=study, status=Participant.Status.COMPLETED)
        while done.count() < 4 and time.monotonic() < deadline:
            time.sleep(1)
        assert done.count() == 4, (isolated / "worker.log").read_text()[-3000:]
        assert all(p.is_bot for p in done)

        # Read them: the participants list, then one bot's transcript.
        page.goto(f"{web}/admin/studies/participant/?study__id__exact={study.pk}")
        listed = page.inner_text("#result_list")
        assert listed.count("Completed") == 4
        bot = done.first()
        page.goto(f"{web}/admin/studies/participant/{bot.pk}/transcript/")
        transcript = page.inner_text("#content")
        assert "Glad to help." in transcript and bot.prolific_pid in transcript
