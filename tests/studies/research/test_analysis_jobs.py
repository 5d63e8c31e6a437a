"""Analysis runs: the study's table, a real Celery worker, the admin view and downloads."""

import json
import time

import pytest
from django.urls import reverse

from studies.analysis import build_report
from studies.models import AnalysisRun, Study
from studies.participation.arrive import arrive
from studies.research import analysis_runs
from tests.support.studies import (
    fill,
    finish,
    make_study,
    prolific,
)


@pytest.mark.django_db
def test_participant_table_and_settings_follow_the_study():
    study = make_study(comparisons="all")
    fill(study, {"a": [5, 6, 7], "b": [2, 3, 3]})
    p, _ = arrive(study, prolific(pid="unfinished"))
    table = analysis_runs.participant_table(study)
    assert len(table) == 7 and table["finished"].sum() == 6
    settings = analysis_runs.analysis_settings(study, table)
    assert settings.measures == (
        "helpful",
        "frustration",
        "donation",
    )  # attention checks are not measures
    assert settings.reverse == ("frustration",) and settings.pairs == "all"
    report = build_report(table, settings)
    assert report["participants"]["excluded"]["by_reason"].get("unfinished") == 1
    helpful = next(c for c in report["comparisons"] if c["measure"] == "helpful")
    means = {"a": 6.0, "b": 8 / 3}
    assert helpful["diff"] == pytest.approx(means[helpful["arm"]] - means[helpful["reference"]])
    frustration = next(c for c in report["comparisons"] if c["measure"] == "frustration")
    # Reverse-coded: answered 8 - x, flipped back to x, so it agrees with helpfulness.
    assert frustration["diff"] == pytest.approx(helpful["diff"])


@pytest.mark.django_db(transaction=True)
def test_analysis_runs_on_a_real_worker_and_shows_in_the_admin(celery_worker, admin_client):
    study = make_study(target_per_arm=50)
    fill(study, {"a": [5, 6, 7, 6], "b": [2, 3, 3, 4]})
    response = admin_client.post(reverse("admin:studies_study_analyse", args=[study.pk]))
    assert response.status_code == 302
    run = wait_for_run(study)
    assert run.status == "done", run.error
    local = build_report(
        analysis_runs.participant_table(study),
        analysis_runs.analysis_settings(study, analysis_runs.participant_table(study)),
    )
    assert run.results["comparisons"] == json.loads(json.dumps(local["comparisons"]))
    assert "means" in run.figures and run.figures["means"].lstrip().startswith("<?xml")
    page = admin_client.get(
        reverse("admin:studies_analysisrun_change", args=[run.pk])
    ).content.decode()
    # the figures are images of their own URL (the page's CSP refuses inline SVG styles)
    assert "Welch" in page
    assert reverse("admin:studies_analysisrun_figure", args=[run.pk, "means"]) in page
    csv_body = admin_client.get(
        reverse("admin:studies_analysisrun_download", args=[run.pk, "csv"])
    ).content.decode()
    assert csv_body.startswith("measure,arm,reference") and "helpful,b,a" in csv_body
    report = json.loads(
        admin_client.get(
            reverse("admin:studies_analysisrun_download", args=[run.pk, "json"])
        ).content
    )
    assert report["participants"]["included"] == 8


@pytest.mark.django_db(transaction=True)
def test_reaching_the_target_starts_one_analysis(celery_worker):
    study = make_study(target_per_arm=2)
    fill(study, {"a": [5, 6], "b": [2]})
    assert not AnalysisRun.objects.filter(study=study).exists()
    answers = {"helpful": "3", "frustration": "4", "attn": "2", "donation": "0"}
    finish(Study.objects.get(pk=study.pk), "last", answers, arm="b")
    run = wait_for_run(study)
    assert run.trigger == "target" and run.status == "done"
    assert AnalysisRun.objects.filter(study=study).count() == 1


def wait_for_run(study, seconds=90):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        run = AnalysisRun.objects.filter(study=study).first()
        if run and run.status in ("done", "failed"):
            return run
        time.sleep(0.3)
    pytest.fail(
        f"no finished analysis run within {seconds} s: {AnalysisRun.objects.filter(study=study).values()}"
    )
