"""An annotation study's ratings out of the database: the rows the analysis reads
(studies/analysis/annotation.py), one per rating, and the same rows as CSV and JSON for the
researcher. Raters are numbered, never named by their Prolific id; bots and previews are left
out unless asked for."""

import json

from studies.analysis import Settings
from studies.analysis.annotation import (
    RATING_COLUMNS,
    annotation_report,
    group_of,
    included,
    settings_for,
    sim2real_columns,
)
from studies.analysis.csvfile import to_text
from studies.models import Item, Participant, RatingAssignment, Study, humans_unless

MEASURED = (Item.Kind.LIKERT, Item.Kind.NUMBER)


def scales_of(study: Study) -> dict[str, int | None]:
    """The rated items: Likert points by key, None for a number item."""
    return {
        item.key: item.scale_points if item.kind == Item.Kind.LIKERT else None
        for item in study.questionnaire_items()
        if item.kind in MEASURED
    }


def ratings_of(study: Study, include_bots: bool = False) -> list[dict]:
    raters = humans_unless(study.participants.all(), include_bots)
    number = {
        pk: i
        for i, pk in enumerate(raters.order_by("created_at", "pk").values_list("pk", flat=True), 1)
    }
    rated = (
        RatingAssignment.objects.filter(
            participant__in=raters, status=RatingAssignment.Status.RATED
        )
        .select_related("conversation", "participant")
        .order_by("conversation_id", "participant_id")
    )
    return [
        {
            "conversation": a.conversation_id,
            "origin_study": a.conversation.origin_study_id,
            "rater": number[a.participant_id],
            "source": a.conversation.source,
            "arm": a.conversation.arm,
            "simulator": a.conversation.simulator,
            "gold": a.conversation.gold is not None,
            "attention_passed": a.participant.attention_passed,
            "completed": a.participant.status == Participant.Status.COMPLETED,
            # stopped from inside the study: their ratings are kept only as they allowed, and
            # never analysed (counted among the excluded)
            "withdrawn": a.participant.status == Participant.Status.WITHDRAWN,
            "position": a.position,
            "rated_at": a.rated_at.isoformat() if a.rated_at else None,
            "answers": a.answers or {},
        }
        for a in rated
    ]


def groups_of(study: Study) -> tuple[str, ...]:
    """The pool's groups (arm and source), known before anyone rates: what a plan names."""
    pool = study.rated_conversations.filter(gold__isnull=True)
    return tuple(sorted({group_of(c) for c in pool.values("source", "arm", "simulator")}))


def planned_settings(study: Study, alphas: tuple[float, ...]) -> Settings:
    reverse = tuple(i.key for i in study.questionnaire_items() if i.reverse_coded)
    return settings_for(
        scales_of(study),
        groups_of(study) or None,
        reverse,
        family=study.holm_family,
        alphas=alphas,
        lower_better=study.lower_better_measures(),
    )


def report_of(study: Study, settings: Settings, preregistration: dict | None = None) -> dict:
    reverse = tuple(i.key for i in study.questionnaire_items() if i.reverse_coded)
    return annotation_report(
        ratings_of(study),
        scales_of(study),
        reverse,
        exclude_failed_attention=study.exclude_failed_attention,
        settings=settings,
        preregistration=preregistration,
    )


def answer_keys(study: Study, ratings: list[dict]) -> list[str]:
    keys = [item.key for item in study.questionnaire_items()]
    extra = sorted({k for r in ratings for k in r["answers"]} - set(keys))
    return keys + extra


def ratings_csv(study: Study) -> str:
    """One row per rating; cells a spreadsheet would run as formulas are escaped."""
    ratings = ratings_of(study)
    keys = answer_keys(study, ratings)
    rows = ([r[k] for k in RATING_COLUMNS] + [r["answers"].get(k) for k in keys] for r in ratings)
    return to_text([list(RATING_COLUMNS) + keys, *rows])


def ratings_json(study: Study) -> str:
    return json.dumps({"study": study.slug, "ratings": ratings_of(study)}, indent=2)


def quality_item(study: Study) -> str | None:
    """The item that stands for rated quality: the paper's overall quality, else the first
    Likert item."""
    scales = {k: v for k, v in scales_of(study).items() if v}
    return "overall_quality" if "overall_quality" in scales else next(iter(scales), None)


def sim2real_annotation(study: Study, arms: list[dict]) -> list[dict]:
    """For `study`'s sim-to-real report: what each annotation study that rated its
    conversations says, per arm and source (studies/analysis/annotation.sim2real_columns)."""
    out = []
    rating_studies = Study.objects.filter(
        rated_conversations__origin_study=study, annotation__isnull=False
    ).distinct()
    for rating_study in rating_studies.order_by("pk"):
        quality = quality_item(rating_study)
        if quality is None:
            continue
        kept = included(ratings_of(rating_study), rating_study.exclude_failed_attention)
        mine = [r for r in kept if r["origin_study"] == study.pk]
        if mine:
            columns = sim2real_columns(mine, quality, arms)
            out.append({"study": rating_study.slug, "ratings": len(mine), **columns})
    return out
