"""The run that wrote a checkpoint is training's to record (RunCheckpoint): agents installs and
migrates alone, and the migration that moved the link lost none that was stored."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.loader import MigrationLoader
from django.urls import reverse

from agents.models import Checkpoint
from training.models import RunCheckpoint, TrainingRun

REPO = Path(__file__).resolve().parents[2]
OLD = [("agents", "0001_initial"), ("training", "0002_choices_from_vocabularies")]
NEW = [("agents", "0002_remove_checkpoint_training_run"), ("training", "0003_runcheckpoint")]


def migrate(targets):
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


def columns(table: str) -> list[str]:
    with connection.cursor() as cursor:
        return [c.name for c in connection.introspection.get_table_description(cursor, table)]


@pytest.mark.django_db(transaction=True)
def test_the_migration_moves_every_stored_link_and_back():
    try:
        old = migrate(OLD)
        Run, Saved = old.get_model("training", "TrainingRun"), old.get_model("agents", "Checkpoint")
        a, b = Run.objects.create(name="a"), Run.objects.create(name="b")
        for name, run in (("a-1", a), ("a-2", a), ("b-1", b), ("alone", None)):
            Saved.objects.create(name=name, path=f"/{name}", training_run=run and run.pk)

        new = migrate(NEW)
        Link = new.get_model("training", "RunCheckpoint")
        links = {(x.checkpoint.name, x.run.name) for x in Link.objects.select_related()}
        assert links == {("a-1", "a"), ("a-2", "a"), ("b-1", "b")}
        assert "training_run_id" not in columns("agents_checkpoint")
        assert new.get_model("agents", "Checkpoint").objects.count() == 4

        old = migrate(OLD)  # and back: the column holds the links again
        back = old.get_model("agents", "Checkpoint").objects.values_list("name", "training_run")
        assert dict(back) == {"a-1": a.pk, "a-2": a.pk, "b-1": b.pk, "alone": None}
    finally:
        migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())


def test_no_agents_migration_depends_on_training():
    """What agents' migration files declare (training's 0003 orders itself first, run_before)."""
    migrations = MigrationLoader(None).disk_migrations  # the files only, no database
    agents = [m for (app, _), m in migrations.items() if app == "agents"]
    assert agents and all(dep[0] != "training" for m in agents for dep in m.dependencies)


def test_agents_installs_and_migrates_without_training(tmp_path):
    (tmp_path / "alone_settings.py").write_text(
        textwrap.dedent(f"""
        SECRET_KEY = "alone"
        USE_TZ = True
        INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "agents"]
        DATABASES = {{"default": {{"ENGINE": "django.db.backends.sqlite3",
                                   "NAME": {str(tmp_path / "alone.sqlite3")!r}}}}}
    """)
    )
    script = (
        "import django; django.setup()\n"
        "from django.core.management import call_command\n"
        "call_command('migrate', verbosity=0)\n"
        "from django.db import connection\n"
        "c = connection.cursor()\n"
        "print([x.name for x in connection.introspection.get_table_description(c, "
        "'agents_checkpoint')])\n"
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "DJANGO_SETTINGS_MODULE": "alone_settings",
        "PYTHONPATH": f"{tmp_path}:{REPO}",
        "PARLEY_DATA_DIR": str(tmp_path),
    }
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "'name'" in done.stdout and "training_run" not in done.stdout


def write_checkpoint(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"name": name, "step": 1, "regime": "single"}))
    return folder


@pytest.mark.django_db
def test_a_run_links_what_it_registers_and_its_checkpoints_outlive_it(
    tmp_path, monkeypatch, admin_client
):
    monkeypatch.setenv("PARLEY_DATA_DIR", str(tmp_path / "data"))
    run = TrainingRun.objects.create(name="linked", domain="p4g", regime="single")
    checkpoint = run.register_checkpoint(write_checkpoint(tmp_path / "step-1", "linked-step1"))
    Checkpoint.register(tmp_path / "step-1")  # registered again (the demo does): still the run's
    assert list(run.checkpoints.all()) == [checkpoint]
    assert list(checkpoint.training_runs.all()) == [run]

    page = admin_client.get(reverse("admin:agents_checkpoint_changelist")).content.decode()
    assert reverse("admin:training_trainingrun_change", args=[run.pk]) in page

    run.delete()
    assert Checkpoint.objects.filter(pk=checkpoint.pk).exists()
    assert not RunCheckpoint.objects.exists()
