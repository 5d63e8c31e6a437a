"""The report as JSON text or as a readable table for the terminal."""

from __future__ import annotations

import json
from typing import Any

from .plan import tag
from .report import control_named, measure_label


def to_json(report: dict[str, Any], indent: int | None = 2) -> str:
    """Strict JSON: a NaN that slipped through raises instead of writing invalid JSON."""
    return json.dumps(report, indent=indent, allow_nan=False, ensure_ascii=False)


def _num(value, spec: str = ".3f") -> str:
    return "n/a" if value is None else format(value, spec)  # as the admin page writes it


def interval(pair, spec: str = ".3f") -> str:
    """A CI as "[low, high]", or "n/a" when it is undefined (n < 2, zero variance)."""
    if not pair or any(v is None for v in pair):
        return "n/a"
    return f"[{format(pair[0], spec)}, {format(pair[1], spec)}]"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    return [line(header), line(["-" * w for w in widths]), *map(line, rows)]


def with_labels(report: dict[str, Any]) -> dict[str, Any]:
    """The report with every comparison and descriptive labelled (reports stored before labels
    existed name a reverse-coded item bare)."""
    reverse = {m["name"]: m.get("reverse", False) for m in report.get("measures", [])}
    labelled = {**report, "plan_tag": tag(report)}
    labelled["comparisons"] = [
        {**c, "label": measure_label(c["measure"], reverse.get(c["measure"], False))}
        for c in report.get("comparisons", [])
    ]
    control = control_named(report)
    labelled["arms"] = [
        {
            **arm,
            "named_control": arm["name"] == control,
            "measures": {
                name: {**d, "label": measure_label(name, reverse.get(name, False))}
                for name, d in arm["measures"].items()
            },
        }
        for arm in report.get("arms", [])
    ]
    return labelled


def arm_name(arm: dict[str, Any], report: dict[str, Any]) -> str:
    """An arm's name, with "(control)" only for a control that was set."""
    return arm["name"] + (" (control)" if arm["name"] == control_named(report) else "")


def pay_lines(pay: dict[str, Any] | None) -> list[str]:
    """The pay check (studies.analysis.pay) as text lines, if the report carries one."""
    if not pay:
        return []
    return ["", f"Pay: {pay['message']}"]


def format_report(report: dict[str, Any]) -> str:
    """Participants, descriptives per arm and measure, comparisons, then notes and errors."""
    lines: list[str] = []
    report = with_labels(report)
    settings = report["settings"]
    if tag(report):
        lines += [
            tag(report),
            *(f"  differs: {d}" for d in report["preregistration"]["differences"]),
        ]
    if not report["errors"]:
        people = report["participants"]
        reasons = ", ".join(f"{k} {v}" for k, v in people["excluded"]["by_reason"].items())
        lines.append(
            f"Participants: {people['total']} total, {people['included']} included, "
            f"{people['excluded']['total']} excluded" + (f" ({reasons})" if reasons else "")
        )
        scope = "all pairs of arms"
        if settings["pairs"] != "all":
            reference = next((a["name"] for a in report["arms"] if a["control"]), None)
            # "control" only when one was set; otherwise the first arm is just the reference.
            named = "the control arm " if control_named(report) else "the first arm "
            scope = f"each arm vs {named}{reference!r}"
        lines.append(f"Comparisons: {scope}; Holm family: {settings['family']}")
        level = f"{settings['ci_level']:.0%}"
        lines += ["", "Descriptives"]
        rows = [
            [measure_label(m["name"], m["reverse"]), arm_name(arm, report), str(d["n"])]
            + [_num(d["mean"]), _num(d["sd"]), interval(d["ci"])]
            for m in report["measures"]
            for arm in report["arms"]
            for d in [arm["measures"][m["name"]]]
        ]
        lines += _table(["measure", "arm", "n", "mean", "sd", f"{level} CI"], rows)
        if report["comparisons"]:
            lines += ["", "Comparisons (Welch t-test; p_holm is Holm-Bonferroni adjusted)"]
            rows = [
                [c["label"], f"{c['arm']} - {c['reference']}", _num(c["diff"])]
                + [interval(c["diff_ci"]), _num(c["t"]), _num(c["df"], ".2f")]
                + [_num(c["p"], ".4g"), _num(c["p_holm"], ".4g"), c["stars"]]
                + [_num(c["hedges_g"]), c["note"] or ""]
                for c in report["comparisons"]
            ]
            header = ["measure", "arm - reference", "diff", f"{level} CI", "t", "df", "p"]
            lines += _table(header + ["p_holm", "", "g", "note"], rows)
            alphas = ", ".join(
                f"{'*' * (i + 1)} p_holm < {a:g}"
                for i, a in enumerate(sorted(set(settings["alphas"]), reverse=True))
            )
            lines.append(alphas)
    lines += pay_lines(report.get("pay"))
    for title, items in (("Notes", report["notes"]), ("Errors", report["errors"])):
        if items:
            lines += ["", f"{title}:", *(f"- {item}" for item in items)]
    return "\n".join(lines) + "\n"
