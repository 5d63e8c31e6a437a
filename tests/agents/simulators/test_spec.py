"""agents/simulators/spec.py build: the simulator a SimulatorSpec declares, as training's endpoint
users and studies' held-out conversations both play it."""

import json
import random

import pytest

from agents.domains.p4g import P4GDomain
from agents.llm import ChatResult
from agents.simulators import PlainSimulator, VerbalizedSimulator
from agents.simulators.scripted import ScriptedPersuadee
from agents.simulators.spec import SimulatorSpec, build


class ScriptedClient:
    """Answers each `chat` call with the next scripted text and records what it was sent."""

    def __init__(self, *outputs):
        self.outputs, self.calls = list(outputs), []

    async def chat(self, model, messages, tools=None, **params):
        self.calls.append({"model": model, "messages": messages, **params})
        return ChatResult(content=self.outputs.pop(0))


DOMAIN = P4GDomain()
PERSONA = DOMAIN.scenarios()[0]
ASK = [{"role": "assistant", "content": "Would you donate to Save the Children?"}]


async def test_a_plain_spec_asks_with_its_settings_and_its_guidelines_and_persona():
    spec = SimulatorSpec(
        name="s",
        endpoint="http://x/v1",
        model="m",
        temperature=0.5,
        max_new_tokens=20,
        guidelines="Be brief.",
        persona="You are busy.",
    )
    client = ScriptedClient("Maybe.")
    simulator = build(spec, client)
    assert isinstance(simulator, PlainSimulator)
    turn = await simulator.reply(DOMAIN, PERSONA, ASK)
    call = client.calls[0]
    assert turn.text == "Maybe." and call["model"] == "m"
    assert call["temperature"] == 0.5 and call["max_tokens"] == 20
    system = call["messages"][0]["content"]
    assert system.startswith("Be brief.\n\n") and system.endswith("\n\nYou are busy.")
    assert DOMAIN.simulator_system_prompt(PERSONA) in system


async def test_sampling_provider_sends_no_temperature():
    spec = SimulatorSpec(name="s", endpoint="http://x/v1", model="m", sampling="provider")
    client = ScriptedClient("Maybe.")
    await build(spec, client).reply(DOMAIN, PERSONA, ASK)
    assert "temperature" not in client.calls[0] and "top_p" not in client.calls[0]


async def test_a_verbalized_spec_draws_one_of_its_k_candidates():
    spec = SimulatorSpec(name="v", kind="verbalized", endpoint="http://x/v1", model="m", k=2)
    written = [{"text": "Yes.", "probability": 0.5}, {"text": "No.", "probability": 0.5}]
    client = ScriptedClient(json.dumps({"responses": written}))
    simulator = build(spec, client, random.Random(0))
    assert isinstance(simulator, VerbalizedSimulator)
    turn = await simulator.reply(DOMAIN, PERSONA, ASK)
    assert turn.text in ("Yes.", "No.") and len(turn.candidates) == 2


def test_a_scripted_spec_is_its_persuadee_type_and_an_endpoint_one_needs_its_client():
    assert isinstance(build(SimulatorSpec(kind="scripted", script="anchored")), ScriptedPersuadee)
    with pytest.raises(ValueError, match="build it with its client"):
        build(SimulatorSpec(name="s", endpoint="http://x/v1", model="m"))
