"""The embedded engine honours response_format and tool_choice, and refuses what it does not
support, through the official `openai` client against the real process (SmolLM2)."""

import json

import openai
import pytest

from agents.domains.tau2 import RetailDomain
from agents.llm import LLMClient
from tests.support.engine import (
    ASK,
    CLOCK,
    check_tools_refused_without_a_parser,
)

pytestmark = pytest.mark.model

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def client(served):
    with openai.OpenAI(base_url=served.url, api_key="EMPTY", max_retries=0) as client:
        yield client


def test_tools_are_refused_as_vllm_refuses_them_for_smollm2(served):
    """Issue 23: the embedded engine forced a call for tool_choice "required" where vLLM, as
    serve_agents starts it for SmolLM2, answers 400: the same request now means the same."""
    check_tools_refused_without_a_parser(served.url, served.base)


def test_json_schema_answer_parses_and_validates(client, served):
    reply = client.chat.completions.create(
        model=served.base,
        max_tokens=40,
        temperature=0,
        messages=[{"role": "user", "content": "Describe a person."}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": PERSON},
        },
    )
    person = json.loads(reply.choices[0].message.content)  # no markdown fence around it
    assert set(person) == {"name", "age"}
    assert isinstance(person["name"], str) and type(person["age"]) is int


def test_json_object_answer_is_a_json_object(client, served):
    reply = client.chat.completions.create(
        model=served.base,
        max_tokens=40,
        temperature=0,
        response_format={"type": "json_object"},
        messages=[{"role": "user", "content": "Describe a person in JSON."}],
    )
    if reply.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(reply.choices[0].message.content), dict)
    else:  # cut off by max_tokens: still the start of an object
        assert reply.choices[0].message.content.lstrip().startswith("{")


@pytest.mark.parametrize(
    "params, param",
    [
        ({"logprobs": True}, "logprobs"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"extra_body": {"top_k": 5}}, "top_k"),
        ({"extra_body": {"structured_outputs": {"json": PERSON}}}, "structured_outputs"),
        ({"tool_choice": "required"}, "tool_choice"),  # without tools
        (
            {"tools": [CLOCK], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
        ),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_unsupported_or_contradictory_fields_are_400(client, served, params, param):
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=served.base, messages=ASK, max_tokens=1, **params)
    assert raised.value.status_code == 400
    assert raised.value.body["param"] == param
    assert raised.value.body["message"]


def test_neutral_values_and_harmless_fields_are_accepted(client, served):
    reply = client.chat.completions.create(
        model=served.base,
        messages=ASK,
        max_tokens=1,
        logprobs=False,
        presence_penalty=0,
        user="participant-7",
        metadata={"study": "s"},
        tools=[CLOCK],
        tool_choice="none",
    )
    assert reply.choices[0].finish_reason == "length"


async def test_structured_tool_format_forces_a_tau2_call_through_agents_llm(served):
    """The demo's path: agents.llm's `structured` tool format against the engine, with the
    retail domain's real tools; the call it returns is one the domain can run."""
    domain = RetailDomain()
    scenario = domain.scenarios()[0]
    tools = domain.tools(scenario)
    messages = [
        {"role": "system", "content": domain.agent_system_prompt(scenario)},
        {"role": "user", "content": "Hi, I want to cancel order #W2378156."},
    ]
    async with LLMClient(served.url, tool_format="structured", timeout=300) as llm:
        stream = llm.stream_chat(
            served.base,
            messages,
            tools=tools,
            tool_choice="required",
            max_tokens=120,
            temperature=0,
        )
        assert not [piece async for piece in stream]  # only a call: no text
    (call,) = stream.result.tool_calls
    assert stream.result.finish_reason == "tool_calls"
    names = {tool["function"]["name"]: tool["function"]["parameters"] for tool in tools}
    schema = names[call["function"]["name"]]
    arguments = json.loads(call["function"]["arguments"])
    assert set(schema.get("required", [])) <= set(arguments) <= set(schema["properties"])
    state = domain.new_state(scenario)
    domain.execute_tool(state, call["function"]["name"], arguments)  # runs without a TypeError
