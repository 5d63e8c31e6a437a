"""``manage.py power --effect 0.5 --alpha 0.05 --family 3 --power 0.8 [--json]``.

Participants per arm for a target Hedges' g at alpha / family (Holm's first step); the
figures come from studies.analysis.power, which needs no Django.
"""

import json

from django.core.management.base import BaseCommand, CommandError

from studies.analysis.power import PowerError, n_per_arm


class Command(BaseCommand):
    help = (
        "Participants per arm to detect a target effect (Hedges' g) with a two-sided Welch "
        "test at alpha / family, Holm's first step (statsmodels TTestIndPower, equal n)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--effect", type=float, required=True, help="Hedges' g to detect")
        parser.add_argument("--alpha", type=float, default=0.05, help="before Holm; default 0.05")
        parser.add_argument(
            "--family", type=int, default=1, help="tests in the Holm family (m); default 1"
        )
        parser.add_argument("--power", type=float, default=0.8, help="default 0.8")
        parser.add_argument("--json", action="store_true", help="print JSON")

    def handle(self, *args, **options):
        try:
            found = n_per_arm(
                options["effect"], options["alpha"], options["family"], options["power"]
            )
        except PowerError as error:
            raise CommandError(str(error)) from None
        if options["json"]:
            self.stdout.write(json.dumps(found.to_dict()))
            return
        self.stdout.write(
            f"{found.n_per_arm} participants per arm detect g = {found.effect:g} with power "
            f"{found.power:g} at alpha {found.alpha:g} / {found.family} = "
            f"{found.alpha_per_test:.4g} (two-sided; exact n {found.n_exact:.2f})"
        )
