"""The Django side of the analysis: a study's participant table in, AnalysisRun out."""

import logging
import traceback
from collections.abc import Callable
from dataclasses import asdict, replace

import pandas as pd
from django.db.models import Count, Q
from django.utils import timezone

from studies.analysis import Settings, build_report, csvfile, pay, power
from studies.analysis.plots import render_all
from studies.analysis.report import control_named
from studies.analysis.sim2real_behaviour import shares_rows
from studies.annotation import analysis as annotation_analysis
from studies.lib.domain_bridge import shared_domain
from studies.lib.prepared_queries import Prepared
from studies.models import (
    AnalysisRun,
    Arm,
    ConsentVersion,
    Item,
    Participant,
    Response,
    Study,
    Withdrawal,
    humans_unless,
    only_people,
)

OUTCOME = "outcome"
log = logging.getLogger(__name__)


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
        .exclude(withdrawal__erased_at__isnull=False)  # counted apart, as erased withdrawals
        .select_related("arm")
    )
    for p in humans_unless(participants, include_bots).order_by("created_at", "id"):
        rows[p.pk] = {
            "participant": p.prolific_pid,
            "arm": p.arm.name,
            "finished": p.status == Participant.Status.COMPLETED,
            "attention_passed": p.attention_passed,
            "withdrawn": p.status == Participant.Status.WITHDRAWN,
            **{item.key: None for item in items},
            OUTCOME: (p.outcome or {}).get("reward"),
        }
    keys = {item.id: item.key for item in items}
    responses = Response.objects.filter(participant__in=rows.keys(), item_id__in=keys)
    for participant_id, item_id, value in responses.values_list(
        "participant_id", "item_id", "value_number"
    ):
        rows[participant_id][keys[item_id]] = value
    columns = [
        "participant",
        "arm",
        "finished",
        "attention_passed",
        "withdrawn",
        *keys.values(),
        OUTCOME,
    ]
    return pd.DataFrame(list(rows.values()), columns=columns)


ERASED_WITHDRAWALS = "withdrew_data_erased"  # an exclusion reason: stopped, and erased


def count_erased_withdrawals(study: Study, results: dict) -> None:
    """People who withdrew and had their data erased are in no table, yet the report counts
    them among the exclusions, so nobody leaves the analysis silently."""
    # Those whose erasure is still pending are in the table, as "withdrew".
    erased = (
        Withdrawal.objects.filter(study=study, data_kept=False, erased_at__isnull=False)
        .exclude(participant__isnull=False, participant__is_bot=True)
        .exclude(participant__isnull=False, participant__is_preview=True)
        .count()
    )
    counts = results.get("participants")
    if not erased or not counts:
        return
    counts["total"] += erased
    counts["excluded"]["total"] += erased
    counts["excluded"]["by_reason"][ERASED_WITHDRAWALS] = erased


def analysis_settings(study: Study, table: pd.DataFrame) -> Settings:
    """The study's settings as they stand, for the participants in the table."""
    return study_settings(study, with_outcome=bool(table[OUTCOME].notna().any()))


def planned_settings(study: Study) -> Settings:
    """The settings a plan freezes: the outcome is a measure whenever the study has a task; an
    annotation study's are on its conversations, by arm and source."""
    if hasattr(study, "annotation"):
        alphas = tuple(sorted({study.alpha, *DEFAULT_ALPHAS}, reverse=True))
        return annotation_analysis.planned_settings(study, alphas)
    return study_settings(study, with_outcome=shared_domain(study.domain) is not None)


# Flag levels every report shows; a study's own alpha is added when it is another.
DEFAULT_ALPHAS = (0.05, 0.01)


def study_settings(study: Study, with_outcome: bool) -> Settings:
    items = measures_of(study)
    measures = [item.key for item in items]
    if with_outcome:
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
        ranges=own_ranges(study, items, measures),
        family=study.holm_family,
        alphas=tuple(sorted({study.alpha, *DEFAULT_ALPHAS}, reverse=True)),
        exclude_failed_attention=study.exclude_failed_attention,
        exclude_unfinished=study.exclude_unfinished,
        lower_better=tuple(m for m in study.lower_better_measures() if m in measures),
    )


def chosen_settings(
    study: Study, measures: list[str], pairs: str, family: str, control: str | None
) -> Settings:
    """The study's settings with other measures, comparisons, family or control: what a
    researcher asks for beside the plan (its report says exploratory in a frozen study)."""
    base = planned_settings(study)
    chosen = tuple(m for m in measures if m in base.measures)
    return replace(
        base,
        measures=chosen,
        pairs=pairs,
        family=family,
        control=control or None,
        reverse=tuple(m for m in base.reverse if m in chosen),
        likert=tuple(m for m in base.likert or () if m in chosen),
        scales={m: k for m, k in (base.scales or {}).items() if m in chosen},
        ranges={m: r for m, r in (base.ranges or {}).items() if m in chosen},
        lower_better=tuple(m for m in base.lower_better if m in chosen),
    )


def study_power(study: Study) -> power.Power | None:
    """Participants per arm the study needs for its target effect at its alpha, Holm's worst
    case over its planned family; None when its settings cannot give one (said by clean)."""
    settings = planned_settings(study)
    family = power.family_size(
        study.arms.count(), settings.pairs, settings.family, len(settings.measures)
    )
    try:
        return power.n_per_arm(study.target_effect, study.alpha, family, study.target_power)
    except power.PowerError:
        return None


def power_warning(study: Study) -> str:
    """Said where the study is set up when its target per arm is below what the power needs."""
    found = study_power(study)
    if found is None or study.target_per_arm >= found.n_per_arm:
        return ""
    return (
        f"The target of {study.target_per_arm} per arm is below the {found.n_per_arm} needed to "
        f"detect g = {found.effect:g} with power {found.power:g} at alpha {found.alpha:g} / "
        f"{found.family} (Holm's first step)."
    )


def own_ranges(study: Study, items: list[Item], measures: list[str]) -> dict:
    """Each number measure's own scale for the figures: a number item's min..max when both are
    set, the Domain's reward range for the outcome; others are drawn on the values seen."""
    ranges = {
        item.key: (item.min_value, item.max_value)
        for item in items
        if item.kind == Item.Kind.NUMBER
        and item.min_value is not None
        and item.max_value is not None
        and item.min_value < item.max_value
    }
    domain = shared_domain(study.domain)
    if OUTCOME in measures and domain is not None:
        ranges[OUTCOME] = tuple(domain.reward_range)
    return ranges


# A further section of a run's report: its key in the results, its figures by name.
Section = Callable[[Study], tuple[dict, dict[str, str]]]


def compute(run: AnalysisRun, sections: dict[str, Section] | None = None) -> AnalysisRun:
    """Compute the run's report; `sections` add more of it by key (the sim-to-real gap, which
    lives above this module), each with its figures. A run deleted meanwhile comes back with
    no pk."""
    run.status, run.started_at = AnalysisRun.Status.RUNNING, timezone.now()
    run.save(update_fields=["status", "started_at"])
    try:
        if hasattr(run.study, "annotation"):  # raters' answers about conversations
            return _finish(run, *_annotation_results(run.study))
        table = participant_table(run.study)
        frozen = run.study.preregistered()
        # Settings asked for (an exploratory run), else the frozen plan's, else the study's.
        if run.settings:
            settings = Settings(**run.settings)
        elif frozen is not None:
            settings = Settings(**frozen.plan["analysis"])
        else:
            settings = analysis_settings(run.study, table)
        run.settings = asdict(settings)
        run.inputs = {"participants": len(table), "csv": csvfile.table_text(table)}
        document = plan_document(frozen) if frozen is not None else None
        run.results = build_report(table, settings, document)
        count_erased_withdrawals(run.study, run.results)
        run.results["pay"] = pay_check(run.study).to_dict()
        run.figures = render_all(run.results, "svg") if not run.results["errors"] else {}
        for key, section in (sections or {}).items():
            try:
                run.results[key], figures = section(run.study)
            except Exception as error:  # noqa: BLE001 - the Welch report stands without it
                log.exception("section %s of %s failed", key, run)
                run.results[key], figures = {"errors": [f"not computed: {error!r}"]}, {}
            run.figures.update(figures)
        run.status = AnalysisRun.Status.DONE
    except Exception:  # noqa: BLE001 - a failed run is stored with its traceback, not lost
        run.status, run.error = AnalysisRun.Status.FAILED, traceback.format_exc()
    return _store(run)


def _annotation_results(study: Study) -> tuple[dict, dict, dict]:
    """An annotation study's report (studies/analysis/annotation.py), its inputs and figures:
    on its frozen plan's settings when it is pre-registered, labelled as a chat study's is."""
    frozen = study.preregistered()
    if frozen is not None:
        settings, document = Settings(**frozen.plan["analysis"]), plan_document(frozen)
    else:
        settings, document = planned_settings(study), None
    results = annotation_analysis.report_of(study, settings, document)
    results["pay"] = pay_check(study).to_dict()
    inputs = {
        "ratings": results["annotation"]["ratings"],
        "csv": annotation_analysis.ratings_csv(study),
    }
    figures = render_all(results, "svg") if not results["errors"] else {}
    return results, inputs, figures


def _finish(run: AnalysisRun, results: dict, inputs: dict, figures: dict) -> AnalysisRun:
    run.results, run.inputs, run.figures = results, inputs, figures
    run.settings = results["settings"]
    run.status = AnalysisRun.Status.DONE
    return _store(run)


def _store(run: AnalysisRun) -> AnalysisRun:
    run.finished_at = timezone.now()
    # An UPDATE only: save() inserts a run deleted meanwhile (from the admin, or with its study)
    # again, or fails on its study's foreign key.
    computed = ["status", "settings", "inputs", "results", "figures", "error", "finished_at"]
    if not AnalysisRun.objects.filter(pk=run.pk).update(**{f: getattr(run, f) for f in computed}):
        log.info("analysis run %s was deleted while it was computed", run.pk)
        run.pk = None  # as Django leaves a deleted instance
    return run


def plan_document(frozen) -> dict:
    """A Preregistration as exported: its plan, canonical text, SHA-256 and time."""
    return {
        "format": "parley.preregistration/1",
        "study": frozen.study.slug,
        "frozen_at": frozen.frozen_at.isoformat(),
        "frozen_by": frozen.frozen_by,
        "sha256": frozen.sha256,
        "canonical": frozen.canonical,
        "plan": frozen.plan,
        # Outside the hash: every consent text participants have agreed to so far.
        "consent_versions": consent_versions(frozen.study),
    }


def consent_versions(study: Study) -> list[dict]:
    """The study's consent versions, oldest first, each with how many people agreed to it."""
    versions = (
        ConsentVersion.objects.filter(study=study)
        .annotate(agreed=Count("participants", filter=only_people("participants")))
        .order_by("version")
    )
    return [
        {
            "version": v.version,
            "sha256": v.sha256,
            "created_at": v.created_at.isoformat(),
            "reconstructed": v.reconstructed,
            "participants": v.agreed,
        }
        for v in versions
    ]


# Each active arm's completed people, compiled once (studies/lib/prepared_queries.py): every
# completion asks, and compiling the annotated query cost more than running it.
DONE_PER_ARM = Prepared(
    lambda study_id: (
        Arm.objects.filter(study_id=study_id, active=True)
        .order_by()
        .annotate(
            done=Count(
                "participants",
                filter=Q(participants__status=Participant.Status.COMPLETED)
                & only_people("participants"),
            )
        )
        .values_list("done")
    ),
    1,
)


def target_reached(study: Study) -> bool:
    done = [row[0] for row in DONE_PER_ARM.rows(study.pk)]
    return bool(done) and all(count >= study.target_per_arm for count in done)


def completion_seconds(study: Study) -> list[float]:
    """Arrival to completion of every completed (human) participant, in seconds: Prolific's clock
    runs from when the participant opens the study, so reading the consent is paid time."""
    done = study.participants.filter(
        only_people(), status=Participant.Status.COMPLETED, completed_at__isnull=False
    )
    return [
        (completed - arrived).total_seconds()
        for arrived, completed in done.values_list("created_at", "completed_at")
    ]


def pay_check(study: Study) -> pay.PayCheck:
    """The study's reward against Prolific's hourly rates at its median completion time."""
    return pay.check(study.reward, study.reward_currency, completion_seconds(study))


COMPARISON_COLUMNS = [
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
    "reversed",
]
DESCRIPTIVE_COLUMNS = [
    "arm",
    "measure",
    "n",
    "mean",
    "sd",
    "ci_low",
    "ci_high",
    "missing",
    "note",
    "reversed",
    "control",
]


def comparisons_csv(report: dict) -> str:
    """The comparisons table and the descriptives, one CSV for a spreadsheet. The measure cell
    is the item key as it is (scripts join on it); a reverse-coded item's values are the flipped
    ones, which its "reversed" column says. An undefined CI is left empty."""
    reverse = {m["name"]: m.get("reverse", False) for m in report.get("measures", [])}
    control = control_named(report)  # "control" only for a control arm that was set
    rows: list[list] = [COMPARISON_COLUMNS]
    for c in report.get("comparisons", []):
        low, high = c.get("diff_ci") or (None, None)
        flags = c.get("flags") or {}
        rows.append(
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
                reverse.get(c["measure"], False),
            ]
        )
    rows += [[], DESCRIPTIVE_COLUMNS]
    for arm in report.get("arms", []):
        for measure, d in arm["measures"].items():
            low, high = d.get("ci") or (None, None)
            rows.append(
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
                    reverse.get(measure, False),
                    arm["name"] == control,
                ]
            )
    # the sim-to-real behaviour section: each simulator's cluster shares beside the people's
    behaviour = shares_rows((report.get("sim2real") or {}).get("behaviour") or {})
    if behaviour:
        rows += [[], ["sim-to-real behaviour"], *behaviour]
    return csvfile.to_text(rows)
