"""A rater through an annotation study over HTTP (the real views): arrival, consent, each
assigned conversation rated (the study's items and the realism item), a gold conversation as
an attention check, and the completion code; the page never shows where a conversation came
from."""

import pytest
from django.urls import reverse

from studies.models import AnnotationSetup, Participant, RatedConversation, RatingAssignment
from tests.support.studies import GOOD_ANSWERS, make_study, prolific

pytestmark = pytest.mark.django_db

SECRETS = ("arm-with-a-secret-name", "simulator-with-a-secret-name", "SmolLM2")


def annotation_study(n=2, gold=0):
    study = make_study(slug="rate", arms=("raters",))
    AnnotationSetup.objects.create(
        study=study, raters_per_conversation=2, conversations_per_rater=n, gold_per_rater=gold
    )
    origin = make_study(slug="origin", arms=(SECRETS[0],))
    for source, simulator in [("person", ""), ("simulator", SECRETS[1])]:
        RatedConversation.objects.create(
            study=study,
            source=source,
            arm=SECRETS[0],
            simulator=simulator,
            origin_study=origin,
            transcript=[
                {"speaker": "agent", "text": f"Hello from the agent ({source})"},
                {"speaker": "user", "text": "I would like a refund"},
            ],
        )
    return study


def arrive(client, study, pid):
    client.get(reverse("studies:arrive", args=[study.slug]), prolific(pid=pid))
    participant = Participant.objects.get(study=study, prolific_pid=pid)
    page = reverse("studies:participant", args=[participant.token])
    consent = client.post(
        reverse("studies:consent", args=[participant.token]), {"decision": "accept"}
    )
    return participant, page, consent


def rating(position, **extra):
    return {
        "position": position,
        **GOOD_ANSWERS,
        "real_person": "real",
        "realism_confidence": "4",
        **extra,
    }


def test_a_rater_rates_each_conversation_blind_and_gets_the_completion_code(client):
    study = annotation_study()
    participant, page, _ = arrive(client, study, "rater1")
    participant.refresh_from_db()
    assert participant.status == Participant.Status.RATING
    for number in (1, 2):
        html = client.get(page).content.decode()
        assert f"Conversation {number} of 2" in html and "I would like a refund" in html
        assert not [secret for secret in SECRETS if secret in html]
        assert "(person)" in html or "(simulator)" in html  # the words, nothing else
        position = participant.rating_assignments.get(status="assigned", position=number).position
        response = client.post(reverse("studies:rate", args=[participant.token]), rating(position))
        assert response.status_code == 302
    participant.refresh_from_db()
    assert participant.status == Participant.Status.COMPLETED
    assert "DONE123" in client.get(page).content.decode()
    answers = [a.answers for a in participant.rating_assignments.all()]
    assert all(a["helpful"] == 6 and a["real_person"] == "real" for a in answers)
    assert all(a["realism_confidence"] == 4 for a in answers)


def test_missing_answers_are_asked_again_and_nothing_is_stored(client):
    study = annotation_study(n=1)
    participant, page, _ = arrive(client, study, "rater2")
    response = client.post(
        reverse("studies:rate", args=[participant.token]),
        rating(1, real_person="", helpful=""),
    )
    html = response.content.decode()
    assert response.status_code == 400
    assert "Please say whether you think the user was a real person." in html  # open chat
    assert "Please answer this question." in html
    assert not RatingAssignment.objects.filter(participant=participant, status="rated").exists()


def test_a_missed_gold_conversation_fails_the_attention_check(client):
    study = annotation_study(n=1, gold=1)
    RatedConversation.objects.create(
        study=study,
        source="person",
        gold={"helpful": 1},
        transcript=[{"speaker": "agent", "text": "Please answer 1 for helpful here."}],
    )
    participant, page, _ = arrive(client, study, "rater3")
    for position in (1, 2):
        client.post(reverse("studies:rate", args=[participant.token]), rating(position))
    participant.refresh_from_db()
    assert participant.status == Participant.Status.COMPLETED
    assert participant.attention_passed is False  # it said 6 where the gold says 1


def test_a_rater_with_nothing_left_is_told_and_holds_no_place(client):
    study = annotation_study(n=2)
    for pid in ("first", "second"):
        arrive(client, study, pid)  # k = 2: two raters take both conversations' places
    participant, page, consent = arrive(client, study, "third")
    participant.refresh_from_db()
    assert "No conversations left to rate" in consent.content.decode()
    assert participant.status == Participant.Status.UNSTARTED
    assert participant.rating_assignments.count() == 0


def test_staff_preview_the_rating_pages_without_taking_a_place(client):
    from studies.participation.consent import give_consent
    from studies.participation.start import start_preview

    study = annotation_study(n=2)
    preview = give_consent(start_preview(study.arms.get()), True)
    assert preview.status == Participant.Status.RATING
    html = client.get(reverse("studies:participant", args=[preview.token])).content.decode()
    assert "Conversation 1 of 2" in html and "Preview of arm raters" in html
    for pid in ("first", "second"):  # k = 2: both conversations still have both places
        participant, _, _ = arrive(client, study, pid)
        assert participant.rating_assignments.count() == 2


def test_the_studys_instructions_are_shown_and_the_monitor_watches_raters(client, admin_client):
    study = annotation_study(n=1)
    study.instructions = "Rate how natural each conversation reads."
    study.save()
    participant, page, _ = arrive(client, study, "reader")
    assert "Rate how natural each conversation reads." in client.get(page).content.decode()
    monitor = admin_client.get(reverse("admin:studies_study_monitor", args=[study.pk]))
    assert monitor.status_code == 200 and "raters" in monitor.content.decode()


def test_a_rater_whose_conversations_were_released_is_told_not_looped(client):
    study = annotation_study(n=1)
    participant, page, _ = arrive(client, study, "released")
    participant.rating_assignments.update(status=RatingAssignment.Status.RELEASED)
    response = client.get(page)
    assert response.status_code != 302 and "Nothing left to rate" in response.content.decode()


def test_an_annotation_study_in_the_rated_conversations_domain_is_checked_as_a_rating_study(
    client,
):
    """A study rating P4G conversations takes P4G as its domain (its speakers' names): it is
    asked for a pool, not for scenarios or the donation item a P4G chat study needs."""
    from studies.setup import go_live

    study = annotation_study()
    study.domain, study.status, study.target_per_arm = "p4g", "draft", 2
    study.save()
    assert not study.scenarios.exists()
    assert go_live.problems(study) == []
    go_live.set_live(study)
    participant, page, _ = arrive(client, study, "rater-p4g")
    participant.refresh_from_db()
    assert participant.status == Participant.Status.RATING and participant.scenario is None
    html = client.get(page).content.decode()  # the speakers in P4G's words, never a customer
    assert "Persuader:</span> Hello from the agent" in html and "Persuadee:</span> I would" in html
    assert "Was the persuadee a real person?" in html and "ustomer" not in html
    missing = client.post(
        reverse("studies:rate", args=[participant.token]), rating(1, real_person="")
    )
    assert "whether you think the persuadee was a real person" in missing.content.decode()
    chat = make_study(slug="p4g-chat", domain="p4g", status="draft")
    found = " ".join(go_live.problems(chat))  # a P4G chat study is still asked for both
    assert "needs scenarios" in found and "donation" in found
