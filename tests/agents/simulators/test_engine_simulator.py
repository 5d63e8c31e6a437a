"""PlainSimulator against the real embedded engine serving SmolLM2 (the `engine_url`
fixture of tests/conftest.py starts it in its own process)."""

import pytest

from agents.domains.p4g import P4GDomain
from agents.llm import LLMClient
from agents.serving.prepare import MARKER
from agents.simulators import PlainSimulator

pytestmark = pytest.mark.model


async def test_plain_simulator_answers_the_persuader_through_the_engine(engine_url, base_model):
    domain = P4GDomain()
    persona = domain.scenarios()[0]
    conversation = [{"role": "assistant", "content": domain.greeting(persona)}]
    async with LLMClient(engine_url, timeout=120) as client:
        served = await client.list_models()
        model = base_model.name if base_model.name in served else served[0]
        simulator = PlainSimulator(client, model, temperature=0.7, max_tokens=40, seed=1)
        turn = await simulator.reply(domain, persona, conversation)
    assert (base_model / MARKER).is_file()
    assert isinstance(turn.text, str) and turn.text.strip()
    assert turn.usage[0]["completion_tokens"] <= 40
    conversation.append({"role": "user", "content": turn.text})
    assert domain.is_done(conversation) in (None, "donation")  # a real reply scores cleanly
    assert 0.0 <= domain.score(conversation, {}).reward <= 1.0
