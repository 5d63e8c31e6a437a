"""Training from the admin: a TrainingRun on a real Celery worker, its checkpoints registered,
attached to an arm, and served by the embedded engine under the checkpoint's name."""

import asyncio
import json
import time
import uuid

import pytest
from django.urls import reverse

from agents.llm import LLMClient
from agents.models import ModelEndpoint, adapters_dir
from agents.serving.launch import start_engine, stop_engine
from studies.models import Arm
from tests.support.studies import make_study
from training.models import TrainingRun

TINY = {
    "max_new_tokens": 4,
    "max_turns": 2,
    "eval_every": 0,
    "save_every": 0,
    "micro_batch": 2,
    "tasks": {"train_split": "train", "eval_split": "test", "max_eval": 1},
}


def add_form(name, **fields):
    data = {
        "name": name,
        "preset": "p4g-single-cpu",
        "domain": "p4g",
        "regime": "single",
        "base_model": "",
        "steps": "1",
        "group_size": "2",
        "lr": "",
        "beta": "",
        "temperature": "",
        "settings": json.dumps(TINY),
    }
    data.update(fields)
    return data


@pytest.mark.django_db
def test_bad_settings_are_refused_with_a_clear_message(admin_client):
    url = reverse("admin:training_trainingrun_add")
    page = admin_client.get(url).content.decode()
    assert "p4g-single-cpu" in page
    response = admin_client.post(url, add_form("bad-run", group_size="1"))
    assert response.status_code == 200
    assert "group_size must be &gt;= 2 (got 1)" in response.content.decode()
    response = admin_client.post(url, add_form("bad-json", settings="[1, 2]"))
    assert "Must be a JSON object" in response.content.decode()
    assert not TrainingRun.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_run_trains_registers_attaches_and_serves(
    admin_client, celery_worker, base_model, tmp_path
):
    name = f"t-{uuid.uuid4().hex[:8]}"
    settings = {**TINY, "output_dir": str(tmp_path / name)}
    response = admin_client.post(
        reverse("admin:training_trainingrun_add"), add_form(name, settings=json.dumps(settings))
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    run = TrainingRun.objects.get(name=name)
    deadline = time.monotonic() + 600
    while (
        run.status in (TrainingRun.Status.QUEUED, TrainingRun.Status.RUNNING)
        and time.monotonic() < deadline
    ):
        time.sleep(1)
        run.refresh_from_db()
    assert run.status == TrainingRun.Status.DONE, run.error
    assert run.progress["step"] == run.progress["total_steps"] == 1
    assert "reward" in run.progress
    page = admin_client.get(
        reverse("admin:training_trainingrun_change", args=[run.pk])
    ).content.decode()
    assert f"{name}-step1" in page
    progress = admin_client.get(
        reverse("admin:training_trainingrun_progress", args=[run.pk])
    ).json()
    assert progress["status"] == TrainingRun.Status.DONE and not progress["active"]

    checkpoint = run.checkpoints.get()
    link = adapters_dir() / checkpoint.name
    try:
        assert (
            checkpoint.name == f"{name}-step1"
            and checkpoint.regime == "single"
            and checkpoint.step == 1
        )
        assert (
            link.is_symlink()
            and json.loads((link / "manifest.json").read_text())["name"] == checkpoint.name
        )

        url, process = start_engine(base_model, adapters=adapters_dir())
        try:
            study = make_study(slug="trained")
            arm = study.arms.get(name="b")
            response = admin_client.post(
                reverse("admin:agents_checkpoint_changelist"),
                {
                    "action": "attach_to_arm",
                    "_selected_action": [checkpoint.pk],
                    "apply": "1",
                    "arms": [arm.pk],
                    "endpoint": ModelEndpoint.of_url(url).pk,
                },
            )
            assert response.status_code == 302  # the engine lists the checkpoint: not refused
            arm = Arm.objects.get(pk=arm.pk)
            assert arm.model_name == checkpoint.name and arm.endpoint.urls() == [url]
            reply = asyncio.run(ask(url, checkpoint.name))
        finally:
            stop_engine(process)
        assert reply.model == checkpoint.name and reply.content
    finally:
        link.unlink(missing_ok=True)


async def ask(url, model):
    async with LLMClient(url) as client:
        return await client.chat(
            model, [{"role": "user", "content": "Hello"}], max_tokens=4, temperature=0
        )
