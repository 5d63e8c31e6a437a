"""Exports travel (laptops, e-mail, data repositories): no participant token is in any of them.

A token is the /p/<token>/ address; whoever holds it acts as that participant."""

import pytest
from django.urls import reverse

from studies.models import AnalysisRun, Participant
from studies.research import analysis_runs
from tests.support.studies import fill, make_study

pytestmark = pytest.mark.django_db


def body(response) -> str:
    assert response.status_code == 200
    if response.streaming:
        return b"".join(response.streaming_content).decode()
    return response.content.decode()


def test_no_export_carries_a_participant_token(admin_client):
    study = make_study(comparisons="all")
    fill(study, {"a": [5, 6, 7], "b": [2, 3, 3]})
    run = analysis_runs.compute(AnalysisRun.objects.create(study=study))
    assert run.status == AnalysisRun.Status.DONE, run.error
    tokens = [str(p.token) for p in Participant.objects.all()]
    pids = list(Participant.objects.values_list("prolific_pid", flat=True))
    changelist = reverse("admin:studies_study_changelist")
    exports = {
        "responses.csv": admin_client.get(
            reverse("admin:studies_study_responses", args=[study.pk])
        ),
        "transcripts.csv": admin_client.get(
            reverse("admin:studies_study_transcripts", args=[study.pk])
        ),
        **{
            f"{action} action": admin_client.post(
                changelist, {"action": action, "_selected_action": [study.pk]}
            )
            for action in ("export_responses", "export_transcripts")
        },
        **{
            f"analysis {kind}": admin_client.get(
                reverse("admin:studies_analysisrun_download", args=[run.pk, kind])
            )
            for kind in ("csv", "json", "input")
        },
    }
    texts = {name: body(response) for name, response in exports.items()}
    for name, text in texts.items():
        assert not [t for t in tokens if t in text], f"{name} carries participant tokens"
    # They still say who is who: by Prolific ID, which joins responses to transcripts.
    for name in ("responses.csv", "transcripts.csv", "analysis input"):
        assert all(pid in texts[name] for pid in pids), name
