from django.db import migrations, models


def keep_the_first_automatic_analysis(apps, schema_editor):
    """Studies that already got two automatic analyses keep the first as automatic; the later
    ones stay, counted as if a researcher had started them, so the constraint can hold."""
    AnalysisRun = apps.get_model("studies", "AnalysisRun")
    first = {}
    for run in AnalysisRun.objects.filter(trigger="target").order_by("created_at", "pk"):
        if run.study_id in first:
            AnalysisRun.objects.filter(pk=run.pk).update(trigger="manual")
        else:
            first[run.study_id] = run.pk


class Migration(migrations.Migration):
    dependencies = [
        ("studies", "0003_participant_is_bot"),
    ]

    operations = [
        migrations.RunPython(keep_the_first_automatic_analysis, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="analysisrun",
            constraint=models.UniqueConstraint(
                condition=models.Q(("trigger", "target")),
                fields=("study",),
                name="one_automatic_analysis_per_study",
            ),
        ),
    ]
