"""Request shaping per provider (agents/llm/providers.py) against local stand-ins that answer as
the providers do (tests/support/provider_servers.py), and choice turns where the provider does not
enforce response_format: the text is read, re-asked, then the fallback counted."""

from __future__ import annotations

import pytest

from agents.domains.p4g.donation import DECISION_AMOUNTS, marker
from agents.llm import LLMClient, LLMHTTPError
from agents.llm.providers import PROVIDERS, provider_for
from agents.simulators import PlainSimulator, VerbalizedSimulator
from tests.support.provider_servers import AnthropicServer, GPT5Server
from tests.support.scripted_server import ScriptedServer

MARKERS = [marker(a) for a in DECISION_AMOUNTS]
CHAT = [{"role": "system", "content": "You are a persuadee."}, {"role": "user", "content": "Hi"}]

# The release's 6-model panel (CHATS-lab/scope_usim eval_configs/tau2_retail_6model.yaml
# @ 6218b975): model, base URL, key variable; plus the direct endpoints and a local vLLM.
PANEL = [
    ("anthropic/claude-haiku-4.5", "https://openrouter.ai/api/v1", "OPENROUTER_API_KEY", "openrouter"),
    ("gpt-5-mini", "https://api.openai.com/v1", "OPENAI_API_KEY", "openai-reasoning"),
    ("google/gemini-3-flash-preview", "https://openrouter.ai/api/v1", "OPENROUTER_API_KEY", "openrouter"),
    ("z-ai/glm-5", "https://openrouter.ai/api/v1", "OPENROUTER_API_KEY", "openrouter"),
    ("qwen/qwen3-30b-a3b-instruct-2507", "https://openrouter.ai/api/v1", "OPENROUTER_API_KEY", "openrouter"),
    ("deepseek/deepseek-v3.2", "https://openrouter.ai/api/v1", "OPENROUTER_API_KEY", "openrouter"),
    ("gpt-4o", "https://api.openai.com/v1", "OPENAI_API_KEY", "openai"),
    ("o4-mini", "https://api.openai.com/v1", "OPENAI_API_KEY", "openai-reasoning"),
    ("gpt-5-chat-latest", "https://api.openai.com/v1", "OPENAI_API_KEY", "openai"),
    ("claude-haiku-4-5", "https://api.anthropic.com/v1", "ANTHROPIC_API_KEY", "anthropic"),
    ("gemini-3-flash-preview", "https://generativelanguage.googleapis.com/v1beta/openai", "GEMINI_API_KEY", "gemini"),
    # GPT-5 behind another host (a gateway, a proxy, Azure, a local stand-in) is recognised by
    # its id alone, as the release does; a host a provider claims keeps that provider's rules
    ("gpt-5-mini", "http://127.0.0.1:8001/v1", "OPENAI_API_KEY", "openai-reasoning"),
    ("openai/gpt-5", "https://gateway.example.com/v1", "OPENAI_API_KEY", "openai-reasoning"),
    ("gpt-5.1", "https://parley.openai.azure.com/openai/v1", "OPENAI_API_KEY", "openai-reasoning"),
    ("gpt-5-chat-latest", "https://gateway.example.com/v1", "", "generic"),
    ("o4-mini", "https://gateway.example.com/v1", "", "generic"),
    ("openai/gpt-5-mini", "https://openrouter.ai/api/v1", "OPENROUTER_API_KEY", "openrouter"),
    ("Qwen/Qwen3-8B", "http://127.0.0.1:8001/v1", "", "generic"),
]  # fmt: skip  # a table: one model, host, key and provider a line


@pytest.mark.parametrize(("model", "url", "key_env", "name"), PANEL)
def test_auto_recognises_each_panel_model_and_its_key_variable(model, url, key_env, name):
    provider = provider_for("auto", url, model)
    assert provider.name == name
    assert provider.key_env == key_env


def test_an_unknown_provider_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="auto, openai-reasoning, openai, anthropic"):
        LLMClient("http://127.0.0.1:9/v1", provider="openia")


async def test_the_gpt5_standin_refuses_the_unshaped_request_once_and_takes_the_shaped_one():
    with GPT5Server([{"content": "Hi there."}]) as server:
        async with LLMClient(server.url, provider="generic", backoff=0) as client:
            with pytest.raises(LLMHTTPError) as refused:
                await client.chat("gpt-5-mini", CHAT, temperature=0.7, max_tokens=64)
        assert refused.value.status == 400 and refused.value.attempts == 1  # not retried
        assert "Use 'max_completion_tokens' instead" in str(refused.value)
        async with LLMClient(server.url, provider="openai-reasoning") as client:
            result = await client.chat(
                "gpt-5-mini",
                CHAT,
                temperature=0.7,
                top_p=0.95,
                max_tokens=64,
                reasoning_effort="minimal",
            )
        assert result.content == "Hi there."
    sent = server.requests[-1]
    assert sent["max_completion_tokens"] == 64 and sent["reasoning_effort"] == "minimal"
    assert not {"max_tokens", "temperature", "top_p"} & set(sent)
    assert len(server.refused) == 1


async def test_a_streamed_chat_is_shaped_too():
    with GPT5Server([{"content": "Hello you."}]) as server:
        async with LLMClient(server.url, provider="openai-reasoning") as client:
            async with client.stream_chat(
                "gpt-5-mini", CHAT, temperature=0.7, max_tokens=32
            ) as stream:
                text = "".join([piece async for piece in stream])
    assert text.strip() == "Hello you."
    assert server.requests[-1]["max_completion_tokens"] == 32


async def test_the_gpt5_standin_refuses_a_temperature_other_than_1():
    with GPT5Server([]) as server:
        async with LLMClient(server.url, provider="generic") as client:
            with pytest.raises(LLMHTTPError, match="'temperature' does not support 0.7"):
                await client.chat("gpt-5-mini", CHAT, temperature=0.7, max_completion_tokens=8)


async def test_generic_sends_what_it_is_given_and_openrouter_its_reasoning_form():
    with ScriptedServer([{"content": "a"}, {"content": "b"}, {"content": "c"}]) as server:
        async with LLMClient(server.url) as client:  # auto: 127.0.0.1 is generic
            await client.chat(
                "m", CHAT, temperature=0.7, top_p=0.95, max_tokens=16, reasoning_effort="low"
            )
            await client.chat("m", CHAT, temperature=0.7, max_tokens=16)
        async with LLMClient(server.url, provider="openrouter") as client:
            await client.chat("m", CHAT, temperature=0.7, max_tokens=16, reasoning_effort="low")
    given, plain, routed = server.requests
    assert (given["top_p"], given["reasoning_effort"], given["max_tokens"]) == (0.95, "low", 16)
    assert "top_p" not in plain and "reasoning_effort" not in plain
    assert routed["reasoning"] == {"effort": "low"} and "reasoning_effort" not in routed
    assert routed["temperature"] == 0.7 and routed["max_tokens"] == 16


def test_a_provider_that_takes_no_effort_refuses_it_before_sending():
    with pytest.raises(ValueError, match="does not take reasoning_effort"):
        PROVIDERS["anthropic"].shape({"reasoning_effort": "low"})


async def test_an_anthropic_choice_turn_is_read_from_free_text_and_re_asked():
    replies = [{"content": "Hmm, let me think about it."}, {"content": "OK. [donate $0.5]"}]
    with AnthropicServer(replies) as server:
        async with LLMClient(server.url, provider="anthropic") as client:
            simulator = PlainSimulator(client, "claude-haiku-4-5", temperature=0.7, max_tokens=32)
            turn = await simulator.answer(CHAT, MARKERS)
    assert (turn.text, turn.attempts, turn.fell_back) == ("[DONATE $0.50]", 2, False)
    asked = server.requests[0]["messages"][-1]["content"]
    assert "Reply with exactly one of: [DONATE $0]" in asked  # asked in words, not only schema
    assert server.requests[0]["response_format"]["type"] == "json_schema"  # sent, ignored


async def test_an_anthropic_choice_turn_that_never_chooses_falls_back_after_its_retries():
    replies = [{"content": f"I'd rather not say ({i})."} for i in range(3)]
    with AnthropicServer(replies) as server:
        async with LLMClient(server.url, provider="anthropic") as client:
            simulator = PlainSimulator(client, "claude-haiku-4-5", retries=2)
            turn = await simulator.answer(CHAT, MARKERS)
    assert turn.fell_back and turn.attempts == 3 and len(turn.errors) == 3
    assert turn.text == "I'd rather not say (2)." and not server.replies


async def test_an_enforcing_provider_is_not_asked_in_words():
    with ScriptedServer([{"content": '{"reply": "[DONATE $1]"}'}]) as server:
        async with LLMClient(server.url) as client:
            turn = await PlainSimulator(client, "m").answer(CHAT, MARKERS)
    assert turn.text == "[DONATE $1]"
    assert server.requests[0]["messages"][-1]["content"] == "Hi"


async def test_a_verbalized_choice_turn_on_anthropic_is_re_asked_until_its_json_holds():
    good = ", ".join(f'{{"text": "[DONATE ${a:g}]", "probability": 0.2}}' for a in range(5))
    replies = [{"content": "Sure! I'd give a dollar."}, {"content": f'{{"responses": [{good}]}}'}]
    with AnthropicServer(replies) as server:
        async with LLMClient(server.url, provider="anthropic") as client:
            simulator = VerbalizedSimulator(client, "claude-haiku-4-5", k=5, rng=0)
            choices = [marker(a) for a in range(5)]
            turn = await simulator.answer(CHAT, choices)
    assert not turn.fell_back and turn.attempts == 2 and turn.text in choices
    assert "must be exactly one of: [DONATE $0]" in server.requests[0]["messages"][-1]["content"]


async def test_the_sim_to_real_held_out_user_is_shaped_as_in_training():
    """studies' sim-to-real evaluation builds the run's held-out simulator from its manifest:
    the same provider shaping, top_p and retries reach the GPT-5-style stand-in."""
    import random

    from agents.domains import domain_class
    from studies.research.heldout_conversations import make_user

    domain = domain_class("p4g-decision")()
    scenario = domain.scenarios("test")[0]
    ask = [{"role": "assistant", "content": "Would you donate $1?"}]
    with GPT5Server([{"content": '{"reply": "[DONATE $1]"}'}]) as server:
        spec = {
            "name": "gpt5",
            "endpoint": server.url,
            "model": "gpt-5-mini",
            "top_p": 0.95,
            "provider": "openai-reasoning",
            "temperature": 0.7,
            "max_new_tokens": 32,
        }
        user = make_user(spec, random.Random(0))
        text = await user.reply(domain, scenario, ask, final=True)
        await user.aclose()
    assert text == "[DONATE $1]" and not server.refused
    assert server.requests[-1]["max_completion_tokens"] == 32


async def test_auto_shapes_gpt5_behind_another_host_and_its_first_request_is_taken():
    """Before the id alone was read, "auto" sent the stand-in (a gateway on 127.0.0.1) the
    generic request, and it answered HTTP 400 at the first turn."""
    with GPT5Server([{"content": "Hi there."}]) as server:
        async with LLMClient(server.url, backoff=0) as client:  # auto
            result = await client.chat("gpt-5-mini", CHAT, temperature=0.7, max_tokens=64)
    assert result.content == "Hi there." and not server.refused
    assert server.requests[-1]["max_completion_tokens"] == 64


def test_the_dry_run_refusal_of_an_unrecognised_reasoning_model_names_the_provider_setting():
    from agents.simulators.spec import SimulatorSpec
    from training.tools.dryrun import check_request

    with GPT5Server([]) as server:  # a deployment name that says nothing of GPT-5
        spec = SimulatorSpec(name="azure-user", endpoint=server.url, model="prod-deployment")
        check = check_request("simulator", spec, timeout=5)
    assert not check.ok
    assert 'set provider = "openai-reasoning" on azure-user' in check.detail
