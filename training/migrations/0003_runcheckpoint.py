# The Checkpoint <-> TrainingRun link moves from agents (a ForeignKey on Checkpoint) to training
# (RunCheckpoint), so agents installs alone. Every stored link is copied before agents' 0002
# drops the old column; reversing copies them back.

import django.db.models.deletion
from django.db import migrations, models


def copy_links(apps, schema_editor):
    Checkpoint = apps.get_model("agents", "Checkpoint")
    TrainingRun = apps.get_model("training", "TrainingRun")
    RunCheckpoint = apps.get_model("training", "RunCheckpoint")
    runs = set(TrainingRun.objects.values_list("pk", flat=True))
    RunCheckpoint.objects.bulk_create(
        RunCheckpoint(run_id=run_id, checkpoint_id=pk)
        for pk, run_id in Checkpoint.objects.exclude(training_run=None).values_list(
            "pk", "training_run"
        )
        if run_id in runs  # the old ForeignKey set a deleted run's links to NULL
    )


def copy_links_back(apps, schema_editor):
    Checkpoint = apps.get_model("agents", "Checkpoint")
    RunCheckpoint = apps.get_model("training", "RunCheckpoint")
    for link in RunCheckpoint.objects.all():
        Checkpoint.objects.filter(pk=link.checkpoint_id).update(training_run=link.run_id)


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0001_initial"),
        ("training", "0002_choices_from_vocabularies"),
    ]
    # the old column must still be there to copy from
    run_before = [("agents", "0002_remove_checkpoint_training_run")]

    operations = [
        migrations.CreateModel(
            name="RunCheckpoint",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "checkpoint",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="training_link",
                        to="agents.checkpoint",
                    ),
                ),
                (
                    "run",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="checkpoint_links",
                        to="training.trainingrun",
                    ),
                ),
            ],
        ),
        migrations.AddField(
            model_name="trainingrun",
            name="checkpoints",
            field=models.ManyToManyField(
                blank=True,
                related_name="training_runs",
                through="training.RunCheckpoint",
                to="agents.checkpoint",
            ),
        ),
        migrations.RunPython(copy_links, copy_links_back),
    ]
