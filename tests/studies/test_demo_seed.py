"""`make demo`'s seeding: the demo study, and studies of trained checkpoints when present."""

import json

import pytest
from django.core.management import CommandError, call_command

from studies import flow
from studies.demo import seed_demo_study, seed_trained_studies
from studies.models import Participant, Study
from tests.studies.conftest import prolific

pytestmark = pytest.mark.django_db


def fake_checkpoint(data, run, step, regime, domain="p4g"):
    folder = data / "runs" / run / "checkpoints" / f"step-{step}"
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text("{}")
    manifest = {
        "name": f"{run}-step{step}",
        "kind": "agent",
        "domain": domain,
        "regime": regime,
        "step": step,
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_demo_study_is_seeded_and_reseeding_keeps_participants(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("PARLEY_DATA_DIR", str(tmp_path))
    with pytest.raises(CommandError, match="--admin-password"):
        call_command("seed_demo", admin_password="")
    call_command("seed_demo", admin_password="pw-for-test")
    study = Study.objects.get(slug="demo")
    assert list(study.arms.values_list("name", flat=True)) == ["friendly", "concise"]
    assert study.questionnaire.items.filter(kind="attention").count() == 1
    participant, _ = flow.arrive(study, prolific())
    call_command("seed_demo", admin_password="pw-for-test")
    assert Participant.objects.filter(pk=participant.pk).exists()
    assert Study.objects.filter(slug="demo").count() == 1
    assert "study=demo arms=friendly,concise" in capsys.readouterr().out
    from django.contrib.auth import get_user_model

    assert get_user_model().objects.get(username="admin").check_password("pw-for-test")


def test_trained_checkpoints_become_arms(monkeypatch, tmp_path):
    monkeypatch.setenv("PARLEY_DATA_DIR", str(tmp_path))
    assert seed_trained_studies() == []  # no checkpoints, no extra study
    fake_checkpoint(tmp_path, "p4g-single-cpu", 3, "single")
    fake_checkpoint(tmp_path, "p4g-single-cpu", 6, "single")
    fake_checkpoint(tmp_path, "p4g-population-cpu", 6, "population")
    (study,) = seed_trained_studies()
    arms = dict(study.arms.values_list("name", "model_name"))
    assert arms == {
        "base": "SmolLM2-135M-Instruct",
        "population": "p4g-population-cpu-step6",
        "single": "p4g-single-cpu-step6",
    }
    assert study.control_arm.name == "base" and study.scenarios.count() == 10
    assert study.questionnaire.items.get(key="manipulation").reverse_coded
    assert (tmp_path / "checkpoints" / "p4g-single-cpu-step6").is_symlink()
    seed_demo_study()
    (again,) = seed_trained_studies()
    assert again.pk == study.pk and again.scenarios.count() == 10
