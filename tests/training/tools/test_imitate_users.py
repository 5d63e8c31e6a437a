"""`manage.py imitate_users`: a finished study's user turns -> a registered simulator checkpoint
(real PostgreSQL; the tiny model stands in for the base)."""

import json

import pytest
from django.core.management import CommandError, call_command

from agents.domains import get_domain
from agents.models import Checkpoint, adapters_dir
from agents.serving.adapters import find_adapters
from studies.models import Conversation, Message, Participant, Scenario
from studies.research.imitation_data import (
    finished_conversations,
    heldout_table,
    humanlike_simulators,
)
from tests.support.studies import make_study
from training.config import parse_config

pytestmark = pytest.mark.django_db

KEPT = ["Hi, who are you?", "I might give a little. Is it safe? Mail me: jo@example.org"]


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("PARLEY_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"


def seeded_study():
    """A P4G study with one participant whose turns count and five whose turns must not."""
    study = make_study(slug="p4g-real", domain="p4g", exclude_failed_attention=True)
    arm = study.arms.first()
    task = get_domain("p4g").scenarios("train")[0]
    scenario = Scenario.objects.create(study=study, key=task.id, domain="p4g", payload=task.payload)
    people = [
        ("KEPT-PID", {}, KEPT),
        ("FAILED-ATTN", {"attention_passed": False}, ["attention failed text"]),
        ("STILL-CHATTING", {"status": Participant.Status.CHAT}, ["unfinished text"]),
        ("RETURNED", {"partial_data": True}, ["returned text"]),
        ("BOT-PID", {"is_bot": True}, ["bot text"]),
        ("PREVIEW", {"is_preview": True}, ["preview text"]),
    ]
    for pid, fields, turns in people:
        p = Participant.objects.create(
            study=study,
            arm=arm,
            scenario=scenario,
            prolific_pid=pid,
            prolific_study_id="S",
            prolific_session_id=f"SESSION-{pid}",
            **{"status": Participant.Status.COMPLETED, "attention_passed": True, **fields},
        )
        conv = Conversation.objects.create(participant=p)
        seq = 0
        for text in turns:
            Message.objects.create(conversation=conv, seq=seq, role="user", content=text)
            Message.objects.create(
                conversation=conv, seq=seq + 1, role="assistant", content="Would you donate?"
            )
            seq += 2
    return study


def test_the_study_s_finished_user_turns_become_a_registered_simulator(
    tiny_model, data_dir, capsys
):
    study = seeded_study()
    call_command(
        "imitate_users",
        "--study",
        study.slug,
        "--base-model",
        str(tiny_model),
        "--epochs",
        "1",
        "--json",
    )
    manifest = json.loads(capsys.readouterr().out)
    assert manifest["name"] == "p4g-real-humanlike" and manifest["kind"] == "simulator"
    assert manifest["source"]["study"] == "p4g-real"
    assert manifest["source"]["conversations"] == 1  # only the completed, included person
    assert manifest["source"]["user_turns"] == len(KEPT)
    assert manifest["source"]["redacted"] == {"email": 1}  # the participant's own address

    (exported,) = finished_conversations(study)
    said = [m["content"] for m in exported["messages"] if m["role"] == "user"]
    assert said == [KEPT[0], KEPT[1].replace("jo@example.org", "[email]")]

    checkpoint = Checkpoint.objects.get(name="p4g-real-humanlike")
    folder = data_dir / "simulators" / "p4g-real-humanlike"
    assert checkpoint.path == str(folder.resolve()) and checkpoint.regime == "imitation"
    assert (adapters_dir() / checkpoint.name).resolve() == folder.resolve()
    # the embedded engine (--adapters <data dir>/checkpoints) serves it under its name
    assert find_adapters(adapters_dir())[checkpoint.name].path.resolve() == folder.resolve()
    stored = " ".join(p.read_text(errors="ignore") for p in folder.iterdir())
    for secret in ("PID", "SESSION", str(study.participants.first().token)):
        assert secret not in stored  # no participant identifiers leave with the simulator

    # a run's held-out panel names it; the simulator it trains against stays the base
    config = parse_config(
        {
            "name": "r",
            "domain": "p4g",
            "base_model": str(tiny_model),
            "heldout": [{"name": "human-like", "adapter": checkpoint.name}],
        }
    )
    assert config.heldout[0].adapter_path().resolve() == folder.resolve()
    # what the sim-to-real report picks up as one more column
    assert list(humanlike_simulators(study)) == [checkpoint]
    assert not humanlike_simulators(make_study(slug="other", domain="p4g")).exists()
    table = heldout_table(checkpoint)
    spec = parse_config({"name": "r", "domain": "p4g", "heldout": [table]}).heldout[0]
    assert spec.adapter_path() == folder.resolve() and spec.model == str(tiny_model)

    with pytest.raises(CommandError, match="is registered: pass another --name"):
        call_command("imitate_users", "--study", study.slug, "--base-model", str(tiny_model))


def test_clear_errors(tiny_model, data_dir):
    with pytest.raises(CommandError, match="no study 'nope'"):
        call_command("imitate_users", "--study", "nope")
    study = make_study(slug="empty", domain="p4g")
    with pytest.raises(CommandError, match="no finished conversation to learn from"):
        call_command("imitate_users", "--study", study.slug, "--base-model", str(tiny_model))
    open_chat = make_study(slug="open")
    with pytest.raises(CommandError, match="has no Domain"):
        call_command("imitate_users", "--study", open_chat.slug)
    assert not Checkpoint.objects.exists()


def test_a_failed_registration_keeps_nothing_and_the_same_command_runs_again(tiny_model, data_dir):
    study = seeded_study()
    run = ["imitate_users", "--study", study.slug, "--base-model", str(tiny_model), "--epochs", "1"]
    blocker = adapters_dir()  # a file where the adapters' folder must be: registration fails
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("not a folder")
    with pytest.raises(CommandError, match="could not be registered.*can run again"):
        call_command(*run)
    assert not (data_dir / "simulators" / "p4g-real-humanlike").exists()
    assert not Checkpoint.objects.exists()
    blocker.unlink()
    call_command(*run)
    assert Checkpoint.objects.filter(name="p4g-real-humanlike").exists()
