"""`make demo`'s seeding: the open-chat demo, and a tau2 retail and a P4G study on a fresh clone,
with trained arms when checkpoints exist and base-model arms otherwise."""

import json

import pytest
from django.core.management import CommandError, call_command

from studies.models import Participant, Study
from studies.participation.arrive import arrive
from studies.participation.consent import give_consent
from studies.rehearsal.demo_studies import PAPER_ITEMS, seed_demo_study, seed_domain_studies
from tests.support.studies import prolific

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
    participant, _ = arrive(study, prolific())
    call_command("seed_demo", admin_password="pw-for-test")
    assert Participant.objects.filter(pk=participant.pk).exists()
    assert Study.objects.filter(slug="demo").count() == 1
    assert "study=demo arms=friendly,concise" in capsys.readouterr().out
    from django.contrib.auth import get_user_model

    assert get_user_model().objects.get(username="admin").check_password("pw-for-test")


def active_arms(study) -> dict[str, str]:
    return dict(study.arms.filter(active=True).values_list("name", "model_name"))


def test_a_fresh_clone_gets_a_retail_and_a_p4g_study_on_base_arms(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("PARLEY_DATA_DIR", str(tmp_path))  # no runs, no checkpoints
    call_command("seed_demo", admin_password="pw-for-test")
    out = capsys.readouterr().out
    for slug, domain in (("demo-retail", "retail"), ("demo-p4g", "p4g")):
        study = Study.objects.get(slug=slug)
        assert f"study={slug} " in out
        assert (study.domain, study.status) == (domain, Study.Status.LIVE)
        assert active_arms(study) == {
            "base": "SmolLM2-135M-Instruct",
            "base-greedy": "SmolLM2-135M-Instruct",
        }
        assert study.control_arm.name == "base"
        assert study.scenarios.filter(domain=domain).count() >= 4  # the Domain's test split
        keys = list(study.questionnaire.items.values_list("key", flat=True))
        assert keys == [item["key"] for item in PAPER_ITEMS[domain]]
        # the real flow runs: a participant is assigned an arm and a scenario, the agent opens
        participant, _ = arrive(study, prolific(pid=f"p-{domain}", session_id=domain))
        participant = give_consent(participant, True)
        assert participant.scenario is not None
        assert participant.conversation.messages.first().content
    retail = Study.objects.get(slug="demo-retail").questionnaire.items
    assert retail.get(key="frustration").reverse_coded
    p4g = Study.objects.get(slug="demo-p4g").questionnaire.items
    assert list(p4g.values_list("key", flat=True))[0] == "intended_donation"
    assert p4g.get(key="manipulation").reverse_coded


def test_trained_checkpoints_become_arms(monkeypatch, tmp_path):
    monkeypatch.setenv("PARLEY_DATA_DIR", str(tmp_path))
    before = {s.slug: active_arms(s) for s in seed_domain_studies()}
    assert set(before) == {"demo-retail", "demo-p4g"}  # base arms without checkpoints
    fake_checkpoint(tmp_path, "p4g-single-cpu", 3, "single")
    fake_checkpoint(tmp_path, "p4g-single-cpu", 6, "single")
    fake_checkpoint(tmp_path, "p4g-population-cpu", 6, "population")
    studies = {s.slug: s for s in seed_domain_studies()}
    study = studies["demo-p4g"]
    assert active_arms(study) == {
        "base": "SmolLM2-135M-Instruct",
        "population": "p4g-population-cpu-step6",
        "single": "p4g-single-cpu-step6",
    }
    assert study.arms.filter(name="base-greedy", active=False).exists()  # kept, not used
    assert active_arms(studies["demo-retail"]) == before["demo-retail"]  # no retail checkpoint
    assert study.control_arm.name == "base" and study.scenarios.count() == 10
    assert study.questionnaire.items.get(key="manipulation").reverse_coded
    assert (tmp_path / "checkpoints" / "p4g-single-cpu-step6").is_symlink()
    seed_demo_study()
    again = {s.slug: s for s in seed_domain_studies()}["demo-p4g"]
    assert again.pk == study.pk and again.scenarios.count() == 10
