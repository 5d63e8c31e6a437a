"""Build the analysis report of a study from a wide table (one row per participant).

The report is a plain JSON-ready dict; the admin, the Celery task, the CLI and
the plots all read it. Its keys (format ``parley.analysis/1``):

- ``format``: "parley.analysis/1".
- ``settings``: the Settings used (``dataclasses.asdict``), so a run can be redone.
- ``software``: versions of numpy, scipy, statsmodels, pandas.
- ``errors``: list of messages; when non-empty nothing was analysed (unknown
  column or control arm, empty table, bad settings) and the lists below are empty.
- ``notes``: list of data warnings (missing and non-numeric cells, out-of-range
  answers in reverse-coded items, unreadable exclusion flags, arms with n < 2).
- ``participants``: ``{total, included, excluded: {total, by_reason: {reason: count}}}``;
  reasons are ``no_arm``, ``unfinished``, ``failed_attention_check`` and may overlap
  (``total`` counts each excluded participant once).
- ``arms``: list in analysis order (the study's order, or first appearance in the
  table), each ``{name, control, participants, measures: {measure: descriptives}}``.
  ``control`` marks the arm the others are compared with: ``settings.control``, or the first
  arm when that is null; only a non-null ``settings.control`` is a control the researcher set,
  and only that one is called "control" on the page and in figures (``control_named``).
  Descriptives are ``{n, mean, sd, se, ci: [low, high], missing, non_numeric, out_of_range,
  note, label}`` (SD with ddof=1, CI t-based at ``settings.ci_level``; values of a
  reverse-coded item are the flipped ones).
- ``measures``: list of ``{name, label, reverse, likert, scale_max, range: [low, high],
  range_from, missing, non_numeric: {count, examples}, out_of_range: {count, examples},
  distribution}``. ``label`` is the name, with " (reversed)" for a reverse-coded item, and is
  what every table and figure shows beside flipped values. ``range`` is the measure's own
  scale for figures: 1..k for a Likert item (``range_from`` "likert"), the range given in
  ``settings.ranges`` ("settings"), else the lowest and highest value analysed ("data"), or
  null with no values. ``distribution`` is null or, for Likert items, ``{arm: {"1": count,
  ..., "k": count}}`` of the answers as given (before reverse coding), included participants only.
- ``comparisons``: list of ``{measure, label, arm, reference, n_arm, n_reference, mean_arm,
  mean_reference, diff, diff_ci: [low, high], t, df, p, family, p_holm, hedges_g,
  flags: {"0.05": bool, "0.01": bool}, stars, favours, note}``. ``diff`` is mean(arm) -
  mean(reference), as R's ``t.test(arm, reference)``. ``flags`` test ``p_holm < alpha``.
  ``favours`` names the arm the difference is better for (higher is better unless the
  measure is in ``settings.lower_better``), or null when there is no difference.
- ``preregistration``: null, or (a plan was given) ``{analysis: "confirmatory" |
  "exploratory", differences, verified, sha256, frozen_at, plan, canonical}``
  (``studies.analysis.plan.label``): confirmatory only when the settings are the frozen plan's.

Any statistic that is not finite is null, and the entry's ``note`` says why.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from itertools import combinations
from typing import Any

import numpy as np
import pandas as pd
import scipy
import statsmodels

from . import plan, stats
from .table import arm_labels, examples, flag_column, numeric_column

FORMAT = "parley.analysis/1"
PAIRS = ("control", "all")
FAMILIES = ("measure", "study")


@dataclass(frozen=True)
class Settings:
    """What to analyse and how. ``control`` defaults to the first arm (study order or
    first appearance in the table); ``pairs="all"`` compares every pair of arms instead."""

    arm_column: str
    measures: tuple[str, ...]
    arms: tuple[str, ...] | None = None
    control: str | None = None
    pairs: str = "control"
    reverse: tuple[str, ...] = ()
    scale_max: int = 7
    scales: dict[str, int] | None = None  # points per item where items differ from scale_max
    likert: tuple[str, ...] | None = None  # None: detect (integers within 1..scale_max)
    # Own range [low, high] of non-Likert measures for figures (a number item's min/max, the
    # outcome's reward range); a Likert item's is always 1..k.
    ranges: dict[str, tuple[float, float]] | None = None
    family: str = "measure"
    alphas: tuple[float, ...] = (0.05, 0.01)
    ci_level: float = 0.95
    attention_column: str = "attention_passed"
    finished_column: str = "finished"
    exclude_failed_attention: bool = True
    exclude_unfinished: bool = True
    lower_better: tuple[str, ...] = ()  # measures where a lower value is the better outcome

    def __post_init__(self):
        # Lists from JSON or the CLI become tuples so the settings stay hashable and frozen.
        for name in ("measures", "arms", "reverse", "likert", "alphas", "lower_better"):
            value = getattr(self, name)
            if isinstance(value, str):  # "helpful" means one measure, not seven letters
                object.__setattr__(self, name, (value,))
            elif value is not None and not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(value))
        if self.scales is not None:
            object.__setattr__(self, "scales", dict(self.scales))
        if self.ranges is not None:
            ranges = {m: tuple(r) if isinstance(r, list) else r for m, r in self.ranges.items()}
            object.__setattr__(self, "ranges", ranges)

    def scale_of(self, measure: str) -> int:
        """Likert points k of a measure (answers 1..k)."""
        return (self.scales or {}).get(measure, self.scale_max)

    def problems(self) -> list[str]:
        found = []
        if not self.measures:
            found.append("no measures given")
        for name in ("measures", "arms"):
            names = getattr(self, name) or ()
            if len(set(names)) != len(names):
                found.append(f"{name} repeat: {list(names)}")
        if self.pairs not in PAIRS:
            found.append(f"pairs must be one of {PAIRS}, not {self.pairs!r}")
        if self.family not in FAMILIES:
            found.append(f"family must be one of {FAMILIES}, not {self.family!r}")
        for name, k in [("scale_max", self.scale_max), *(self.scales or {}).items()]:
            if not isinstance(k, int) or isinstance(k, bool) or k < 2:
                found.append(f"the scale of {name} must be an integer >= 2, not {k!r}")
        if not self.alphas or not all(0 < a < 1 for a in self.alphas):
            found.append(f"alphas must lie strictly between 0 and 1, not {list(self.alphas)}")
        if not 0 < self.ci_level < 1:
            found.append(f"ci_level must lie strictly between 0 and 1, not {self.ci_level}")
        for name, bounds in (self.ranges or {}).items():
            if not _valid_range(bounds):
                found.append(
                    f"the range of {name} must be [low, high] with low < high, not {bounds!r}"
                )
        for name in ("reverse", "likert", "scales", "ranges", "lower_better"):
            unknown = [m for m in getattr(self, name) or () if m not in self.measures]
            if unknown:
                found.append(f"{name} items {unknown} are not among the measures")
        return found


def _valid_range(bounds) -> bool:
    try:
        low, high = (float(b) for b in bounds)
    except (TypeError, ValueError):
        return False
    return math.isfinite(low) and math.isfinite(high) and low < high


def measure_label(name: str, reverse: bool) -> str:
    """What tables and figures call a measure: a reverse-coded item's values are flipped, so
    its name alone would pass them off as the answers given."""
    return f"{name} (reversed)" if reverse else name


def control_named(report: dict[str, Any]) -> str | None:
    """The control arm the researcher set, or None: without one the first arm is only the
    reference of the comparisons and must not be presented as a control."""
    return (report.get("settings") or {}).get("control")


def alpha_key(alpha: float) -> str:
    return f"{alpha:g}"


def finite(value: float) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None


def _pair(values) -> list[float | None]:
    return [finite(v) for v in values]


def _nulls_note(entry: dict, keys: Sequence[str]) -> None:
    """Say which statistics are null when nothing more specific was said."""
    nulls = [k for k in keys if entry[k] is None or entry[k] == [None, None]]
    if nulls and not entry.get("note"):
        entry["note"] = f"not finite, set to null: {', '.join(nulls)}"


def _examples_text(examples: Sequence[str]) -> str:
    return ", ".join(repr(e) for e in examples)


def empty_report(settings: Settings, errors: list[str]) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "settings": {
            k: list(v) if isinstance(v, tuple) else v for k, v in asdict(settings).items()
        },
        "software": {
            "numpy": np.__version__,
            "scipy": scipy.__version__,
            "statsmodels": statsmodels.__version__,
            "pandas": pd.__version__,
        },
        "errors": errors,
        "notes": [],
        "participants": {"total": 0, "included": 0, "excluded": {"total": 0, "by_reason": {}}},
        "arms": [],
        "measures": [],
        "comparisons": [],
        "preregistration": None,
    }


def _table_problems(table: pd.DataFrame, settings: Settings) -> list[str]:
    columns = [str(c) for c in table.columns]
    if not columns:
        return ["the table has no columns (empty CSV?)"]
    found = []
    if settings.arm_column not in table.columns:
        found.append(f"arm column {settings.arm_column!r} not found; columns are: {columns}")
    unknown = [m for m in settings.measures if m not in table.columns]
    if unknown:
        found.append(f"measure columns {unknown} not found; columns are: {columns}")
    repeated = sorted({str(c) for c in table.columns[table.columns.duplicated()]})
    if repeated:
        found.append(f"columns appear more than once: {repeated}")
    if len(table) == 0:
        found.append("the table has no rows")
    return found


# Participants who stopped taking part from inside the study (parley's tables mark them).
WITHDRAWN_COLUMN = "withdrawn"


def _exclusions(table: pd.DataFrame, labels: np.ndarray, settings: Settings, notes: list[str]):
    """Boolean 'included' mask and the count of each exclusion reason (reasons may overlap)."""
    reasons = {"no_arm": labels == ""}
    checks = [
        ("unfinished", settings.finished_column, settings.exclude_unfinished),
        ("failed_attention_check", settings.attention_column, settings.exclude_failed_attention),
    ]
    for reason, column, enabled in checks:
        if not enabled:
            continue
        if column not in table.columns:
            notes.append(f"no {column!r} column: nobody excluded as {reason.replace('_', ' ')}")
            continue
        flag = flag_column(table[column])
        if flag.unreadable:
            notes.append(
                f"column {column!r}: {flag.unreadable} unreadable cells treated as unknown "
                f"(not excluded), e.g. {_examples_text(flag.unreadable_examples)}"
            )
        reasons[reason] = flag.false
    if WITHDRAWN_COLUMN in table.columns:
        # Stopping is the participant's own choice, never the researcher's: always out, and
        # always counted (a table without the column, e.g. another tool's CSV, has none).
        reasons["withdrew"] = flag_column(table[WITHDRAWN_COLUMN]).true
    excluded = np.logical_or.reduce(list(reasons.values()))
    if reasons["no_arm"].any():
        notes.append(f"{int(reasons['no_arm'].sum())} rows have no arm and are excluded")
    return ~excluded, {k: int(v.sum()) for k, v in reasons.items() if v.any()}


def included_rows(table: pd.DataFrame, settings: Settings) -> np.ndarray:
    """Which rows of a participant table the analysis keeps under the settings' exclusion
    rules (a boolean mask): the same participants as the report's own descriptives."""
    labels = arm_labels(table[settings.arm_column])
    return _exclusions(table, labels, settings, [])[0]


def _arm_order(labels: np.ndarray, settings: Settings, notes: list[str]) -> list[str]:
    seen = [a for a in pd.unique(labels) if a != ""]
    if settings.arms is None:
        return seen
    order = [str(a) for a in settings.arms]
    extra = [a for a in seen if a not in order]
    if extra:
        notes.append(f"arms {extra} appear in the data but not in the study; analysed too")
    return order + extra


def _comparison_pairs(arms: list[str], control: str, pairs: str) -> list[tuple[str, str]]:
    """(arm, reference) pairs; the difference is arm - reference."""
    if pairs == "all":
        return [(later, earlier) for earlier, later in combinations(arms, 2)]
    return [(arm, control) for arm in arms if arm != control]


def _is_likert(values: np.ndarray, scale_max: int) -> bool:
    valid = values[np.isfinite(values)]
    return bool(
        valid.size
        and np.all(valid == np.round(valid))
        and valid.min() >= 1
        and valid.max() <= scale_max
    )


def _answer_counts(answers: np.ndarray, scale_max: int) -> dict[str, int]:
    """How many answered each point 1..k; answers off the scale are not counted."""
    on_scale = answers[(answers == np.round(answers)) & (answers >= 1) & (answers <= scale_max)]
    counts = np.bincount(on_scale.astype(int), minlength=scale_max + 1)
    return {str(k): int(counts[k]) for k in range(1, scale_max + 1)}


def _measure(name, column, settings, selections, included, notes):
    """Clean one measure; return its report entry, per-arm values and per-arm cell counts."""
    data = numeric_column(column)
    values = data.values
    out_of_range = np.zeros(values.shape, dtype=bool)
    out_examples: list[str] = []
    reverse = name in settings.reverse
    k = settings.scale_of(name)
    if reverse:
        out_of_range = np.isfinite(values) & ((values < 1) | (values > k))
        out_examples = examples(column, out_of_range & included)
        values = np.where(out_of_range, np.nan, values)
    likert = name in settings.likert if settings.likert is not None else _is_likert(values, k)
    analysed = k + 1 - values if reverse else values

    per_arm, cells, distribution = {}, {}, {} if likert else None
    for arm, selected in selections.items():
        raw = values[selected]
        kept = ~np.isnan(raw)
        per_arm[arm] = analysed[selected][kept]
        cells[arm] = {
            "missing": int(data.missing[selected].sum()),
            "non_numeric": int(data.invalid[selected].sum()),
            "out_of_range": int(out_of_range[selected].sum()),
        }
        if likert:
            distribution[arm] = _answer_counts(raw[kept], k)

    if likert:
        off_scale = sum(len(per_arm[a]) - sum(distribution[a].values()) for a in selections)
        if off_scale:
            notes.append(
                f"measure {name!r}: {off_scale} answers not on the 1..{k} "
                "scale are left out of its distribution"
            )
    missing = int(data.missing[included].sum())
    invalid = int(data.invalid[included].sum())
    bad_range = int(out_of_range[included].sum())
    if missing:
        notes.append(f"measure {name!r}: {missing} missing values dropped")
    invalid_examples = examples(column, data.invalid & included)
    if invalid:
        notes.append(
            f"measure {name!r}: {invalid} non-numeric cells dropped, "
            f"e.g. {_examples_text(invalid_examples)}"
        )
    if bad_range:
        notes.append(
            f"measure {name!r}: {bad_range} answers outside 1..{k} in a "
            f"reverse-coded item dropped, e.g. {_examples_text(out_examples)}"
        )
    bounds, source = _own_range(name, likert, k, analysed[included], settings)
    entry = {
        "name": name,
        "label": measure_label(name, reverse),
        "reverse": reverse,
        "likert": likert,
        "scale_max": k,
        "range": bounds,
        "range_from": source,
        "missing": missing,
        "non_numeric": {"count": invalid, "examples": invalid_examples},
        "out_of_range": {"count": bad_range, "examples": out_examples},
        "distribution": distribution,
    }
    return entry, per_arm, cells


def _own_range(name, likert, k, values, settings):
    """The measure's own scale for figures, and where it came from (see the module docstring)."""
    if likert:
        return [1, k], "likert"
    given = (settings.ranges or {}).get(name)
    if given is not None:
        return [float(given[0]), float(given[1])], "settings"
    seen = values[np.isfinite(values)]
    if not seen.size:
        return None, None
    return [float(seen.min()), float(seen.max())], "data"


def _descriptives(summary: stats.Summary, cells: dict) -> dict:
    entry = {
        "n": summary.n,
        "mean": finite(summary.mean),
        "sd": finite(summary.sd),
        "se": finite(summary.se),
        "ci": _pair(summary.ci),
        **cells,
        "note": summary.note,
    }
    _nulls_note(entry, ("mean", "sd", "se", "ci"))
    return entry


def _compare(measure, arm, reference, x, y, sx, sy, settings) -> dict:
    test = stats.welch(x, y, settings.ci_level)
    entry = {
        "measure": measure,
        "label": measure_label(measure, measure in settings.reverse),
        "arm": arm,
        "reference": reference,
        "n_arm": sx.n,
        "n_reference": sy.n,
        "mean_arm": finite(sx.mean),
        "mean_reference": finite(sy.mean),
        "diff": finite(test.diff),
        "diff_ci": _pair(test.diff_ci),
        "t": finite(test.t),
        "df": finite(test.df),
        "p": finite(test.p),
        "family": measure if settings.family == "measure" else "study",
        "p_holm": None,
        "hedges_g": finite(stats.hedges_g(sx, sy)),
        "flags": {},
        "stars": "",
        "favours": _favours(test.diff, arm, reference, measure in settings.lower_better),
        "note": test.note,
    }
    _nulls_note(entry, ("diff", "diff_ci", "t", "df", "p", "hedges_g"))
    return entry


def _favours(diff: float, arm: str, reference: str, lower_better: bool) -> str | None:
    if not math.isfinite(diff) or diff == 0:
        return None
    return arm if (diff > 0) != lower_better else reference


def _adjust(comparisons: list[dict], alphas: Sequence[float]) -> None:
    """Holm within each family; flags and stars from the adjusted p."""
    families: dict[str, list[dict]] = {}
    for entry in comparisons:
        families.setdefault(entry["family"], []).append(entry)
    for members in families.values():
        adjusted = stats.holm([np.nan if e["p"] is None else e["p"] for e in members])
        for entry, p_holm in zip(members, adjusted, strict=True):
            entry["p_holm"] = finite(p_holm)
            if entry["p_holm"] is None:
                entry["flags"] = {alpha_key(a): None for a in alphas}
                continue
            entry["flags"] = {alpha_key(a): entry["p_holm"] < a for a in alphas}
            entry["stars"] = "*" * sum(entry["flags"].values())


def build_report(
    table: pd.DataFrame, settings: Settings, preregistration: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The full report (see the module docstring) of ``table`` under ``settings``; with a
    pre-registration document (plan, canonical, sha256, frozen_at) it is labelled confirmatory
    or exploratory."""
    report = _build(table, settings)
    report["preregistration"] = plan.label(settings, preregistration)
    return report


def _build(table: pd.DataFrame, settings: Settings) -> dict[str, Any]:
    errors = settings.problems() + _table_problems(table, settings)
    notes: list[str] = []
    if list(table.columns).count(settings.arm_column) == 1:
        labels = arm_labels(table[settings.arm_column])
        arms = _arm_order(labels, settings, notes)
        # Without a control set, the first arm is only the reference of the comparisons.
        control = settings.control if settings.control is not None else (arms[0] if arms else None)
        if not arms:
            errors.append(f"no arm names found in column {settings.arm_column!r}")
        elif control not in arms:
            errors.append(
                f"control arm {control!r} is not among the arms: {', '.join(map(repr, arms))}"
            )
    if errors:
        return empty_report(settings, errors)

    report = empty_report(settings, [])
    report["notes"] = notes
    included, by_reason = _exclusions(table, labels, settings, notes)
    if len(arms) < 2:
        notes.append(f"only one arm ({control!r}): nothing to compare")

    report["participants"] = {
        "total": len(table),
        "included": int(included.sum()),
        "excluded": {"total": int((~included).sum()), "by_reason": by_reason},
    }
    selections = {arm: included & (labels == arm) for arm in arms}
    report["arms"] = [
        {"name": arm, "control": arm == control, "participants": int(selections[arm].sum())}
        for arm in arms
    ]
    for entry in report["arms"]:
        entry["measures"] = {}

    pairs = _comparison_pairs(arms, control, settings.pairs)
    for name in settings.measures:
        entry, per_arm, cells = _measure(name, table[name], settings, selections, included, notes)
        report["measures"].append(entry)
        summaries = {arm: stats.describe(per_arm[arm], settings.ci_level) for arm in arms}
        for arm_entry in report["arms"]:
            arm = arm_entry["name"]
            descriptives = _descriptives(summaries[arm], cells[arm])
            arm_entry["measures"][name] = {**descriptives, "label": entry["label"]}
        for arm, reference in pairs:
            report["comparisons"].append(
                _compare(
                    name,
                    arm,
                    reference,
                    per_arm[arm],
                    per_arm[reference],
                    summaries[arm],
                    summaries[reference],
                    settings,
                )
            )
    _adjust(report["comparisons"], sorted(set(settings.alphas), reverse=True))
    for arm_entry in report["arms"]:
        small = {m: d["n"] for m, d in arm_entry["measures"].items() if d["n"] < 2}
        if small:
            listed = ", ".join(f"{m} (n = {n})" for m, n in small.items())
            notes.append(f"arm {arm_entry['name']!r} has fewer than 2 values for: {listed}")
    return report
