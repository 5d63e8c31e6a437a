"""Command-line analysis of any CSV: shared by ``manage.py analyze`` and ``python -m studies.analysis``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .report import FAMILIES, PAIRS, Settings, build_report, empty_report
from .table import TableError, read_csv
from .text import format_report, to_json


def _names(text: str | None) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip()) if text else ()


def _alphas(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(a) for a in _names(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--alpha takes numbers like 0.05,0.01: {exc}") from exc


def _scales(text: str) -> dict[str, int]:
    try:
        return {name.strip(): int(k) for name, k in (pair.split("=") for pair in _names(text))}
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--scales takes item=points pairs: {exc}") from exc


def _ranges(text: str) -> dict[str, tuple[float, float]]:
    try:
        found = {}
        for pair in _names(text):
            name, bounds = pair.split("=")
            low, high = bounds.split(":")
            found[name.strip()] = (float(low), float(high))
        return found
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"--ranges takes measure=low:high pairs, e.g. outcome=0:1: {exc}"
        ) from exc


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--csv", required=True, help="wide CSV: one row per participant")
    parser.add_argument("--arm-column", required=True, help="column naming each row's arm")
    parser.add_argument("--measures", required=True, help="comma-separated measure columns")
    parser.add_argument(
        "--control", help="control arm (default: the first arm in order of appearance)"
    )
    parser.add_argument(
        "--arms", help="comma-separated arms in analysis order (default: order of appearance)"
    )
    parser.add_argument(
        "--lower-better", default="", help="comma-separated measures where lower is better"
    )
    parser.add_argument(
        "--pairs",
        choices=PAIRS,
        default="control",
        help="compare each arm with the control (default) or all pairs of arms",
    )
    parser.add_argument("--reverse", default="", help="comma-separated reverse-coded items")
    parser.add_argument(
        "--scale-max", type=int, default=7, help="Likert points k (answers 1..k); default 7"
    )
    parser.add_argument(
        "--scales", type=_scales, help="points of items whose scale differs, e.g. calm=5,trust=9"
    )
    parser.add_argument(
        "--ranges",
        type=_ranges,
        help="own scale of non-Likert measures for the figures, e.g. outcome=0:1,donation=0:2",
    )
    parser.add_argument(
        "--likert", help="comma-separated Likert items (default: integer measures within 1..k)"
    )
    parser.add_argument(
        "--family", choices=FAMILIES, default="measure", help="Holm family (default: measure)"
    )
    parser.add_argument(
        "--alpha", type=_alphas, default=(0.05, 0.01), help="flag levels (default 0.05,0.01)"
    )
    parser.add_argument("--ci-level", type=float, default=0.95, help="default 0.95")
    parser.add_argument("--attention-column", default="attention_passed")
    parser.add_argument("--finished-column", default="finished")
    parser.add_argument(
        "--keep-failed-attention", action="store_true", help="do not exclude failed checks"
    )
    parser.add_argument(
        "--keep-unfinished", action="store_true", help="do not exclude unfinished participants"
    )
    parser.add_argument("--delimiter", default=",", help="CSV field separator (default ',')")
    parser.add_argument("--figures", help="folder to write the figures to (PNG and SVG)")
    parser.add_argument("--json", action="store_true", help="print the JSON report")
    parser.add_argument(
        "--plan",
        help="a study's preregistration.json: the report says whether it is the plan's "
        "(confirmatory) analysis or an exploratory one",
    )


def settings_from(options: dict[str, Any]) -> Settings:
    return Settings(
        arm_column=options["arm_column"],
        measures=_names(options["measures"]),
        arms=_names(options["arms"]) if options.get("arms") else None,
        control=options.get("control"),
        pairs=options.get("pairs", "control"),
        reverse=_names(options.get("reverse")),
        scale_max=options.get("scale_max", 7),
        scales=options.get("scales"),
        ranges=options.get("ranges"),
        likert=_names(options["likert"]) if options.get("likert") else None,
        family=options.get("family", "measure"),
        alphas=tuple(options.get("alpha", (0.05, 0.01))),
        ci_level=options.get("ci_level", 0.95),
        attention_column=options.get("attention_column", "attention_passed"),
        finished_column=options.get("finished_column", "finished"),
        exclude_failed_attention=not options.get("keep_failed_attention", False),
        exclude_unfinished=not options.get("keep_unfinished", False),
        lower_better=_names(options.get("lower_better")),
    )


def read_plan(path: str) -> dict[str, Any]:
    """A pre-registration document as exported (plan, canonical, sha256, frozen_at)."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
        missing = [k for k in ("plan", "canonical", "sha256", "frozen_at") if k not in document]
    except (OSError, ValueError, TypeError) as exc:
        raise TableError(f"cannot read the plan {path}: {exc}") from exc
    if missing:
        raise TableError(f"{path} is not a preregistration document: no {', '.join(missing)}")
    return document


def write_figures(report: dict[str, Any], folder: str) -> list[Path]:
    from .plots import render_all  # matplotlib only when figures are asked for

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for fmt in ("png", "svg"):
        for name, content in render_all(report, fmt).items():
            path = out / f"{name}.{fmt}"
            if isinstance(content, bytes):
                path.write_bytes(content)
            else:
                path.write_text(content, encoding="utf-8")
            written.append(path)
    return written


def run(options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The printed output and the report; every input problem, an unreadable CSV
    included, is in ``report["errors"]``."""
    settings = settings_from(options)
    try:
        table = read_csv(options["csv"], options.get("delimiter", ","))
        document = read_plan(options["plan"]) if options.get("plan") else None
    except TableError as exc:
        report = empty_report(settings, [str(exc)])
    else:
        report = build_report(table, settings, document)
    if options.get("figures") and not report["errors"]:
        write_figures(report, options["figures"])
    return (to_json(report) + "\n" if options.get("json") else format_report(report)), report
