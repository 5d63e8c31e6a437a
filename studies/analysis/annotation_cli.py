"""``python -m studies.analysis.annotation_cli --ratings FILE --scales item=points,...``: an
annotation study's report from its ratings CSV (the study page's ratings.csv, one row per
rating), without Django: the chat report on conversations by arm and source, then Krippendorff's
alpha per item and the judged-human rates."""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from .annotation import RATING_COLUMNS, annotation_report
from .cli import _names, _scales
from .csvfile import restore
from .text import format_report, to_json


def read_ratings(path: str) -> list[dict]:
    table = pd.read_csv(path, dtype=str, keep_default_na=False)
    missing = [c for c in ("conversation", "rater", "source") if c not in table.columns]
    if missing:
        raise ValueError(f"{path} is not a ratings CSV: no column {', '.join(missing)}")
    answers = [c for c in table.columns if c not in RATING_COLUMNS]
    return [
        {
            "conversation": row["conversation"],
            "rater": row["rater"],
            "source": row["source"],
            "arm": restore(row.get("arm", "")),
            "simulator": restore(row.get("simulator", "")),
            "gold": row.get("gold") == "True",
            "attention_passed": {"True": True, "False": False}.get(row.get("attention_passed")),
            "answers": {k: _value(row[k]) for k in answers if row[k] != ""},
        }
        for row in table.to_dict("records")
    ]


def _value(text: str):
    try:
        return float(text)
    except ValueError:
        return restore(text)


def format_annotation(report: dict) -> str:
    a = report["annotation"]
    lines = [
        f"\n{a['conversations']} conversations, {a['raters']} raters, {a['ratings']} ratings "
        f"({a['excluded_ratings']} left out)"
    ]
    for item, g in a["agreement"].items():
        alpha = g.get("note") or "n/a" if g["alpha"] is None else f"{g['alpha']:.3f}"
        ci = "" if not g["ci"] else f" [{g['ci'][0]:.3f}, {g['ci'][1]:.3f}]"
        lines.append(f"Krippendorff's alpha (ordinal), {item}: {alpha}{ci}")
    for name, r in a["realism"]["by_source"].items():
        lines.append(
            f"judged a real person, {name}: {r['k']} of {r['n']} = {r['rate']:.3f} "
            f"[{r['ci'][0]:.3f}, {r['ci'][1]:.3f}]"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.analysis.annotation_cli")
    parser.add_argument("--ratings", required=True, help="the ratings CSV, one row per rating")
    parser.add_argument(
        "--scales",
        type=_scales,
        required=True,
        help="the rated items with their Likert points (item=7,...); 0 for a number",
    )
    parser.add_argument("--reverse", type=_names, default=(), help="reverse-coded items")
    parser.add_argument(
        "--keep-failed-attention",
        action="store_true",
        help="keep raters who missed an attention check or gold conversation",
    )
    parser.add_argument("--json", action="store_true", help="the report as JSON")
    options = parser.parse_args(argv)
    try:
        ratings = read_ratings(options.ratings)
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    scales = {k: (v or None) for k, v in options.scales.items()}
    report = annotation_report(ratings, scales, options.reverse, not options.keep_failed_attention)
    sys.stdout.write(
        to_json(report) + "\n"
        if options.json
        else format_report(report) + format_annotation(report)
    )
    for error in report["errors"]:
        print(f"error: {error}", file=sys.stderr)
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
