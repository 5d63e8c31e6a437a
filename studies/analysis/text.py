"""The report as JSON text or as a readable table for the terminal."""

from __future__ import annotations

import json
from typing import Any


def to_json(report: dict[str, Any], indent: int | None = 2) -> str:
    """Strict JSON: a NaN that slipped through raises instead of writing invalid JSON."""
    return json.dumps(report, indent=indent, allow_nan=False, ensure_ascii=False)


def _num(value, spec: str = ".3f") -> str:
    return "NA" if value is None else format(value, spec)


def _interval(pair, spec: str = ".3f") -> str:
    return f"[{_num(pair[0], spec)}, {_num(pair[1], spec)}]"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    return [line(header), line(["-" * w for w in widths]), *map(line, rows)]


def format_report(report: dict[str, Any]) -> str:
    """Participants, descriptives per arm and measure, comparisons, then notes and errors."""
    lines: list[str] = []
    settings = report["settings"]
    if not report["errors"]:
        people = report["participants"]
        reasons = ", ".join(f"{k} {v}" for k, v in people["excluded"]["by_reason"].items())
        lines.append(
            f"Participants: {people['total']} total, {people['included']} included, "
            f"{people['excluded']['total']} excluded" + (f" ({reasons})" if reasons else "")
        )
        control = next((a["name"] for a in report["arms"] if a["control"]), None)
        scope = "all pairs of arms" if settings["pairs"] == "all" else f"each arm vs {control!r}"
        lines.append(f"Comparisons: {scope}; Holm family: {settings['family']}")
        level = f"{settings['ci_level']:.0%}"
        lines += ["", "Descriptives"]
        rows = [
            [m["name"] + (" (reversed)" if m["reverse"] else ""), arm["name"], str(d["n"])]
            + [_num(d["mean"]), _num(d["sd"]), _interval(d["ci"])]
            for m in report["measures"]
            for arm in report["arms"]
            for d in [arm["measures"][m["name"]]]
        ]
        lines += _table(["measure", "arm", "n", "mean", "sd", f"{level} CI"], rows)
        if report["comparisons"]:
            lines += ["", "Comparisons (Welch t-test; p_holm is Holm-Bonferroni adjusted)"]
            rows = [
                [c["measure"], f"{c['arm']} - {c['reference']}", _num(c["diff"])]
                + [_interval(c["diff_ci"]), _num(c["t"]), _num(c["df"], ".2f")]
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
    for title, items in (("Notes", report["notes"]), ("Errors", report["errors"])):
        if items:
            lines += ["", f"{title}:", *(f"- {item}" for item in items)]
    return "\n".join(lines) + "\n"
