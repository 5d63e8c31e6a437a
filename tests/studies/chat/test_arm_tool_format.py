"""An arm serving a registered checkpoint uses the tool format the checkpoint was trained with
(its manifest's tool_format, written by training/trainer/checkpoint.py): a native-trained agent (Qwen3)
is asked for native tool calls, a JSON-trained one (SmolLM2) for JSON ones."""

import pytest
from django.core.exceptions import ValidationError

from agents.models import Checkpoint
from tests.support.studies import make_study

pytestmark = pytest.mark.django_db


def tool_format_errors(arm) -> list[str]:
    try:
        arm.clean()
    except ValidationError as error:
        return error.message_dict.get("tool_format", [])
    return []


@pytest.mark.parametrize(
    "trained, chosen, refused",
    [
        ("native", "json", True),
        ("native", "structured", True),
        ("native", "native", False),
        ("json", "native", True),
        ("json", "json", False),
        ("json", "structured", False),
        (None, "native", False),  # a checkpoint from before manifests said: not checked
    ],
)
def test_an_arm_serves_a_checkpoint_in_the_tool_format_it_was_trained_with(
    trained, chosen, refused
):
    manifest = {"name": "run-step4", "step": 4} | ({"tool_format": trained} if trained else {})
    Checkpoint.objects.create(name="run-step4", path="/nowhere", manifest=manifest)
    arm = make_study(arms=("a",)).arms.get()
    arm.model_name, arm.tool_format = "run-step4", chosen
    errors = tool_format_errors(arm)
    assert bool(errors) == refused, errors
    if refused:
        assert "run-step4" in errors[0] and "trained with" in errors[0]
