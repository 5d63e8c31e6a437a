"""python manage.py domain_replay --domain retail|airline [--data-dir PATH] [--json] [--dump-db DIR]

Replays every task's gold actions through the tau2 tools and scores them; the work is done in
agents.domains.tau2.replay (no Django there). Exits non-zero when a task fails."""

from django.core.management.base import BaseCommand, CommandError

from agents.domains.tau2 import replay


class Command(BaseCommand):
    help = "Replay each tau2 task's gold actions as agent tool calls and score the conversations."

    def add_arguments(self, parser):
        replay.add_arguments(parser)

    def handle(self, *args, **options):
        try:
            status = replay.run(
                options["domain"],
                data_dir=options["data_dir"],
                as_json=options["json"],
                dump_dir=options["dump_db"],
                out=self.stdout,
            )
        except (OSError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        if status:
            raise SystemExit(status)
