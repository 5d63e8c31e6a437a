"""``manage.py sim2real --study SLUG [--json] [--evaluate]``.

The sim-to-real gap report of a study from what is stored (studies/research/simulator_evaluations.py): each arm's
checkpoint against its training run's held-out simulators beside its participants, and the
arms' rankings compared (Kendall's tau). ``--evaluate`` first plays the missing simulator
conversations in this process, as the Celery job does. Human-like simulators fine-tuned on this
study's people (`imitate_users`) are columns of their own: every one by default, or those named
with ``--humanlike NAME`` (repeatable; any study's), or none with ``--no-humanlike``.

The report's behaviour section sets every simulator's turns beside the study's participants'
(BDI, cluster shares, most like the people). ``--out DIR`` writes report.json, behaviour.csv,
the figures (SVG) and the behaviour space it was measured in (DIR/behaviour_space/<key>/), so
the report can be reproduced from what sits beside it.
"""

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from studies.analysis import csvfile
from studies.analysis.sim2real import format_sim2real
from studies.analysis.sim2real_behaviour import shares_rows
from studies.models import Study
from studies.research import simulator_evaluations


class Command(BaseCommand):
    help = (
        "Sim-to-real gap of a study: simulator success and reward of each arm's checkpoint "
        "beside the human outcome and Likert means (95% t-intervals), and Kendall's tau."
    )

    def add_arguments(self, parser):
        parser.add_argument("--study", required=True, help="the study's slug")
        parser.add_argument("--json", action="store_true", help="print the report as JSON")
        parser.add_argument(
            "--evaluate",
            action="store_true",
            help="play the missing simulator conversations first (on each arm's endpoint)",
        )
        choose = parser.add_mutually_exclusive_group()
        choose.add_argument(
            "--humanlike",
            action="append",
            metavar="NAME",
            help="a human-like simulator to show as a column (repeatable; default: every one "
            "registered from this study by imitate_users)",
        )
        choose.add_argument(
            "--no-humanlike", action="store_true", help="show no human-like simulator column"
        )
        parser.add_argument(
            "--out",
            metavar="DIR",
            help="also write report.json, behaviour.csv, the figures and the behaviour space "
            "here (made if missing)",
        )
        parser.add_argument(
            "--conversations",
            type=int,
            default=None,
            help="with --evaluate: conversations per simulator and scenario "
            "(default PARLEY_SIM2REAL_CONVERSATIONS)",
        )

    def handle(self, *args, **options):
        study = Study.objects.filter(slug=options["study"]).first()
        if study is None:
            known = ", ".join(Study.objects.order_by("slug").values_list("slug", flat=True))
            raise CommandError(f"No study {options['study']!r}; studies: {known or 'none'}.")
        if options["conversations"] is not None and options["conversations"] < 1:
            raise CommandError("--conversations must be at least 1.")
        humanlike = [] if options["no_humanlike"] else options["humanlike"]
        try:
            simulator_evaluations.humanlike_columns(study, humanlike)
        except simulator_evaluations.UnknownSimulator as error:
            raise CommandError(str(error)) from None
        if options["evaluate"]:
            done = simulator_evaluations.evaluate_missing(
                study, options["conversations"], humanlike
            )
            for problem in done["failed"]:
                self.stderr.write(f"not played: {problem}")
        out = Path(options["out"]).expanduser() if options["out"] else None
        if out is not None and out.exists() and not out.is_dir():
            raise CommandError(f"--out {out}: not a folder")
        report = simulator_evaluations.study_report(
            study,
            conversations=options["conversations"],
            humanlike=humanlike,
            space_dir=out / "behaviour_space" if out else None,
        )
        if out is not None:
            write_out(out, report)
        if options["json"]:
            self.stdout.write(json.dumps(report, indent=2))
        else:
            self.stdout.write(format_sim2real(report))


def write_out(out: Path, report: dict) -> None:
    """The report and what it was computed in, side by side in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2))
    (out / "behaviour.csv").write_text(csvfile.to_text(shares_rows(report.get("behaviour") or {})))
    for name, svg in simulator_evaluations.figures_svg(report).items():
        (out / f"{name}.svg").write_text(svg)
