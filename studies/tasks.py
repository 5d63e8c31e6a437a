"""Celery tasks of studies and every place that enqueues them: callers above (admin, flow) ask
here, so the analysis code below never imports a queue."""

from celery import shared_task
from django.db import transaction

from .models import AnalysisRun, Study
from .reports import compute, target_reached


@shared_task(name="studies.tasks.run_analysis")
def run_analysis(run_id: int) -> str:
    """Compute one stored AnalysisRun (queue `analysis`)."""
    return compute(AnalysisRun.objects.select_related("study").get(pk=run_id)).status


def start_analysis(study: Study, trigger: str = AnalysisRun.Trigger.MANUAL) -> AnalysisRun:
    """Create a run and hand it to the `analysis` queue once the row is committed."""
    run = AnalysisRun.objects.create(study=study, trigger=trigger)
    transaction.on_commit(lambda: run_analysis.delay(run.pk))
    return run


def analyse_if_target_reached(study_id: int) -> AnalysisRun | None:
    """Analyse automatically, once, when every arm has reached the target."""
    study = Study.objects.get(pk=study_id)
    already = study.analysis_runs.filter(trigger=AnalysisRun.Trigger.TARGET).exists()
    if already or not target_reached(study):
        return None
    return start_analysis(study, AnalysisRun.Trigger.TARGET)

