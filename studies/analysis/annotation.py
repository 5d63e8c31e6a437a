"""The analysis of an annotation study: raters' answers about conversations.

The unit is the conversation: each item's answers are averaged over the conversation's raters,
and the conversations are grouped by arm and source ("base · people", "base · vs-user"). The
group means, their 95% CIs, the Welch tests between every pair of groups and Holm's correction
are the chat studies' own (report.build_report, on that table). Beside them:

- agreement: Krippendorff's alpha per Likert item (ordinal, on the item's whole scale) with a
  bootstrap interval over conversations (agreement.py); reverse coding does not change alpha
  (a reflection keeps every distance).
- realism: per source (people, each simulator) and per group, the share of ratings that
  judged the user a real person, with the exact binomial interval. Each rating counts as one
  judgement; raters who rated several conversations of one source make these not quite
  independent, which the interval does not model.

Raters who missed a gold conversation are left out when the study excludes failed attention.
Nothing here knows about Django.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict
from typing import Any

import numpy as np
import pandas as pd

from studies.analysis.agreement import agreement, binomial_rate, kendall_tau_b
from studies.analysis.report import Settings, build_report
from studies.analysis.sim2real import descriptives, ranked

# A ratings CSV's columns before the answers, in order: studies/annotation/analysis.py writes
# them (the export) and annotation_cli.py reads the rest of a row as answers.
RATING_COLUMNS = (
    "conversation",
    "rater",
    "source",
    "arm",
    "simulator",
    "gold",
    "attention_passed",
    "completed",
    "position",
    "rated_at",
)

GROUP = "group"
PEOPLE = "people"
REAL = "real"  # the realism item's answer that counts toward "judged human"


def source_label(rating: dict) -> str:
    return PEOPLE if rating["source"] == "person" else rating.get("simulator") or "simulator"


def group_of(rating: dict) -> str:
    arm = rating.get("arm") or ""
    return f"{arm} · {source_label(rating)}" if arm else source_label(rating)


def included(ratings: list[dict], exclude_failed_attention: bool) -> list[dict]:
    return [
        r
        for r in ratings
        if not (exclude_failed_attention and r.get("attention_passed") is False)
        and not r.get("gold")
        and not r.get("withdrawn")  # the rater stopped taking part: never analysed
    ]


def conversation_table(ratings: list[dict], items: list[str]) -> pd.DataFrame:
    """One row per conversation: its group, how many rated it, and each item's mean answer."""
    by_conversation: dict[Any, list[dict]] = defaultdict(list)
    for rating in ratings:
        by_conversation[rating["conversation"]].append(rating)
    rows = []
    for conversation, rated in by_conversation.items():
        row = {"conversation": conversation, GROUP: group_of(rated[0]), "raters": len(rated)}
        for item in items:
            values = [_number(r["answers"].get(item)) for r in rated]
            values = [v for v in values if v is not None]
            row[item] = float(np.mean(values)) if values else np.nan
        rows.append(row)
    columns = ["conversation", GROUP, "raters", *items]
    return pd.DataFrame(rows, columns=columns)


def settings_for(
    scales: dict[str, int | None],
    groups: tuple[str, ...] | None,
    reverse: tuple[str, ...] = (),
    **chosen,
) -> Settings:
    """The chat report's settings on the conversation table: every pair of groups (arm and
    source), the items as measures on their own scales. `chosen`: family, alphas and the like,
    as the study sets them; what a plan freezes."""
    return Settings(
        arm_column=GROUP,
        measures=tuple(scales),
        arms=groups,
        pairs="all",
        reverse=tuple(r for r in reverse if r in scales),
        scales={k: v for k, v in scales.items() if v},
        likert=(),  # conversation means, not single answers
        ranges={k: (1.0, float(v)) for k, v in scales.items() if v},
        exclude_failed_attention=False,  # raters are left out before the table, not conversations
        exclude_unfinished=False,
        **chosen,
    )


def annotation_report(
    ratings: list[dict],
    scales: dict[str, int | None],
    reverse: tuple[str, ...] = (),
    exclude_failed_attention: bool = True,
    boot: int = 1000,
    seed: int = 0,
    settings: Settings | None = None,
    preregistration: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The report: `scales` names the rated items, each with its Likert points (None for a
    number item). The chat report's keys, plus "annotation" (agreement, realism, counts).
    `settings`: the study's (or its frozen plan's); by default the groups the ratings have.
    With a pre-registration document the report is labelled confirmatory or exploratory."""
    kept = included(ratings, exclude_failed_attention)
    items = list(scales)
    table = conversation_table(kept, items)
    if settings is None:
        groups = tuple(sorted(table[GROUP].unique())) if len(table) else None
        settings = settings_for(scales, groups, reverse)
    report = build_report(table, settings, preregistration)
    report["annotation"] = {
        "conversations": int(len(table)),
        "raters": len({r["rater"] for r in kept}),
        "ratings": len(kept),
        "excluded_ratings": len(ratings) - len(kept),
        "withdrawn_ratings": sum(bool(r.get("withdrawn")) for r in ratings),
        "agreement": {
            item: asdict(
                agreement(
                    [
                        (r["conversation"], r["rater"], _number(r["answers"].get(item)))
                        for r in kept
                    ],
                    "ordinal",
                    domain=range(1, points + 1),
                    boot=boot,
                    seed=seed,
                )
            )
            for item, points in scales.items()
            if points
        },
        "realism": realism(kept),
    }
    return report


def realism(ratings: list[dict]) -> dict[str, dict]:
    """Judged-human rates by source and by group, over the ratings that answered the item."""
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for rating in ratings:
        answer = rating["answers"].get("real_person")
        if answer is None:
            continue
        for key in (f"source:{source_label(rating)}", f"group:{group_of(rating)}"):
            counts[key][0] += answer == REAL
            counts[key][1] += 1
    out: dict[str, dict] = {"by_source": {}, "by_group": {}}
    for key, (k, n) in sorted(counts.items()):
        kind, name = key.split(":", 1)
        out["by_" + kind][name] = asdict(binomial_rate(k, n))
    return out


def _number(value) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if np.isfinite(number) else None


def sim2real_columns(
    ratings: list[dict], quality: str, arms: list[dict], ci_level: float = 0.95
) -> dict[str, Any]:
    """What raters add to the sim-to-real report: per arm, the rated `quality` (over
    conversations) and the judged-human rate of people's conversations and of each simulator's,
    and the arms ranked by raters (people's conversations) against by participants (their
    outcome) and by simulators (their reward), each with Kendall's tau-b. `arms` are the
    sim-to-real report's own."""
    table = conversation_table(ratings, [quality])
    by_arm: dict[str, dict[str, dict]] = defaultdict(dict)
    rates = realism(ratings)["by_group"]
    for group, rows in table.groupby(GROUP):
        values = [v for v in rows[quality] if not np.isnan(v)]
        arm, _, source = group.rpartition(" · ")
        by_arm[arm or group][source or group] = {
            "quality": descriptives(values, ci_level),
            "realism": rates.get(group),
        }
    raters = {
        arm: sources[PEOPLE]["quality"]["mean"]
        for arm, sources in by_arm.items()
        if PEOPLE in sources and sources[PEOPLE]["quality"]["mean"] is not None
    }
    participants = {a["name"]: a["human"]["outcome"]["mean"] for a in arms}
    simulators = {a["name"]: a["simulated"]["reward"]["mean"] for a in arms}
    return {
        "quality": quality,
        "arms": {arm: by_arm[arm] for arm in sorted(by_arm)},
        "ranking": {
            "raters": ranked(raters),
            "against_participants": asdict(kendall_tau_b(raters, _known(participants))),
            "against_simulators": asdict(kendall_tau_b(raters, _known(simulators))),
        },
    }


def _known(means: dict[str, float | None]) -> dict[str, float]:
    return {arm: mean for arm, mean in means.items() if mean is not None}
