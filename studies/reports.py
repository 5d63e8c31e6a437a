"""The Django side of the analysis: a study's participant table in, AnalysisRun out."""

import csv
import io
import traceback
from dataclasses import asdict

import pandas as pd
from django.db.models import Count, Q
from django.utils import timezone

from .analysis import Settings, build_report
from .analysis.plots import render_all
from .models import AnalysisRun, Item, Participant, Response, Study

OUTCOME = "outcome"


def measures_of(study: Study) -> list[Item]:
    """Likert and number items; attention checks and free text are not measures."""
    return [
        item
        for item in study.questionnaire_items()
        if item.kind in (Item.Kind.LIKERT, Item.Kind.NUMBER)
    ]


def participant_table(study: Study, include_bots: bool = False) -> pd.DataFrame:
    """One row per participant who got past consent: arm, finished, attention, answers, outcome.
    Bot participants are rehearsal data, left out unless asked for."""
    items = measures_of(study)
    rows = {}
    participants = (
        study.participants.exclude(
            status__in=[Participant.Status.NO_CONSENT, Participant.Status.UNSTARTED]
        )
        .filter(is_preview=False)
        .select_related("arm")
    )
    if not include_bots:
        participants = participants.filter(is_bot=False)
    for p in participants.order_by("created_at", "id"):
        rows[p.pk] = {
            "participant": p.prolific_pid,
            "arm": p.arm.name,
            "finished": p.status == Participant.Status.COMPLETED,
            "attention_passed": p.attention_passed,
            **{item.key: None for item in items},
            OUTCOME: (p.outcome or {}).get("reward"),
        }
    keys = {item.id: item.key for item in items}
    responses = Response.objects.filter(participant__in=rows.keys(), item_id__in=keys)
    for participant_id, item_id, value in responses.values_list(
        "participant_id", "item_id", "value_number"
    ):
        rows[participant_id][keys[item_id]] = value
    columns = ["participant", "arm", "finished", "attention_passed", *keys.values(), OUTCOME]
    return pd.DataFrame(list(rows.values()), columns=columns)


def analysis_settings(study: Study, table: pd.DataFrame) -> Settings:
    items = measures_of(study)
    measures = [item.key for item in items]
    if table[OUTCOME].notna().any():
        measures.append(OUTCOME)
    scales = {item.key: item.scale_points for item in items if item.kind == Item.Kind.LIKERT}
    return Settings(
        arm_column="arm",
        measures=tuple(measures),
        arms=tuple(study.arms.order_by("order", "id").values_list("name", flat=True)),
        control=study.control_arm.name if study.control_arm_id else None,
        pairs=study.comparisons,
        reverse=tuple(item.key for item in items if item.reverse_coded),
        scale_max=max(scales.values(), default=7),
        scales=scales,
        likert=tuple(item.key for item in items if item.kind == Item.Kind.LIKERT),
        family=study.holm_family,
    )


def compute(run: AnalysisRun) -> AnalysisRun:
    run.status, run.started_at = AnalysisRun.Status.RUNNING, timezone.now()
    run.save(update_fields=["status", "started_at"])
    try:
        table = participant_table(run.study)
        settings = analysis_settings(run.study, table)
        run.settings = asdict(settings)
        run.inputs = {"participants": len(table), "csv": table.to_csv(index=False)}
        run.results = build_report(table, settings)
        run.figures = render_all(run.results, "svg") if not run.results["errors"] else {}
        run.status = AnalysisRun.Status.DONE
    except Exception:  # noqa: BLE001 - a failed run is stored with its traceback, not lost
        run.status, run.error = AnalysisRun.Status.FAILED, traceback.format_exc()
    run.finished_at = timezone.now()
    run.save()
    return run


def target_reached(study: Study) -> bool:
    arms = study.arms.filter(active=True).annotate(
        done=Count(
            "participants",
            filter=Q(
                participants__status=Participant.Status.COMPLETED,
                participants__is_bot=False,
                participants__is_preview=False,
            ),
        )
    )
    return bool(arms) and all(arm.done >= study.target_per_arm for arm in arms)


def comparisons_csv(report: dict) -> str:
    """The comparisons table and the descriptives, one CSV for a spreadsheet."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(
        [
            "measure",
            "arm",
            "reference",
            "n_arm",
            "n_reference",
            "mean_arm",
            "mean_reference",
            "diff",
            "diff_ci_low",
            "diff_ci_high",
            "t",
            "df",
            "p",
            "p_holm",
            "hedges_g",
            "p_holm<0.05",
            "p_holm<0.01",
            "note",
        ]
    )
    for c in report.get("comparisons", []):
        low, high = c.get("diff_ci") or (None, None)
        flags = c.get("flags") or {}
        writer.writerow(
            [
                c["measure"],
                c["arm"],
                c["reference"],
                c["n_arm"],
                c["n_reference"],
                c["mean_arm"],
                c["mean_reference"],
                c["diff"],
                low,
                high,
                c["t"],
                c["df"],
                c["p"],
                c["p_holm"],
                c["hedges_g"],
                flags.get("0.05"),
                flags.get("0.01"),
                c.get("note") or "",
            ]
        )
    writer.writerow([])
    writer.writerow(["arm", "measure", "n", "mean", "sd", "ci_low", "ci_high", "missing", "note"])
    for arm in report.get("arms", []):
        for measure, d in arm["measures"].items():
            low, high = d.get("ci") or (None, None)
            writer.writerow(
                [
                    arm["name"],
                    measure,
                    d["n"],
                    d["mean"],
                    d["sd"],
                    low,
                    high,
                    d.get("missing"),
                    d.get("note") or "",
                ]
            )
    return out.getvalue()
