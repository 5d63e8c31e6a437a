"""The target per arm is a cap: a full study turns arrivals away without a place, even when
they arrive at once; it can close itself; the studies list shows progress."""

from collections import Counter

import pytest
from django.urls import reverse

from studies.lib.flow_errors import StudyFull
from studies.models import Participant, Study
from studies.participation import arrive as arrival
from studies.participation.assign import is_full
from studies.participation.chat_turn import end_chat, store_user_message
from studies.participation.consent import give_consent
from studies.participation.questionnaire import submit_questionnaire
from studies.participation.start import start_preview
from studies.rehearsal import bots
from tests.support.studies import GOOD_ANSWERS, at_once, make_study, prolific

pytestmark = pytest.mark.django_db


def complete(participant):
    give_consent(participant, True)
    store_user_message(participant, f"m{participant.pk}", "hi")
    end_chat(participant)
    assert submit_questionnaire(participant, GOOD_ANSWERS) == {}


def test_a_full_study_turns_arrivals_away_without_a_place(client):
    study = make_study(target_per_arm=2, arms=("a", "b", "c"))
    for i in range(6):
        arrival.arrive(study, prolific(pid=f"p{i}", session_id=f"s{i}"))
    assert is_full(study)
    with pytest.raises(StudyFull):
        arrival.arrive(study, prolific(pid="late"))
    response = client.get(
        reverse("studies:arrive", args=[study.slug]), prolific(pid="late2", session_id="z")
    )
    assert response.status_code == 409 and b"full" in response.content
    assert Participant.objects.count() == 6
    # Someone already in comes back: resumed, not turned away.
    again, created = arrival.arrive(study, prolific(pid="p0", session_id="s0"))
    assert not created and again.prolific_pid == "p0"


def test_only_active_and_completed_people_fill_a_place():
    study = make_study(target_per_arm=1)
    first, _ = arrival.arrive(study, prolific(pid="first"))
    complete(first)
    gone, _ = arrival.arrive(study, prolific(pid="gone"))
    Participant.objects.filter(pk=gone.pk).update(status=Participant.Status.TIMED_OUT)
    declined, _ = arrival.arrive(study, prolific(pid="declined"))
    give_consent(declined, False)
    # Bots and previews take no place among people.
    arrival.arrive(study, prolific(pid=bots.bot_pid(study)))
    start_preview(study.arms.get(name="b"))
    last, _ = arrival.arrive(study, prolific(pid="last"))
    assert last.arm.name == "b"
    with pytest.raises(StudyFull):
        arrival.arrive(study, prolific(pid="one-too-many"))


def test_a_full_arm_sends_arrivals_to_the_arm_with_room():
    study = make_study(target_per_arm=2)
    for i in range(2):
        p, _ = arrival.arrive(study, prolific(pid=f"a{i}"))
        Participant.objects.filter(pk=p.pk).update(arm=study.arms.get(name="a"))
    arms = [arrival.arrive(study, prolific(pid=f"n{i}"))[0].arm.name for i in range(2)]
    assert arms == ["b", "b"]


@pytest.mark.django_db(transaction=True)
def test_concurrent_arrivals_never_pass_the_cap(transactional_db):
    study = make_study(arms=("a", "b", "c"), target_per_arm=3)
    full = []

    def arrive(i):
        try:
            arrival.arrive(study, prolific(pid=f"c{i}", session_id=f"s{i}"))
        except StudyFull:
            full.append(i)

    errors = at_once(arrive, 20)
    assert not errors
    counts = Counter(Participant.objects.filter(study=study).values_list("arm__name", flat=True))
    assert counts == {"a": 3, "b": 3, "c": 3}
    assert len(full) == 11


def test_close_when_full_closes_after_the_last_completion(django_capture_on_commit_callbacks):
    study = make_study(target_per_arm=1, close_when_full=True)
    a, _ = arrival.arrive(study, prolific(pid="pa"))
    b, _ = arrival.arrive(study, prolific(pid="pb"))
    with django_capture_on_commit_callbacks(execute=True):
        complete(a)
    assert Study.objects.get(pk=study.pk).status == Study.Status.LIVE
    with django_capture_on_commit_callbacks(execute=True):
        complete(b)
    assert Study.objects.get(pk=study.pk).status == Study.Status.CLOSED


def test_without_the_setting_a_full_study_stays_live(django_capture_on_commit_callbacks):
    study = make_study(target_per_arm=1)
    for pid in ("pa", "pb"):
        with django_capture_on_commit_callbacks(execute=True):
            complete(arrival.arrive(study, prolific(pid=pid))[0])
    assert Study.objects.get(pk=study.pk).status == Study.Status.LIVE


def test_the_studies_list_shows_progress_toward_the_targets(admin_client):
    study = make_study(target_per_arm=3, arms=("a", "b", "c"))
    make_study(slug="other", target_per_arm=5)
    complete(arrival.arrive(study, prolific(pid="pa"))[0])
    complete(arrival.arrive(study, prolific(pid="pb"))[0])
    arrival.arrive(study, prolific(pid="pc"))  # holding a place, not completed
    start_preview(study.arms.first())
    page = admin_client.get(reverse("admin:studies_study_changelist")).content.decode()
    assert "2/9" in page and "0/10" in page


def test_one_who_could_not_start_finds_the_study_full_on_return(client):
    study = make_study(target_per_arm=1)
    waiting = Participant.objects.create(
        study=study,
        arm=study.arms.first(),
        prolific_pid="waiting",
        prolific_study_id="s",
        prolific_session_id="x",
        status=Participant.Status.UNSTARTED,
    )
    for pid in ("pa", "pb"):
        arrival.arrive(study, prolific(pid=pid))
    page = client.get(reverse("studies:participant", args=[waiting.token]))
    assert page.status_code == 409 and b"full" in page.content
    assert Participant.objects.get(pk=waiting.pk).status == Participant.Status.UNSTARTED
    Participant.objects.filter(prolific_pid="pb").update(status=Participant.Status.TIMED_OUT)
    page = client.get(reverse("studies:participant", args=[waiting.token]))
    assert page.status_code == 200
    waiting.refresh_from_db()
    assert waiting.status == Participant.Status.CONSENT and waiting.arm.name == "b"
