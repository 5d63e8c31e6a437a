"""Pre-registration: the freeze, its hash, what it refuses, the analysis it drives, and the
exports that carry it; on SQLite and on PostgreSQL (whose jsonb gives the plan back reordered)."""

import hashlib
import json

import pytest
from django.core.exceptions import ValidationError
from django.test import override_settings
from django.urls import reverse

from agents.models import ModelEndpoint
from studies import tasks
from studies.analysis import Settings, build_report, format_report
from studies.analysis.cli import run as cli_run
from studies.analysis.plan import canonical, digest
from studies.analysis.plots import figures
from studies.models import AnalysisRun, Arm, Item, Preregistration, Study, frozen_changes
from studies.participation.arrive import arrive
from studies.participation.start import start_preview
from studies.rehearsal.bots import bot_pid
from studies.research import analysis_runs, preregistration
from tests.support.studies import change_form_data, fill, make_study, prolific

pytestmark = pytest.mark.usefixtures("db")


def frozen_study(**fields):
    study = make_study(status=Study.Status.DRAFT, **fields)
    study.control_arm = study.arms.get(name="a")
    study.lower_is_better = "donation"
    study.save()
    frozen = preregistration.freeze(study, by="alice")
    Study.objects.filter(pk=study.pk).update(status=Study.Status.LIVE)  # status is not frozen
    study.refresh_from_db()
    return study, frozen


def test_freeze_stores_the_plan_with_a_verifiable_sha256():
    study, frozen = frozen_study(target_per_arm=70)
    frozen = Preregistration.objects.get(pk=frozen.pk)  # as PostgreSQL gives it back
    assert frozen.frozen_by == "alice" and frozen.frozen_at is not None
    assert hashlib.sha256(frozen.canonical.encode()).hexdigest() == frozen.sha256
    assert frozen.verify()
    # Stable: the plan read back from jsonb (keys reordered) gives the same text and hash, and
    # so does the study as it stands.
    assert canonical(frozen.plan) == frozen.canonical
    assert digest(canonical(preregistration.plan_of(study))) == frozen.sha256
    plan = frozen.plan
    assert [a["name"] for a in plan["arms"]] == ["a", "b"] and plan["control_arm"] == "a"
    measures = {m["key"]: m for m in plan["measures"]}
    assert list(measures) == ["helpful", "frustration", "donation"]  # no text, no attention
    assert measures["frustration"]["reverse_coded"] and measures["donation"]["better"] == "lower"
    assert measures["helpful"]["better"] == "higher"
    assert plan["comparisons"] == "control" and plan["family"] == {"holm": "measure", "size": 1}
    assert plan["alpha"] == 0.05 and plan["target_per_arm"] == 70
    assert plan["exclusions"]["failed_attention_check"] and plan["exclusions"]["unfinished"]
    assert plan["exclusions"]["attention_checks"] == ["attn"]
    assert plan["power"]["n_per_arm"] == 64
    # Tampering shows: the stored text no longer hashes to the stored SHA-256.
    frozen.canonical = frozen.canonical.replace('"alpha":0.05', '"alpha":0.1')
    assert not frozen.verify()


def test_freeze_is_refused_once_a_participant_exists_but_not_for_previews_or_bots():
    study = make_study(status=Study.Status.LIVE)
    start_preview(study.arms.first())
    arrive(study, prolific(pid=bot_pid(study)))
    frozen = preregistration.freeze(study)  # previews and bots are not participants
    assert frozen.pk
    with pytest.raises(preregistration.FreezeRefused, match="already pre-registered"):
        preregistration.freeze(study)

    later = make_study(slug="s2", status=Study.Status.LIVE)
    arrive(later, prolific(pid="first-person"))
    with pytest.raises(preregistration.FreezeRefused, match="already has participants"):
        preregistration.freeze(later)
    assert not Preregistration.objects.filter(study=later).exists()


def test_frozen_fields_are_refused_by_name():
    study, _ = frozen_study()
    study.alpha = 0.1
    with pytest.raises(ValidationError) as refused:
        study.full_clean()
    assert "alpha" in refused.value.message_dict
    assert "frozen" in refused.value.message_dict["alpha"][0]
    with pytest.raises(ValidationError, match="alpha"):
        study.save()  # not only forms: every save meets the freeze
    study.refresh_from_db()
    study.title, study.status = "Renamed", Study.Status.LIVE  # not in the plan: allowed
    study.save()

    arm = study.arms.get(name="b")
    arm.model_name = "another-adapter"
    with pytest.raises(ValidationError, match="model_name"):
        arm.save()
    arm.refresh_from_db()
    arm.endpoint = ModelEndpoint.of_url("http://127.0.0.1:8002/v1")  # an engine may move host
    arm.save()
    with pytest.raises(ValidationError, match="Cannot add an arm"):
        Arm.objects.create(study=study, name="c", model_name="m")
    assert "Cannot delete arm" in frozen_changes(arm, deleting=True)["__all__"]  # admin forms

    item = Item.objects.get(questionnaire__study=study, key="frustration")
    item.reverse_coded = False
    with pytest.raises(ValidationError, match="reverse_coded"):
        item.save()
    # A new question is outside the plan: allowed, and analysed only as exploratory.
    Item.objects.create(
        questionnaire=study.questionnaire, order=9, key="extra", prompt="More?", required=False
    )


def test_admin_freezes_and_refuses_frozen_fields_with_a_message(admin_client):
    study = make_study(status=Study.Status.DRAFT)
    url = reverse("admin:studies_study_change", args=[study.pk])
    page = admin_client.get(url).content.decode()
    assert 'id="freeze-plan"' in page and "64 per arm" in page
    # The target of 20 per arm is below the 64 the power analysis asks for: said on the page.
    assert "The target of 20 per arm is below the 64 needed" in page
    response = admin_client.post(reverse("admin:studies_study_freeze", args=[study.pk]))
    assert response.status_code == 302
    frozen = Preregistration.objects.get(study=study)
    page = admin_client.get(url).content.decode()
    assert frozen.sha256 in page and "verified" in page

    # Frozen fields of the study and of an arm come back on the form, by name; nothing saved.
    data = change_form_data(admin_client, url)
    data.update({"target_per_arm": 99, "title": "Renamed", "arms-0-temperature": 1.5})
    response = admin_client.post(url, data)
    assert response.status_code == 200  # the form again, not a redirect
    text = response.content.decode()
    assert "target_per_arm is frozen at 20" in text and "temperature is frozen at 0" in text
    study.refresh_from_db()
    assert study.target_per_arm == 20 and study.title == "Test study"
    assert study.arms.get(name="a").temperature == 0
    # Deleting an arm is refused on the form too.
    data = change_form_data(admin_client, url)
    data["arms-1-DELETE"] = "on"
    response = admin_client.post(url, data)
    assert response.status_code == 200 and "Cannot delete arm" in response.content.decode()
    assert study.arms.count() == 2
    # What the plan does not hold still saves.
    data = change_form_data(admin_client, url)
    moved = ModelEndpoint.of_url("http://127.0.0.1:8/v1")
    data.update({"title": "Renamed", "arms-0-endpoint": str(moved.pk)})
    with override_settings(PARLEY_ARM_MODEL_CHECK="warn"):  # no engine here: only the freeze
        assert admin_client.post(url, data).status_code == 302
    # The questionnaire's items are refused alike.
    q_url = reverse("admin:studies_questionnaire_change", args=[study.questionnaire.pk])
    data = change_form_data(admin_client, q_url)
    data["items-1-reverse_coded"] = ""
    response = admin_client.post(q_url, data)
    assert response.status_code == 200 and "reverse_coded is frozen" in response.content.decode()
    delete = reverse("admin:studies_questionnaire_delete", args=[study.questionnaire.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403


def test_analysis_uses_the_frozen_plan_and_labels_others_exploratory(admin_client):
    study, frozen = frozen_study()
    # After the freeze: a new question and a different comparison in the study's own settings
    # would change the analysis; the confirmatory run reads the plan only.
    Item.objects.create(
        questionnaire=study.questionnaire, order=9, key="extra", prompt="More?", required=False
    )
    fill(study, {"a": [5, 6, 7, 6], "b": [2, 3, 3, 4]})
    run = analysis_runs.compute(AnalysisRun.objects.create(study=study))
    assert run.status == "done", run.error
    run.refresh_from_db()  # as stored
    report = run.results
    assert report["settings"]["measures"] == ["helpful", "frustration", "donation"]
    assert report["settings"] == frozen.plan["analysis"]
    assert report["preregistration"]["analysis"] == "confirmatory"
    assert report["preregistration"]["sha256"] == frozen.sha256
    donation = next(c for c in report["comparisons"] if c["measure"] == "donation")
    assert donation["favours"] is None or donation["favours"] in ("a", "b")
    helpful = next(c for c in report["comparisons"] if c["measure"] == "helpful")
    assert helpful["favours"] == "a"  # b - a < 0, higher is better

    planned = frozen.plan["analysis"]
    asked = {**planned, "pairs": "all", "measures": [*planned["measures"], "extra"]}
    other = analysis_runs.compute(AnalysisRun.objects.create(study=study, settings=asked))
    assert other.status == "done" and not other.results["errors"], other.results["errors"]
    label = other.results["preregistration"]
    assert label["analysis"] == "exploratory"
    assert any(d.startswith("measures:") for d in label["differences"])
    assert any(d.startswith("pairs:") for d in label["differences"])
    tagged = figures(other.results)["means"].get_suptitle()
    assert tagged.startswith("EXPLORATORY")
    assert figures(report)["means"].get_suptitle().startswith("Confirmatory")
    assert "extra" in {m["name"] for m in other.results["measures"]}
    page = admin_client.get(reverse("admin:studies_analysisrun_change", args=[other.pk]))
    assert "EXPLORATORY: not the pre-registered plan" in page.content.decode()


def test_exports_carry_the_snapshot_and_its_hash(admin_client, tmp_path):
    study, frozen = frozen_study()
    fill(study, {"a": [5, 6, 7], "b": [2, 3, 3]})
    run = tasks.start_analysis(study)  # eager or not, compute it here
    run = analysis_runs.compute(AnalysisRun.objects.get(pk=run.pk))
    body = admin_client.get(reverse("admin:studies_analysisrun_download", args=[run.pk, "json"]))
    exported = json.loads(body.content)["preregistration"]
    assert exported["sha256"] == frozen.sha256
    assert digest(exported["canonical"]) == frozen.sha256
    assert json.loads(exported["canonical"]) == exported["plan"]
    page = admin_client.get(reverse("admin:studies_analysisrun_change", args=[run.pk]))
    assert "Confirmatory: the pre-registered plan" in page.content.decode()

    document = admin_client.get(reverse("admin:studies_study_plan", args=[study.pk]))
    assert document.status_code == 200
    plan_file = tmp_path / "plan.json"
    plan_file.write_bytes(document.content)
    saved = json.loads(document.content)
    assert digest(saved["canonical"]) == saved["sha256"] == frozen.sha256

    # The command line reads the same document: the plan's settings are confirmatory, others not.
    table = analysis_runs.participant_table(study)
    csv_file = tmp_path / "data.csv"
    table.to_csv(csv_file, index=False)
    analysis = frozen.plan["analysis"]
    options = {
        "csv": str(csv_file),
        "arm_column": "arm",
        "measures": ",".join(analysis["measures"]),
        "arms": ",".join(analysis["arms"]),
        "control": analysis["control"],
        "reverse": ",".join(analysis["reverse"]),
        "scales": analysis["scales"],
        "lower_better": ",".join(analysis["lower_better"]),
        "plan": str(plan_file),
    }
    _, report = cli_run(options)
    assert report["preregistration"]["analysis"] == "confirmatory", report["preregistration"]
    _, report = cli_run({**options, "pairs": "all"})
    assert report["preregistration"]["analysis"] == "exploratory"
    assert format_report(report).startswith("EXPLORATORY: not the pre-registered plan")
    assert report["preregistration"]["differences"] == ["pairs: planned 'control', used 'all'"]
    confirmed = build_report(table, Settings(**analysis), saved)
    assert confirmed["preregistration"]["analysis"] == "confirmatory"


def test_another_analysis_from_the_admin_is_labelled_exploratory(admin_client):
    study, frozen = frozen_study()
    fill(study, {"a": [5, 6, 7], "b": [2, 3, 3]})
    url = reverse("admin:studies_study_explore", args=[study.pk])
    page = admin_client.get(url).content.decode()
    assert "labelled exploratory" in page
    response = admin_client.post(
        url, {"measures": ["helpful"], "pairs": "all", "family": "study", "control": ""}
    )
    assert response.status_code == 302
    run = analysis_runs.compute(AnalysisRun.objects.get(study=study))
    assert run.results["settings"]["measures"] == ["helpful"]
    label = run.results["preregistration"]
    assert label["analysis"] == "exploratory" and label["sha256"] == frozen.sha256
    # The plan's own choices, asked for again, are the confirmatory analysis.
    analysis = frozen.plan["analysis"]
    response = admin_client.post(
        url,
        {
            "measures": analysis["measures"],
            "pairs": analysis["pairs"],
            "family": analysis["family"],
            "control": analysis["control"],
        },
    )
    again = analysis_runs.compute(AnalysisRun.objects.filter(study=study).first())
    assert again.results["preregistration"]["analysis"] == "confirmatory"


def test_lower_is_better_names_measures_of_the_study():
    study = make_study(status=Study.Status.DRAFT, lower_is_better="frustration, nope")
    with pytest.raises(ValidationError, match="Not measures of this study: nope"):
        study.full_clean()


def test_attaching_a_checkpoint_to_a_frozen_arm_is_refused_with_a_message(admin_client):
    from agents.models import Checkpoint

    study, _ = frozen_study()
    checkpoint = Checkpoint.objects.create(name="trained-step-1", path="/nowhere")
    arm = study.arms.get(name="b")
    response = admin_client.post(
        reverse("admin:agents_checkpoint_changelist"),
        {
            "action": "attach_to_arm",
            "_selected_action": [checkpoint.pk],
            "apply": "1",
            "arms": [arm.pk],
            "endpoint": ModelEndpoint.of_url("http://127.0.0.1:8001/v1").pk,
        },
        follow=True,
    )
    assert "model_name is frozen" in response.content.decode()
    arm.refresh_from_db()
    assert arm.model_name == "SmolLM2-135M-Instruct"


def test_a_new_study_from_the_add_form_gets_the_plan_defaults(admin_client):
    url = reverse("admin:studies_study_add")
    data = change_form_data(admin_client, url)
    data.update(title="Planned", slug="planned")
    response = admin_client.post(url, data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    study = Study.objects.get(slug="planned")
    assert (study.alpha, study.target_effect, study.target_power) == (0.05, 0.5, 0.8)
    assert study.exclude_failed_attention and study.exclude_unfinished
    data = change_form_data(admin_client, reverse("admin:studies_study_change", args=[study.pk]))
    data.update(alpha="1.5", target_effect="0")
    text = admin_client.post(reverse("admin:studies_study_change", args=[study.pk]), data)
    assert "Must lie strictly between 0 and 1." in text.content.decode()
    assert "Hedges&#x27; g to detect must be above 0." in text.content.decode()
