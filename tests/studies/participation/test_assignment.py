"""Assignment on arrival: the least-filled arm, deterministic ties, exact under concurrency."""

from collections import Counter

import pytest

from studies.lib.flow_errors import FlowError
from studies.models import Participant, Scenario
from studies.participation import arrive as arrival
from studies.participation.consent import give_consent
from tests.support.studies import at_once, make_study, prolific


@pytest.mark.django_db
def test_least_filled_with_deterministic_tie_break():
    study = make_study(arms=("a", "b", "c"))
    arms = [arrival.arrive(study, prolific(pid=f"p{i}"))[0].arm.name for i in range(7)]
    assert arms == ["a", "b", "c", "a", "b", "c", "a"]


@pytest.mark.django_db
def test_only_active_and_completed_participants_hold_a_place():
    study = make_study(arms=("a", "b"))
    first, _ = arrival.arrive(study, prolific(pid="p1"))
    second, _ = arrival.arrive(study, prolific(pid="p2"))
    assert (first.arm.name, second.arm.name) == ("a", "b")
    give_consent(first, accepted=False)  # a's place is free again
    assert arrival.arrive(study, prolific(pid="p3"))[0].arm.name == "a"
    Participant.objects.filter(pk=second.pk).update(status="timed_out")
    assert arrival.arrive(study, prolific(pid="p4"))[0].arm.name == "b"


@pytest.mark.django_db
def test_inactive_arms_get_nobody_and_no_arm_is_a_clear_error():
    study = make_study(arms=("a", "b"))
    study.arms.filter(name="a").update(active=False)
    assert {arrival.arrive(study, prolific(pid=f"p{i}"))[0].arm.name for i in range(3)} == {"b"}
    study.arms.update(active=False)
    with pytest.raises(FlowError, match="no active arm"):
        arrival.arrive(study, prolific(pid="late"))


@pytest.mark.django_db
def test_scenarios_used_equally_within_each_arm():
    study = make_study(arms=("a", "b"))
    for i in range(3):
        Scenario.objects.create(study=study, key=f"t{i}")
    people = [arrival.arrive(study, prolific(pid=f"p{i}"))[0] for i in range(12)]
    per_arm = Counter((p.arm.name, p.scenario.key) for p in people)
    assert set(per_arm.values()) == {2}  # 6 per arm spread over 3 scenarios


@pytest.mark.django_db(transaction=True)
def test_concurrent_arrivals_balance_on_each_database(transactional_db):
    study = make_study(arms=("a", "b", "c"))

    def arrive(i):
        arrival.arrive(study, prolific(pid=f"concurrent{i}"))
        # Also the same person twice at once: one participant, not two.
        arrival.arrive(study, prolific(pid="twice"))

    errors = at_once(arrive, 24)
    assert not errors
    counts = Counter(Participant.objects.filter(study=study).values_list("arm__name", flat=True))
    assert sum(counts.values()) == 25
    assert max(counts.values()) - min(counts.values()) <= 1, counts
