"""Annotation studies' assignment (studies/annotation/assignment.py): k raters per
conversation and never more, n per rater balanced over sources and arms, gold mixed in, leavers'
places freed, never a conversation from a study the rater took part in; race-safe on
PostgreSQL under concurrent arrivals."""

import random
from collections import Counter

import pytest

from studies.annotation.assignment import NoConversations, assign, holding, release
from studies.models import AnnotationSetup, Participant, RatedConversation, RatingAssignment
from tests.support.studies import at_once, make_study

pytestmark = pytest.mark.django_db

STRATA = [("person", "base"), ("person", "trained"), ("simulator", "vs")]


def annotation_study(k=2, n=3, gold=0, per_stratum=2, slug="rate"):
    study = make_study(slug=slug, arms=("raters",))
    AnnotationSetup.objects.create(
        study=study, raters_per_conversation=k, conversations_per_rater=n, gold_per_rater=gold
    )
    for source, arm in STRATA:
        for i in range(per_stratum):
            RatedConversation.objects.create(
                study=study,
                source=source,
                arm=arm if source == "person" else "",
                simulator=arm if source == "simulator" else "",
                transcript=[{"speaker": "user", "text": f"{arm} {i}"}],
            )
    return study


def rater(study, pid):
    return Participant.objects.create(
        study=study,
        arm=study.arms.first(),
        prolific_pid=pid,
        prolific_study_id="S",
        prolific_session_id=f"sess-{pid}",
    )


def held_per_conversation(study):
    held = Counter(
        RatingAssignment.objects.filter(holding(), conversation__study=study).values_list(
            "conversation_id", flat=True
        )
    )
    return [
        held[c]
        for c in study.rated_conversations.filter(gold__isnull=True).values_list("pk", flat=True)
    ]


def test_each_conversation_reaches_k_raters_and_no_more_and_each_rater_is_balanced():
    study = annotation_study(k=2, n=3)  # 6 conversations x 2 places = 12 = 4 raters x 3
    rng = random.Random(1)
    for i in range(4):
        mine = assign(rater(study, f"r{i}"), rng)
        strata = Counter(a.conversation.stratum for a in mine)
        assert len(mine) == 3 and len({a.conversation_id for a in mine}) == 3
        assert max(strata.values()) == 1  # one from each of the three strata
    assert held_per_conversation(study) == [2] * 6
    with pytest.raises(NoConversations):
        assign(rater(study, "late"), rng)


def test_a_rater_who_comes_back_keeps_their_conversations_in_their_order():
    study = annotation_study()
    first = rater(study, "back")
    before = [(a.position, a.conversation_id) for a in assign(first)]
    again = [(a.position, a.conversation_id) for a in assign(first)]
    assert again == before and [p for p, _ in before] == [1, 2, 3]


def test_gold_conversations_are_mixed_in_and_hold_no_place():
    study = annotation_study(k=1, n=3, gold=1)
    gold = RatedConversation.objects.create(
        study=study, source="person", transcript=[], gold={"helpful": 1}
    )
    for i in range(2):
        mine = assign(rater(study, f"g{i}"), random.Random(i))
        assert len(mine) == 4 and sum(a.conversation_id == gold.pk for a in mine) == 1
    assert held_per_conversation(study) == [1] * 6


def test_a_rater_who_leaves_frees_what_they_had_not_rated():
    study = annotation_study(k=1, n=6)
    leaver = rater(study, "leaver")
    mine = assign(leaver)
    RatingAssignment.objects.filter(pk=mine[0].pk).update(status=RatingAssignment.Status.RATED)
    with pytest.raises(NoConversations):
        assign(rater(study, "waiting"))
    assert release(Participant.objects.filter(pk=leaver.pk)) == 5
    after = assign(rater(study, "next"))
    assert len(after) == 5 and mine[0].conversation_id not in {a.conversation_id for a in after}


def test_never_a_conversation_from_a_study_the_rater_took_part_in():
    study = annotation_study(k=5, n=6)
    origin = make_study(slug="origin")
    RatedConversation.objects.filter(study=study, arm="base").update(origin_study=origin)
    rater(origin, "insider")  # took part in the origin study under the same Prolific id
    mine = assign(rater(study, "insider"))
    assert len(mine) == 4 and all(a.conversation.origin_study_id is None for a in mine)
    assert len(assign(rater(study, "outsider"))) == 6


@pytest.mark.django_db(transaction=True)
def test_concurrent_arrivals_never_over_rate_a_conversation(transactional_db):
    study = annotation_study(k=2, n=3)  # 12 places: four raters' worth
    raters = [rater(study, f"c{i}") for i in range(10)]
    served = []

    def arrive(i):
        served.append(len(assign(Participant.objects.get(pk=raters[i].pk))))

    errors = at_once(arrive, 10)
    assert sorted(served) == [3, 3, 3, 3]
    assert len(errors) == 6 and all(isinstance(e, NoConversations) for e in errors)
    assert held_per_conversation(study) == [2] * 6


def test_a_rater_who_times_out_or_returns_frees_their_places_at_once():
    study = annotation_study(k=1, n=6)
    gone = rater(study, "gone")
    assign(gone)
    with pytest.raises(NoConversations):
        assign(rater(study, "blocked"))
    Participant.objects.filter(pk=gone.pk).update(status=Participant.Status.TIMED_OUT)
    assert len(assign(rater(study, "in-time"))) == 6


def test_previews_and_bots_never_take_a_persons_place():
    study = annotation_study(k=1, n=6)
    for pid, flag in [("staff", "is_preview"), ("bot", "is_bot")]:
        walker = rater(study, pid)
        Participant.objects.filter(pk=walker.pk).update(**{flag: True})
        assert len(assign(Participant.objects.get(pk=walker.pk))) == 6
    assert len(assign(rater(study, "person"))) == 6
