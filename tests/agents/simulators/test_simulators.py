"""PlainSimulator and VerbalizedSimulator: what they send, retries and the raw-text fallback.

The client is a stub with the agents.llm `chat` signature that replays scripted outputs;
the test against a real engine is in test_engine_simulator.py."""

import json
import random

import pytest

from agents.domains.p4g import P4GDomain, parse_donation
from agents.llm import ChatResult
from agents.simulators import (
    OPENING,
    PlainSimulator,
    UserTurn,
    VerbalizedSimulator,
    user_view,
)


class ScriptedClient:
    """Answers each `chat` call with the next scripted text and records what it was sent."""

    def __init__(self, *outputs):
        self.outputs = list(outputs)
        self.calls = []

    async def chat(self, model, messages, tools=None, **params):
        self.calls.append({"model": model, "messages": messages, "tools": tools, **params})
        return ChatResult(content=self.outputs.pop(0), usage={"completion_tokens": 3})


def verbalized(texts, probabilities=(0.4, 0.3, 0.15, 0.1, 0.05)):
    return json.dumps(
        {
            "responses": [
                {"text": t, "probability": p}
                for t, p in zip(texts, probabilities[: len(texts)], strict=True)
            ]
        }
    )


# Any Domain serves; P4G's personas make the simulator prompt concrete.
DOMAIN = P4GDomain()
PERSONA = DOMAIN.scenarios()[0]


CONVERSATION = [
    {"role": "assistant", "content": "Hi! How are you?"},
    {"role": "user", "content": "Good, you?"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function"}]},
    {"role": "tool", "tool_call_id": "c1", "name": "calculate", "content": "4"},
    {"role": "assistant", "content": "Great. Have you heard of Save the Children?"},
]


def test_user_view_flips_roles_and_drops_tool_traffic():
    assert user_view(CONVERSATION) == [
        {"role": "user", "content": "Hi! How are you?"},
        {"role": "assistant", "content": "Good, you?"},
        {"role": "user", "content": "Great. Have you heard of Save the Children?"},
    ]
    assert CONVERSATION[0]["role"] == "assistant"  # the caller's conversation is untouched
    twice = [{"role": "assistant", "content": "One."}, {"role": "assistant", "content": "Two."}]
    assert user_view(twice) == [{"role": "user", "content": "One.\n\nTwo."}]
    assert user_view([]) == [{"role": "user", "content": OPENING}]


async def test_plain_simulator_sends_the_persona_prompt_and_returns_one_reply():
    client = ScriptedClient("  Yes, a little. Why?  ")
    simulator = PlainSimulator(client, "sim-model", temperature=0.7, max_tokens=64)
    turn = await simulator.reply(DOMAIN, PERSONA, CONVERSATION)
    assert isinstance(turn, UserTurn)
    assert turn.text == "Yes, a little. Why?" and not turn.fell_back and turn.candidates is None
    (call,) = client.calls
    assert call["model"] == "sim-model" and call["temperature"] == 0.7 and call["max_tokens"] == 64
    assert call["messages"][0] == {
        "role": "system",
        "content": DOMAIN.simulator_system_prompt(PERSONA),
    }
    assert call["messages"][1:] == user_view(CONVERSATION)
    assert "response_format" not in call


async def test_verbalized_simulator_draws_one_of_the_candidates():
    texts = [f"Option {i}. [DONATE ${i * 0.5:.2f}]" for i in range(5)]
    client = ScriptedClient(verbalized(texts))
    simulator = VerbalizedSimulator(client, "sim", rng=random.Random(3), temperature=1.0)
    turn = await simulator.reply(DOMAIN, PERSONA, CONVERSATION)
    assert turn.text in texts and [c.text for c in turn.candidates] == texts
    assert parse_donation(turn.text) is not None  # the P4G marker is kept in the drawn reply
    assert (turn.attempts, turn.fell_back, turn.errors) == (1, False, [])
    (call,) = client.calls
    system = call["messages"][0]["content"]
    assert system.startswith(DOMAIN.simulator_system_prompt(PERSONA))
    assert '{"responses"' in system and "exactly 5 items" in system
    schema = call["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["responses"]["minItems"] == 5
    assert call["temperature"] == 1.0


async def test_unstructured_engines_get_no_response_format():
    client = ScriptedClient(verbalized(["a", "b", "c", "d", "e"]))
    simulator = VerbalizedSimulator(client, "sim", structured=False, rng=0)
    await simulator.reply(DOMAIN, PERSONA, CONVERSATION)
    assert "response_format" not in client.calls[0]


async def test_malformed_output_is_retried():
    good = verbalized(["a", "b", "c", "d", "e"])
    client = ScriptedClient("not json at all", good)
    turn = await VerbalizedSimulator(client, "sim", rng=1).reply(DOMAIN, PERSONA, CONVERSATION)
    assert turn.text in "abcde" and turn.attempts == 2 and not turn.fell_back
    assert len(turn.errors) == 1 and "not JSON" in turn.errors[0]
    assert len(turn.usage) == 2


async def test_after_two_retries_the_raw_text_is_used():
    client = ScriptedClient(
        "{broken", verbalized(["only", "four", "items", "here"]), " Sure. [DONATE $1] "
    )
    turn = await VerbalizedSimulator(client, "sim", rng=1).reply(DOMAIN, PERSONA, CONVERSATION)
    assert len(client.calls) == 3
    assert turn.fell_back and turn.attempts == 3 and turn.candidates is None
    assert turn.text == "Sure. [DONATE $1]" and turn.raw == " Sure. [DONATE $1] "
    assert "expected exactly 5 responses, got 4" in turn.errors[1]
    assert parse_donation(turn.text) == 1.0


async def test_retries_setting_is_honoured():
    client = ScriptedClient("nope")
    turn = await VerbalizedSimulator(client, "sim", retries=0).reply(DOMAIN, PERSONA, CONVERSATION)
    assert len(client.calls) == 1 and turn.fell_back and turn.text == "nope"


async def test_seeded_simulators_draw_alike_and_random_mode_ignores_probabilities():
    texts = ["a", "b", "c", "d", "e"]
    skewed = verbalized(texts, (0.96, 0.01, 0.01, 0.01, 0.01))

    async def draws(mode, seed):
        client = ScriptedClient(*[skewed] * 200)
        simulator = VerbalizedSimulator(client, "sim", mode=mode, rng=seed)
        return [(await simulator.reply(DOMAIN, PERSONA, CONVERSATION)).text for _ in range(200)]

    by_probability = await draws("probability", 5)
    assert by_probability == await draws("probability", 5)
    assert by_probability.count("a") > 170
    assert 20 < (await draws("uniform", 5)).count("a") < 70


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="mode"):
        VerbalizedSimulator(ScriptedClient(), "sim", mode="top")
    with pytest.raises(ValueError, match="positive integer"):
        VerbalizedSimulator(ScriptedClient(), "sim", k=0)
    with pytest.raises(ValueError, match="retries"):
        VerbalizedSimulator(ScriptedClient(), "sim", retries=-1)
