"""``manage.py analyze --csv FILE --arm-column COL --measures a,b,c [--json]``.

A thin wrapper over studies.analysis.cli; the analysis itself needs no Django.
"""

from django.core.management.base import BaseCommand, CommandError

from studies.analysis.cli import add_arguments, run


class Command(BaseCommand):
    help = (
        "Welch t-tests with Holm-Bonferroni correction, Hedges' g and 95% CIs on any CSV "
        "(one row per participant). The control arm defaults to the first arm in the file."
    )

    def add_arguments(self, parser):
        add_arguments(parser)

    def handle(self, *args, **options):
        output, report = run(options)
        self.stdout.write(output, ending="")
        if report["errors"]:
            # The report (with its errors) is printed first, so scripts can still read it.
            raise CommandError("; ".join(report["errors"]))
