"""What a researcher watches while a study runs: places per arm, live conversations, time per
stage, endpoint health and the latest problems. One dict, rendered by the admin's monitor page
and returned by its JSON endpoint (the page refreshes itself from it).

Participants appear by their number; their Prolific id only for staff with the participants
permission (`identities`), who may open their pages anyway. No problem's page path holds a token
(studies/participation/problems.py masks it before it is stored)."""

from statistics import median

from django.db.models import Count, Max, Q
from django.utils import timezone

from studies.models import Participant, Study, Withdrawal, only_people
from studies.setup.go_live import cached_health

# Each stage and the two stored timestamps that bound it.
STAGES = [
    ("consent", "created_at", "consented_at"),
    ("chat", "consented_at", "chat_ended_at"),
    ("questionnaire", "chat_ended_at", "completed_at"),
    ("total", "created_at", "completed_at"),
]
LATEST_ERRORS = 20


def snapshot(study: Study, identities: bool = False) -> dict:
    """`identities`: with each participant's Prolific id (the participants permission)."""
    people = study.participants.filter(only_people())
    return {
        "study": {
            "id": study.pk,
            "title": study.title,
            "status": study.status,
            "status_label": study.get_status_display(),
            "target_per_arm": study.target_per_arm,
        },
        "at": timezone.now().isoformat(),
        "arms": arm_rows(study, people),
        "active": active_conversations(people, identities),
        "stages": stage_medians(people),
        "errors": latest_errors(study, identities),
        "withdrawals": withdrawal_counts(study),
        "others": {
            "bots": study.participants.filter(is_bot=True).count(),
            "previews": study.participants.filter(is_preview=True).count(),
        },
    }


def arm_rows(study: Study, people) -> list[dict]:
    statuses = [value for value, _ in Participant.Status.choices]
    counts = {}
    for arm_id, status, n in people.values_list("arm_id", "status").annotate(n=Count("id")):
        counts.setdefault(arm_id, {})[status] = n
    arms = list(study.arms.select_related("endpoint"))
    health = cached_health([arm for arm in arms if arm.active])
    rows = []
    for arm in arms:
        mine = counts.get(arm.pk, {})
        holding = sum(mine.get(s, 0) for s in Participant.ACTIVE)
        state = health.get(arm.pk)
        rows.append(
            {
                "id": arm.pk,
                "name": arm.name,
                "active": arm.active,
                "model": arm.model_name,
                "endpoint": arm.endpoint.name,
                "counts": {s: mine.get(s, 0) for s in statuses},
                "holding": holding,
                "full": holding >= study.target_per_arm,
                "healthy": state.ok if state else None,
                "health": state.detail if state else "inactive: not checked",
            }
        )
    return rows


def active_conversations(people, identities: bool = False) -> list[dict]:
    chatting = (
        people.filter(status=Participant.Status.CHAT)
        .select_related("arm")
        .annotate(
            last=Max("conversation__messages__created_at"),
            sent=Count("conversation__messages", filter=Q(conversation__messages__role="user")),
        )
        .order_by("consented_at")
    )
    now = timezone.now()
    return [
        {
            "participant": p.pk,
            **({"pid": p.prolific_pid} if identities else {}),
            "arm": p.arm.name,
            "started": iso(p.consented_at),
            "last_activity": iso(p.last or p.consented_at),
            "idle_seconds": round((now - (p.last or p.consented_at or now)).total_seconds()),
            "sent": p.sent,
        }
        for p in chatting
    ]


def stage_medians(people) -> dict[str, float | None]:
    """Median seconds of each stage over the people who went through it."""
    fields = list(dict.fromkeys(f for _, a, b in STAGES for f in (a, b)))
    rows = list(people.values_list(*fields))
    medians = {}
    for stage, start, end in STAGES:
        i, j = fields.index(start), fields.index(end)
        spans = [(r[j] - r[i]).total_seconds() for r in rows if r[i] and r[j]]
        medians[stage] = round(median(spans), 1) if spans else None
    return medians


def withdrawal_counts(study: Study) -> dict:
    """Who stopped taking part from inside the study, from the Withdrawal rows (they outlive
    an erasure, so people whose data is gone are still counted): by answer and by step.
    Bots and previews are counted apart, as elsewhere on the monitor."""
    rows = (
        Withdrawal.objects.filter(study=study)
        .exclude(participant__isnull=False, participant__is_bot=True)
        .exclude(participant__isnull=False, participant__is_preview=True)
    )
    counts = {"total": 0, "kept": 0, "erased": 0, "erasure_pending": 0, "unanswered": 0}
    stages: dict[str, int] = {}
    for kept, erased_at, stage in rows.values_list("data_kept", "erased_at", "stage"):
        counts["total"] += 1
        stages[stage] = stages.get(stage, 0) + 1
        if kept is None:
            counts["unanswered"] += 1
        elif kept:
            counts["kept"] += 1
        elif erased_at:
            counts["erased"] += 1
        else:  # asked to be erased and not yet: the researcher must act (the errors say why)
            counts["erasure_pending"] += 1
    labels = dict(Participant.Status.choices)
    counts["by_stage"] = {labels.get(stage, stage): n for stage, n in sorted(stages.items())}
    return counts


def latest_errors(study: Study, identities: bool = False) -> list[dict]:
    errors = study.errors.select_related("participant")[:LATEST_ERRORS]
    return [
        {
            "id": e.pk,
            "at": iso(e.created_at),
            "title": e.title,
            "detail": e.detail,
            "path": e.path,
            "participant": e.participant_id,
            **({"pid": e.participant.prolific_pid if e.participant else ""} if identities else {}),
            "unexpected": bool(e.traceback),
        }
        for e in errors
    ]


def iso(moment) -> str | None:
    return moment.isoformat(timespec="seconds") if moment else None
