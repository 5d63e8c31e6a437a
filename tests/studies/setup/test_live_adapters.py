"""A checkpoint attached to an arm whose endpoint is vLLM is loaded on every replica first
(POST /v1/load_lora_adapter, vLLM's runtime LoRA loading), then the arm asks for it; the
embedded engine is not asked (it finds registered checkpoints by itself). The replicas here
are scripted servers that answer as vLLM does; tests/agents/serving/vllm/test_vllm_study.py does it
with vLLM itself."""

from pathlib import Path

import pytest
from django import forms
from django.forms.models import model_to_dict
from django.urls import reverse

from agents.models import Checkpoint, ModelEndpoint
from studies.admin.study.inlines import ArmForm
from studies.models import Arm
from tests.support.scripted_server import ScriptedServer
from tests.support.studies import make_study

pytestmark = pytest.mark.django_db


@pytest.fixture
def checkpoint(tmp_path) -> Checkpoint:
    folder = tmp_path / "run" / "checkpoints" / "step-000002"
    folder.mkdir(parents=True)
    return Checkpoint.objects.create(name="run-step2", path=str(folder))


def attach(admin_client, checkpoint, arm, endpoint):
    return admin_client.post(
        reverse("admin:agents_checkpoint_changelist"),
        {
            "action": "attach_to_arm",
            "_selected_action": [checkpoint.pk],
            "apply": "1",
            "arms": [arm.pk],
            "endpoint": endpoint.pk,
        },
    )


def test_attaching_to_a_vllm_endpoint_loads_the_checkpoint_on_every_replica(
    admin_client, checkpoint
):
    arm = make_study().arms.get(name="a")
    with ScriptedServer([]) as first, ScriptedServer([]) as second:
        endpoint = ModelEndpoint.register("vllm-pair", "vllm", [first.url, second.url])
        response = attach(admin_client, checkpoint, arm, endpoint)
        assert response.status_code == 302, response.content.decode()[:3000]
        for replica in (first, second):
            assert replica.loaded_adapters == [
                {
                    "lora_name": "run-step2",
                    "lora_path": str(Path(checkpoint.path).resolve()),
                    "load_inplace": True,  # a checkpoint saved again under its name replaces it
                }
            ]
    arm.refresh_from_db()
    assert arm.model_name == "run-step2" and arm.endpoint == endpoint
    shown = admin_client.get(response.url).content.decode()  # the admin capfirsts a message
    assert "Attached run-step2 to " in shown and "Run-step2" not in shown


def test_an_embedded_endpoint_is_not_asked_to_load(admin_client, checkpoint):
    arm = make_study().arms.get(name="a")
    with ScriptedServer([], models=["SmolLM2-135M-Instruct", "run-step2"]) as engine:
        endpoint = ModelEndpoint.register("embedded-one", "embedded", [engine.url])
        assert attach(admin_client, checkpoint, arm, endpoint).status_code == 302
        assert engine.loaded_adapters == []


def test_an_arm_edited_to_ask_for_a_checkpoint_has_vllm_load_it(checkpoint):
    arm = make_study().arms.get(name="a")
    with ScriptedServer([]) as replica:
        endpoint = ModelEndpoint.register("vllm-one", "vllm", [replica.url])
        Form = forms.modelform_factory(Arm, form=ArmForm, exclude=["study"])
        data = {**model_to_dict(arm, exclude=["study"]), "extra_params": "{}"}
        form = Form(data={**data, "endpoint": endpoint.pk, "model_name": "run-step2"}, instance=arm)
        assert form.is_valid(), form.errors  # Arm.clean found it served: it was loaded first
        assert [body["lora_name"] for body in replica.loaded_adapters] == ["run-step2"]
        unchanged = Form(
            data={**data, "endpoint": endpoint.pk}, instance=Arm.objects.get(pk=arm.pk)
        )
        unchanged.is_valid()
        assert len(replica.loaded_adapters) == 1  # only a changed arm asks
