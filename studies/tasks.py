"""Celery tasks of studies and every place that enqueues them: callers above (admin, flow) ask
here, so the analysis code below never imports a queue."""

import logging
import threading
import time
from datetime import timedelta

from celery import shared_task
from celery.signals import worker_ready
from django.db import IntegrityError, transaction
from django.utils import timezone

from studies.models import AnalysisRun, BonusPayment, Study, time_out_overdue
from studies.prolific import api as prolific_api
from studies.prolific import sync as prolific_sync
from studies.research import retention, simulator_evaluations
from studies.research.analysis_runs import compute, target_reached

log = logging.getLogger(__name__)

# An unreachable broker is retried from a background thread for about ten minutes
# (1, 2, 4 ... 60 s apart); a worker that starts later sends whatever is still queued.
SEND_ATTEMPTS = 14
SEND_FIRST_WAIT = 1.0
SEND_MAX_WAIT = 60.0
ABANDONED_AFTER = 30 * 60  # seconds running after which an analysis (seconds long) was abandoned


# acks_late with reject_on_worker_lost: a run whose worker dies is delivered again, not lost.
@shared_task(
    name="studies.tasks.run_analysis", bind=True, acks_late=True, reject_on_worker_lost=True
)
def run_analysis(self, run_id: int) -> str:
    """Compute one stored AnalysisRun (queue `analysis`), once however often it is delivered."""
    # A message delivered again after its worker was lost takes the run over; any other
    # second delivery leaves a running or finished run alone.
    redelivered = bool((self.request.delivery_info or {}).get("redelivered"))
    run = claim_run(run_id, take_over_running=redelivered)
    if run is None:
        status = AnalysisRun.objects.filter(pk=run_id).values_list("status", flat=True).first()
        return status or "missing"
    run = compute(run, {"sim2real": simulator_evaluations.analysis_section})
    if run.pk is None:  # deleted while it was computed
        return "missing"
    if (run.results or {}).get("sim2real", {}).get("missing"):
        start_simulator_evaluation(run)
    return run.status


def claim_run(run_id: int, take_over_running: bool = False) -> AnalysisRun | None:
    """Mark the run running if it is waiting (one conditional UPDATE, so two deliveries cannot
    both win); None when another delivery has it or it is finished."""
    waiting = [AnalysisRun.Status.QUEUED]
    if take_over_running:
        waiting.append(AnalysisRun.Status.RUNNING)
    claimed = AnalysisRun.objects.filter(pk=run_id, status__in=waiting).update(
        status=AnalysisRun.Status.RUNNING, started_at=timezone.now()
    )
    return AnalysisRun.objects.select_related("study").get(pk=run_id) if claimed else None


# acks_late: an evaluation whose worker died is delivered again; stored conversations are kept
# and only the missing ones are played.
@shared_task(name="studies.tasks.evaluate_simulators", acks_late=True, reject_on_worker_lost=True)
def evaluate_simulators(study_id: int, run_id: int | None = None) -> dict:
    """Play the sim-to-real report's missing conversations (each arm's checkpoint against its
    run's held-out simulators on the study's pool, queue `analysis`), then redo the run's
    `sim2real` section and figure."""
    played = simulator_evaluations.evaluate_missing(Study.objects.get(pk=study_id))
    run = AnalysisRun.objects.filter(pk=run_id).select_related("study").first()
    if run is not None:
        section, figures = simulator_evaluations.analysis_section(run.study)
        section["notes"] += [f"not played: {problem}" for problem in played["failed"]]
        results = {**(run.results or {}), "sim2real": section}
        AnalysisRun.objects.filter(pk=run.pk).update(
            results=results, figures={**(run.figures or {}), **figures}
        )
    return played


def start_simulator_evaluation(run: AnalysisRun) -> None:
    """Queue the evaluation of the conversations the run's sim-to-real section lacks."""
    transaction.on_commit(lambda: send_in_background(evaluate_simulators, run.study_id, run.pk))


def start_analysis(
    study: Study, trigger: str = AnalysisRun.Trigger.MANUAL, settings: dict | None = None
) -> AnalysisRun:
    """Create a run and hand it to the `analysis` queue once the row is committed. `settings`
    (a studies.analysis.Settings as a dict) asks for an analysis other than the study's own:
    in a pre-registered study its report is labelled exploratory unless they are the plan's."""
    run = AnalysisRun.objects.create(study=study, trigger=trigger, settings=settings or {})
    transaction.on_commit(lambda: send_in_background(run_analysis, run.pk))
    return run


def analyse_if_target_reached(study_id: int) -> AnalysisRun | None:
    """Analyse automatically, once, when every arm has reached the target. The database keeps it
    to one (a unique constraint on the study's target run), however many completions race here."""
    study = Study.objects.get(pk=study_id)
    if not target_reached(study):
        return None
    return analyse_at_target(study)


def analyse_at_target(study: Study) -> AnalysisRun | None:
    """The study's one target analysis, started unless it already was; the caller has found
    the target reached."""
    try:
        with transaction.atomic():
            return start_analysis(study, AnalysisRun.Trigger.TARGET)
    except IntegrityError:  # already started, by this completion's twin or an earlier one
        return None


# Celery beat runs this every PARLEY_TIMEOUT_SWEEP_SECONDS (CELERY_BEAT_SCHEDULE in settings):
# abandoned participants give their arm place back without waiting for their page to load.
@shared_task(name="studies.tasks.time_out_overdue")
def time_out_overdue_participants() -> int:
    """Time out every participant past their study's time limit (queue `default`)."""
    timed_out = time_out_overdue()
    if timed_out:
        log.info("timed out %d participant(s) past the time limit", len(timed_out))
    return len(timed_out)


# Celery beat runs this every PARLEY_RETENTION_SWEEP_SECONDS: each study's retention period.
@shared_task(name="studies.tasks.purge_expired_data")
def purge_expired_data() -> dict[str, int]:
    """Purge the identifying data of participants past their study's retention period
    (studies/research/retention.py); participants purged, by study slug."""
    purged = retention.purge_due()
    if purged:
        log.info("retention: purged %s", purged)
    return purged


@shared_task(name="studies.tasks.run_bots")
def run_bots(study_id: int, n: int, concurrency: int, kind: str = "scripted") -> dict:
    """Bot participants through the study's real flow (queue `default`); returns their report."""
    from studies.rehearsal.bots import (
        run_bots as drive,  # the HTTP and WebSocket clients only load here
    )

    return drive(Study.objects.get(pk=study_id), n, concurrency, kind=kind).to_dict()


def start_bots(study: Study, n: int, concurrency: int) -> str:
    """Queue a bot run on the study (queue `default`); returns the task id."""
    return run_bots.delay(study.pk, n, concurrency).id


# --- Prolific (studies/prolific/sync.py) -------------------------------------------------------


@shared_task(name="studies.tasks.sync_prolific")
def sync_prolific() -> dict:
    """Celery beat's periodic sync: statuses in, decisions and bonuses out, for every study
    linked to Prolific (parley/celery.py schedules it)."""
    return prolific_sync.sync_all()


@shared_task(name="studies.tasks.push_prolific_reviews", bind=True, max_retries=8)
def push_prolific_reviews(self, study_id: int) -> int:
    """Send a study's pending approvals and rejections; a failure without an answer is retried
    (transitions are idempotent on Prolific), and the periodic sync sends what is left."""
    try:
        with prolific_api.Prolific() as api:
            return prolific_sync.push_reviews(Study.objects.get(pk=study_id), api)
    except prolific_api.ProlificError as error:
        if error.refused or isinstance(error, prolific_api.NotConfigured):
            raise
        raise self.retry(countdown=min(60 * 2**self.request.retries, 3600)) from None


# acks_late: a payment whose worker died is delivered again; pay() makes that safe.
@shared_task(
    name="studies.tasks.pay_prolific_bonuses",
    bind=True,
    max_retries=8,
    acks_late=True,
    reject_on_worker_lost=True,
)
def pay_prolific_bonuses(self, payment_id: int) -> str:
    try:
        with prolific_api.Prolific() as api:
            return prolific_sync.pay(payment_id, api).state
    except prolific_api.ProlificError as error:
        if error.refused or isinstance(error, prolific_api.NotConfigured):
            raise
        raise self.retry(countdown=min(60 * 2**self.request.retries, 3600)) from None


def start_prolific_sync() -> str:
    """One sync now, besides beat's schedule; returns the task id."""
    return sync_prolific.delay().id


def send_prolific_reviews(study: Study) -> None:
    """Send the study's queued decisions once they are committed."""
    transaction.on_commit(lambda: send_in_background(push_prolific_reviews, study.pk))


def start_bonus_payment(payment: BonusPayment) -> None:
    transaction.on_commit(lambda: send_in_background(pay_prolific_bonuses, payment.pk))


def send_in_background(task, *args) -> threading.Thread | None:
    """Enqueue without making the caller wait on the broker: a participant's request returns at
    once and a thread keeps trying while the broker is unreachable."""
    if task.app.conf.task_always_eager:
        task.apply_async(args)
        return None
    thread = threading.Thread(
        target=send_with_retries, args=(task, args), name=f"send {task.name}", daemon=True
    )
    thread.start()
    return thread


def send_with_retries(task, args: tuple, attempts: int = SEND_ATTEMPTS) -> bool:
    wait = SEND_FIRST_WAIT
    for attempt in range(1, attempts + 1):
        try:
            # A fresh connection each try: a pooled one may be the broken one.
            with task.app.connection_for_write() as connection:
                task.apply_async(args, connection=connection, retry=False)
            return True
        except Exception as error:  # noqa: BLE001 - any broker failure is retried, then logged
            log.warning("%s%r not sent (attempt %d): %s", task.name, args, attempt, error)
        if attempt < attempts:
            time.sleep(wait)
            wait = min(wait * 2, SEND_MAX_WAIT)
    log.error("%s%r not sent after %d attempts; it stays queued", task.name, args, attempts)
    return False


@worker_ready.connect
def resend_on_worker_start(**_) -> None:
    try:
        resend_queued_analyses()
    except Exception:  # noqa: BLE001 - a worker starts even when this look-back fails
        log.exception("could not send the queued analyses again")


def resend_queued_analyses(older_than: float = 60.0) -> list[int]:
    """Send again the runs still queued (their sender gave up or its process died), and those
    left running far longer than any analysis takes (their worker died on a broker that does
    not redeliver, like the demo's filesystem one). A run is claimed once, so a second message
    for it is harmless."""
    now = timezone.now()
    AnalysisRun.objects.filter(
        status=AnalysisRun.Status.RUNNING, started_at__lt=now - timedelta(seconds=ABANDONED_AFTER)
    ).update(status=AnalysisRun.Status.QUEUED)
    ids = list(
        AnalysisRun.objects.filter(
            status=AnalysisRun.Status.QUEUED, created_at__lt=now - timedelta(seconds=older_than)
        ).values_list("pk", flat=True)
    )
    for run_id in ids:
        run_analysis.apply_async((run_id,))
    return ids
