"""A training message delivered again (acks_late after a lost worker, or Redis's visibility
timeout on a long run) never trains a run a second time."""

from datetime import timedelta

import pytest
from django.utils import timezone

from training.models import TrainingRun
from training.tasks import run_training


@pytest.mark.django_db
@pytest.mark.parametrize("status", [TrainingRun.Status.RUNNING, TrainingRun.Status.DONE])
def test_a_run_already_started_is_not_started_again(status):
    started = timezone.now() - timedelta(minutes=5)
    run = TrainingRun.objects.create(
        name=f"once-{status}",
        preset="p4g-single-cpu",
        domain="p4g",
        regime="single",
        steps=1,
        status=status,
        started_at=started,
        output_dir="/runs/first",
        progress={"step": 3},
    )
    assert run_training.apply((run.pk,)).get() == status
    run.refresh_from_db()
    assert (run.status, run.started_at, run.output_dir) == (status, started, "/runs/first")
    assert run.progress == {"step": 3} and run.finished_at is None and not run.error
