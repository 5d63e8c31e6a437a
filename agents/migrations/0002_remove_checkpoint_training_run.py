# The run that wrote a checkpoint is training's to record (training.RunCheckpoint); training's
# 0003 migration runs before this one (run_before) and copies every link there first.

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0001_initial"),
    ]

    operations = [
        migrations.RemoveField(model_name="checkpoint", name="training_run"),
    ]
