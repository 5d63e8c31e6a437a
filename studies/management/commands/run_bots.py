"""``manage.py run_bots --study SLUG --n N --concurrency C [--url URL] [--kind K] [--json]``.

Bot participants go through the real flow of a live study over HTTP and WebSocket (see
studies/rehearsal/bots.py); they are marked on arrival and left out of exports and analysis.
"""

import json
import logging

from django.core.management.base import BaseCommand, CommandError

from studies.models import Study
from studies.rehearsal.bots import KINDS, run_bots


class Command(BaseCommand):
    help = "Rehearse or load a study with bot participants through the real flow."

    def add_arguments(self, parser):
        parser.add_argument("--study", required=True, help="The study's slug.")
        parser.add_argument("--n", type=int, default=4, help="How many bots.")
        parser.add_argument("--concurrency", type=int, default=2, help="Bots at once.")
        parser.add_argument("--url", help="The server; default settings.PUBLIC_URL.")
        parser.add_argument("--kind", choices=KINDS, default="scripted")
        parser.add_argument("--turns", type=int, help="Messages per bot; default min_exchanges.")
        parser.add_argument("--json", action="store_true", help="Print one JSON object.")

    def handle(self, *args, **options):
        logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request drowns the bar
        study = Study.objects.filter(slug=options["study"]).first()
        if study is None:
            raise CommandError(f"No study {options['study']!r}.")
        if study.status != Study.Status.LIVE:  # bots arrive by the participant link, as people do
            raise CommandError(f"The study {study.slug!r} is not live; set it to Live first.")
        if options["n"] < 1 or options["concurrency"] < 1:
            raise CommandError("--n and --concurrency must be at least 1.")
        report = run_bots(
            study,
            options["n"],
            options["concurrency"],
            options["url"],
            options["kind"],
            turns=options["turns"],
            progress=True,
        )
        if options["json"]:
            self.stdout.write(json.dumps(report.to_dict()))
        else:
            self.stdout.write(report.text())
        if report.failed:
            raise CommandError(f"{report.failed} of {len(report.runs)} bots failed.")
