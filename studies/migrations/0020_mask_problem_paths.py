"""Problems kept before paths were masked hold the participant's token in their page path (and
the monitor showed it to staff who may only view the study): masked in place. The pattern is
copied from studies/lib/credentials.py as it stands, so this migration never changes."""

import re

from django.db import migrations

PARTICIPANT_PATH = re.compile(r"(?P<ws>/ws)?/p/(?!\[token\])[^/?#\s\"'<>]+")


def mask_paths(apps, schema_editor):
    StudyError = apps.get_model("studies", "StudyError")
    for problem in StudyError.objects.filter(path__contains="/p/").only("pk", "path").iterator():
        path = PARTICIPANT_PATH.sub(lambda m: f"{m['ws'] or ''}/p/[token]", problem.path)
        if path != problem.path:
            StudyError.objects.filter(pk=problem.pk).update(path=path)


class Migration(migrations.Migration):
    dependencies = [("studies", "0019_rated_conversation_origin_sample")]

    operations = [migrations.RunPython(mask_paths, migrations.RunPython.noop)]
