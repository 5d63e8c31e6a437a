"""An annotation study's pool (studies/annotation/pool.py): people's and simulated
conversations, as raters will read them (words only, redacted, no source), drawn by arm,
success, length and date, each added once."""

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from agents.models import Checkpoint
from studies.annotation.pool import Draw, add_people, add_simulated, add_training_samples
from studies.models import AnnotationSetup, RatedConversation, Scenario, SimulatorEvaluation
from tests.support.studies import finish, make_study

pytestmark = pytest.mark.django_db

SAID = "Write to ada.lovelace@example.org or call +44 20 7946 0958, thanks"


def pool_study():
    study = make_study(slug="pool", arms=("raters",))
    AnnotationSetup.objects.create(study=study)
    return study


def test_people_are_drawn_as_words_only_redacted_and_once():
    origin = make_study(slug="origin", arms=("base-arm", "trained-arm"))
    for i, arm in enumerate(["base-arm", "base-arm", "trained-arm"]):
        finish(origin, f"p{i}", arm=arm, text=SAID)
    pool = pool_study()
    assert add_people(pool, origin) == 3
    assert add_people(pool, origin) == 0  # each conversation once
    for rated in RatedConversation.objects.filter(study=pool):
        assert rated.source == "person" and rated.origin_study == origin
        assert all(set(turn) == {"speaker", "text"} for turn in rated.transcript)
        said = " ".join(t["text"] for t in rated.transcript if t["speaker"] == "user")
        assert "ada.lovelace@example.org" not in said and "7946" not in said
        assert rated.arm in {"base-arm", "trained-arm"} and "arm" not in str(rated.transcript)


def test_a_draw_keeps_only_the_arms_lengths_and_dates_asked_for():
    origin = make_study(slug="origin", arms=("a", "b"))
    for i, arm in enumerate(["a", "b", "b"]):
        finish(origin, f"d{i}", arm=arm)
    pool = pool_study()
    assert add_people(pool, origin, Draw(arms=("b",), min_user_turns=2)) == 0  # one turn each
    tomorrow = timezone.now() + timedelta(days=1)
    assert add_people(pool, origin, Draw(arms=("b",), since=tomorrow)) == 0
    assert add_people(pool, origin, Draw(arms=("b",))) == 2
    assert set(pool.rated_conversations.values_list("arm", flat=True)) == {"b"}


def test_simulated_conversations_keep_their_simulator_out_of_the_transcript():
    origin = make_study(slug="origin", arms=("a",))
    scenario = Scenario.objects.create(study=origin, key="t1", domain="retail", payload={})
    checkpoint = Checkpoint.objects.create(name="ckpt", path="/nowhere/ckpt")
    conversation = [
        {"role": "assistant", "content": "How can I help?"},
        {"role": "user", "content": "Cancel my order please"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1"}]},
        {"role": "tool", "content": '{"status": "cancelled"}'},
        {"role": "assistant", "content": "Done."},
    ]
    for i, simulator in enumerate(["vs-user", "vs-user", "plain-user"]):
        SimulatorEvaluation.objects.create(
            arm=origin.arms.get(),
            checkpoint=checkpoint,
            simulator=simulator,
            scenario=scenario,
            sample=i,
            success=i == 0,
            reward=1.0 if i == 0 else 0.0,
            conversation=conversation,
        )
    pool = pool_study()
    assert add_simulated(pool, origin, Draw(success=True), simulators=("vs-user",)) == 1
    assert add_simulated(pool, origin) == 2  # the rest, and nothing twice
    rated = pool.rated_conversations.first()
    assert rated.source == "simulator" and rated.simulator == "vs-user"
    assert rated.transcript == [
        {"speaker": "agent", "text": "How can I help?"},
        {"speaker": "user", "text": "Cancel my order please"},
        {"speaker": "agent", "text": "Done."},
    ]


def test_a_training_runs_samples_join_the_pool_as_its_simulators_once(tmp_path):
    samples = tmp_path / "samples.jsonl"
    rows = [
        {
            "step": 1,
            "task": "t1",
            "reward": 1.0,
            "conversation": [
                {"role": "assistant", "content": "How can I help?"},
                {"role": "user", "content": "My e-mail is kim@example.com"},
            ],
        },
        {
            "step": 2,
            "task": "t1",
            "reward": 0.0,
            "conversation": [{"role": "user", "content": "Hello"}],
        },
    ]
    samples.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    pool = pool_study()
    assert add_training_samples(pool, samples, "cotrain-sim", Draw(success=True)) == 1
    assert add_training_samples(pool, samples, "cotrain-sim") == 1  # the other; none twice
    first = pool.rated_conversations.order_by("pk").first()
    assert first.source == "simulator" and first.simulator == "cotrain-sim"
    assert "kim@example.com" not in str(first.transcript)
