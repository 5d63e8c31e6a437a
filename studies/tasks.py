from celery import shared_task

from .models import AnalysisRun
from .reports import compute


@shared_task(name="studies.tasks.run_analysis")
def run_analysis(run_id: int) -> str:
    """Compute one stored AnalysisRun (queue `analysis`)."""
    return compute(AnalysisRun.objects.select_related("study").get(pk=run_id)).status
