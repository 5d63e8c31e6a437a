import secrets

from django.db import migrations, models

import studies.models


def own_keys(apps, schema_editor):
    # AddField gives every existing study the same default: give each its own.
    Study = apps.get_model("studies", "Study")
    for study in Study.objects.only("pk"):
        Study.objects.filter(pk=study.pk).update(bot_key=secrets.token_urlsafe(32))


class Migration(migrations.Migration):
    dependencies = [
        ("studies", "0013_arm_tool_choice"),
    ]

    operations = [
        migrations.AddField(
            model_name="study",
            name="bot_key",
            field=models.CharField(
                default=studies.models.new_bot_key, editable=False, max_length=64
            ),
        ),
        migrations.RunPython(own_keys, migrations.RunPython.noop),
    ]
