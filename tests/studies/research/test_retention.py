"""A study's retention period (issue 39 point 5): going live asks for it, the study page says
when its data is purged, and the periodic task purges identifying data past it while the
analysis still runs, to the same numbers, on pseudonymous ids."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import User
from django.contrib.contenttypes.models import ContentType
from django.urls import reverse
from django.utils import timezone

from studies import tasks
from studies.models import (
    AnalysisRun,
    Bonus,
    BonusPayment,
    Item,
    Participant,
    ProlificEvent,
    Response,
    Study,
    StudyError,
)
from studies.participation.arrive import arrive
from studies.participation.consent import give_consent
from studies.research import analysis_runs, retention
from studies.setup import go_live
from tests.support.studies import GOOD_ANSWERS, finish, make_study, prolific

SECRET_TEXT = "My name is Ada Example and I live at 1 Sample Street"


def aged(study, days):
    """Every participant of the study arrived `days` ago."""
    Participant.objects.filter(study=study).update(created_at=timezone.now() - timedelta(days=days))


def identifying_study(**fields):
    study = make_study(retention_days=30, **fields)
    Item.objects.filter(questionnaire__study=study, key="comment").update(identifying=True)
    Item.objects.create(
        questionnaire=study.questionnaire,
        order=5,
        key="remarks",
        prompt="More?",
        kind="text",
        required=False,
    )
    return study


def filled(study):
    answers = {**GOOD_ANSWERS, "comment": SECRET_TEXT, "remarks": "not identifying"}
    people = []
    for i, (arm, helpful) in enumerate([("a", 6), ("a", 5), ("a", 7), ("b", 2), ("b", 3)]):
        people.append(
            finish(
                study,
                f"5f0c0ffee0ddba11c0ffe{i:03d}",
                {**answers, "helpful": str(helpful)},
                arm=arm,
            )
        )
    for i, person in enumerate(people):  # each their own Prolific submission
        Participant.objects.filter(pk=person.pk).update(prolific_session_id=f"sess-{i}")
        person.prolific_session_id = f"sess-{i}"
    return people


@pytest.mark.django_db
def test_going_live_asks_for_the_retention_period(admin_client):
    study = make_study(status=Study.Status.DRAFT, retention_days=None)
    with pytest.raises(go_live.NotReady) as refused:
        go_live.check_go_live(study)
    assert any("retention period is missing" in p for p in refused.value.problems)
    page = admin_client.get(reverse("admin:studies_study_change", args=[study.pk]))
    assert "cannot go live without one" in page.content.decode()
    study.retention_days = 0  # a bound, said where it is typed
    with pytest.raises(Exception, match="greater than or equal to 1"):
        study.full_clean()


@pytest.mark.django_db
def test_the_study_page_says_when_its_data_is_purged(admin_client):
    study = identifying_study()
    finish(study, "p1")
    Participant.objects.update(created_at=timezone.now() - timedelta(days=10))
    page = admin_client.get(reverse("admin:studies_study_change", args=[study.pk])).content
    due = (timezone.now() + timedelta(days=20)).strftime("%Y-%m-%d")
    assert f"Next purge: {due}" in page.decode()
    assert "30 day(s) after each participant" in page.decode()


@pytest.mark.django_db
def test_the_purge_keeps_the_analysis_and_removes_what_identifies():
    study = identifying_study(target_per_arm=50)
    people = filled(study)
    pids = [p.prolific_pid for p in people]
    tokens = [str(p.token) for p in people]
    ProlificEvent.objects.create(
        event_id="ev1",
        event_type="submission.status.change",
        resource_id="sess-0",
        payload={"participant_id": pids[0], "resource_id": "sess-0"},
        result=f"{pids[0]}: APPROVED",
    )
    StudyError.objects.create(
        study=study, participant=people[0], title="Trouble", detail=f"for {pids[0]}"
    )
    BonusPayment.objects.create(
        study=study,
        source="bonus.csv",
        state=BonusPayment.State.FAILED,
        refused_lines=[[pids[1], "0.50"], ["someone-else", "0.50"]],
    )
    kind = ContentType.objects.get_for_model(Participant)
    staff = User.objects.create(username="staff", is_staff=True)
    LogEntry.objects.create(
        user=staff,
        content_type=kind,
        object_id=str(people[0].pk),
        object_repr=pids[0],
        action_flag=CHANGE,
    )
    # One still chatting: on their way, never purged under them.
    chatting, _ = arrive(study, prolific(pid="still-here", session_id="s-here"))
    give_consent(chatting, True)
    run = AnalysisRun.objects.create(study=study)
    analysis_runs.compute(run)
    run.refresh_from_db()
    before = run.results["comparisons"]
    assert pids[0] in run.inputs["csv"]
    aged(study, 31)

    assert retention.purge_due() == {study.slug: 5}
    for person in people:
        person.refresh_from_db()
        assert person.purged_at is not None
        assert person.prolific_pid.startswith("anon-") and person.prolific_pid not in pids
        assert str(person.token) not in tokens
        assert person.prolific_session_id.startswith("anon-")
    chatting.refresh_from_db()
    assert chatting.prolific_pid == "still-here" and chatting.purged_at is None
    texts = set(Response.objects.filter(item__key="comment").values_list("value_text", flat=True))
    assert texts == {""}
    assert set(
        Response.objects.filter(item__key="remarks").values_list("value_text", flat=True)
    ) == {"not identifying"}
    assert LogEntry.objects.get().object_repr == people[0].prolific_pid
    event = ProlificEvent.objects.get()
    assert pids[0] not in str(event.payload) + event.result and "sess-0" not in str(event.payload)
    assert event.payload["participant_id"] == people[0].prolific_pid
    assert event.resource_id == people[0].prolific_session_id
    assert StudyError.objects.get().detail == f"for {people[0].prolific_pid}"
    refused = BonusPayment.objects.get(state=BonusPayment.State.FAILED).refused_lines
    assert refused == [[people[1].prolific_pid, "0.50"], ["someone-else", "0.50"]]

    run.refresh_from_db()
    assert not [pid for pid in pids if pid in run.inputs["csv"]]
    assert people[0].prolific_pid in run.inputs["csv"]
    again = AnalysisRun.objects.create(study=study)
    analysis_runs.compute(again)
    again.refresh_from_db()
    assert again.results["comparisons"] == before  # the same numbers on pseudonymous ids
    assert again.inputs["csv"] == run.inputs["csv"]
    # A second sweep finds nothing more to do.
    assert retention.purge_due() == {}


@pytest.mark.django_db
def test_nobody_is_purged_before_the_period_or_while_prolific_is_owed():
    study = identifying_study()
    first, second = filled(study)[:2]
    aged(study, 29)
    assert retention.purge_due() == {}
    aged(study, 31)
    payment = BonusPayment.objects.create(study=study, source="test")
    Bonus.objects.create(payment=payment, study=study, participant=first, amount="1.00")
    assert retention.purge_due() == {study.slug: 4}
    first.refresh_from_db()
    assert first.purged_at is None and not first.prolific_pid.startswith("anon-")
    assert "1 held back" in retention.schedule(study).describe()
    BonusPayment.objects.filter(pk=payment.pk).update(state=BonusPayment.State.PAID)
    assert retention.purge_due() == {study.slug: 1}
    first.refresh_from_db()
    # The paid bonus's record keeps its Prolific submission id; the PID goes.
    assert first.prolific_session_id == "sess-0" and first.prolific_pid.startswith("anon-")


def test_beat_schedules_the_purge():
    entry = settings.CELERY_BEAT_SCHEDULE["purge-expired-participant-data"]
    assert entry["task"] == tasks.purge_expired_data.name


@pytest.mark.django_db(transaction=True)
def test_the_periodic_task_purges_on_a_real_worker(celery_worker):
    study = identifying_study()
    person = finish(study, "5f0c0ffee0ddba11c0ffe777", {**GOOD_ANSWERS, "comment": SECRET_TEXT})
    aged(study, 31)
    result = tasks.purge_expired_data.delay()
    assert result.get(timeout=60) == {study.slug: 1}
    person.refresh_from_db()
    assert person.prolific_pid.startswith("anon-") and person.purged_at
    assert not Response.objects.filter(value_text=SECRET_TEXT).exists()
