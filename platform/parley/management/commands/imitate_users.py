"""python manage.py imitate_users --study SLUG [--name NAME] [--out DIR] [--epochs N] [--lr LR]

Fine-tunes a LoRA user simulator on the messages the study's finished participants wrote
(studies/research/imitation_data.py exports them without participant ids, with e-mails, phone numbers, links
and ids in their own turns replaced; training/tools/imitate.py trains) and
registers it as a checkpoint (agents.models.Checkpoint), so a run's [[heldout]] table names it
with `adapter = "NAME"` and the embedded engine serves it as NAME. Here because it joins
studies and training, which do not import each other.
"""

import json
import shutil
from collections import Counter
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from agents.models import Checkpoint
from agents.paths import base_model_dir, data_dir
from studies.models import Study
from studies.research.imitation_data import NoConversations, finished_conversations
from training.tools.imitate import ImitationError, ImitationSettings, RealConversation, imitate


class Command(BaseCommand):
    help = "Fine-tune a simulator on a finished study's user turns and register it."

    def add_arguments(self, parser):
        parser.add_argument("--study", required=True, help="the study's slug")
        parser.add_argument("--name", help="the simulator's name (default: SLUG-humanlike)")
        parser.add_argument(
            "--out", type=Path, help="its folder (default: <data dir>/simulators/NAME)"
        )
        parser.add_argument("--epochs", type=int, default=3, help="passes over the data (3)")
        parser.add_argument("--lr", type=float, default=2e-4, help="learning rate (2e-4)")
        parser.add_argument("--base-model", type=Path, help="default: the platform's base model")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--json", action="store_true", help="print the manifest as JSON")

    def handle(self, *args, **options):
        slug = options["study"]
        study = Study.objects.filter(slug=slug).first()
        if study is None:
            known = ", ".join(Study.objects.order_by("slug").values_list("slug", flat=True))
            raise CommandError(f"no study {slug!r} (studies: {known or 'none'})")
        name = options["name"] or f"{slug}-humanlike"
        if Checkpoint.objects.filter(name=name).exists():
            raise CommandError(f"a checkpoint named {name!r} is registered: pass another --name")
        out = options["out"] or data_dir() / "simulators" / name
        try:
            exported = finished_conversations(study)
            conversations = [RealConversation.from_dict(c) for c in exported]
            redacted = sum((Counter(c["redacted"]) for c in exported), Counter())
            settings = ImitationSettings(
                name=name,
                base_model=str(options["base_model"] or base_model_dir()),
                epochs=options["epochs"],
                lr=options["lr"],
                seed=options["seed"],
                source={
                    "study": study.slug,
                    "study_title": study.title,
                    "redacted": dict(sorted(redacted.items())),
                },
            )
            folder = imitate(conversations, settings, out, progress=self._progress)
        except (NoConversations, ImitationError, FileNotFoundError) as error:
            raise CommandError(str(error)) from None
        try:
            checkpoint = Checkpoint.register(folder)
        except Exception as error:
            # The folder is this command's own: left behind, it would refuse the re-run's name.
            shutil.rmtree(folder, ignore_errors=True)
            raise CommandError(
                f"the simulator was trained but could not be registered ({error}); nothing was"
                f" kept, so the same command can run again"
            ) from error
        if options["json"]:
            self.stdout.write(json.dumps(checkpoint.manifest))
            return
        source = checkpoint.manifest["source"]
        self.stdout.write(
            f"Registered simulator {checkpoint.name!r} at {folder}: "
            f"{source['conversations']} conversations, {source['user_turns']} user turns.\n"
            f"Replaced in the participants' turns: {replaced(source['redacted'])} (names and"
            " street addresses are not detected: read the turns if they may hold some).\n"
            f'Name it in a run\'s panel: [[heldout]] name = "human-like" adapter = "{name}"'
        )

    def _progress(self, p: dict) -> None:
        self.stderr.write(
            f"epoch {p['epoch']} step {p['step']}/{p['total_steps']} loss {p['loss']:.3f}"
        )


def replaced(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in counts.items()) or "nothing"
