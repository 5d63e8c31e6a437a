import os
import shutil

import pytest

from agents.models import ModelEndpoint
from studies.models import Arm, Item, Questionnaire, Study
from tests.conftest import IN_CI, need


def make_study(slug="s1", arms=("a", "b"), engine="http://127.0.0.1:9/v1", **fields):
    defaults = dict(
        title="Test study",
        status=Study.Status.LIVE,
        completion_code="DONE123",
        no_consent_code="NOCONS",
        timeout_code="LATE",
        min_exchanges=1,
        max_exchanges=5,
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
    import threading

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
    from studies.participation import flow

    p, _ = flow.arrive(study, prolific(pid=pid))
    if arm is not None:
        Participant.objects.filter(pk=p.pk).update(arm=study.arms.get(name=arm))
        p.refresh_from_db()
    flow.give_consent(p, True)
    flow.store_user_message(p, f"m-{pid}", text)
    flow.end_chat(p)
    assert flow.submit_questionnaire(p, answers) == {}
    p.refresh_from_db()
    return p


@pytest.fixture
def study(db):
    return make_study()


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


@pytest.fixture
def browser():
    need(os.path.exists(CHROMIUM) or IN_CI, "needs Debian's chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield browser
        browser.close()
