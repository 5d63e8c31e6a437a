from django.core.management.base import BaseCommand, CommandError

from studies.models import Study
from studies.setup.scenario_pools import PoolError, import_pool


class Command(BaseCommand):
    help = "Add scenarios from a Domain (bundled or official data) to a study's pool."

    def add_arguments(self, parser):
        parser.add_argument("--study", required=True, help="study slug")
        parser.add_argument("--domain", required=True, help="retail, airline or p4g")
        parser.add_argument(
            "--count", type=int, help="how many (a seeded random sample); default all"
        )
        parser.add_argument("--split", choices=["train", "test"], help="only this split")
        parser.add_argument(
            "--data-dir", default="", help="official data folder; default bundled data"
        )
        parser.add_argument("--seed", type=int, default=0)

    def handle(self, *args, **o):
        study = Study.objects.filter(slug=o["study"]).first()
        if study is None:
            raise CommandError(f"No study with slug {o['study']!r}.")
        try:
            added, existing = import_pool(
                study, o["domain"], o["count"], o["split"], o["data_dir"], o["seed"]
            )
        except PoolError as error:
            raise CommandError(str(error)) from error
        self.stdout.write(
            f"{added} scenario(s) added, {existing} already in the pool of {study.slug}"
        )
