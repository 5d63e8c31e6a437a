"""The embedded engine with a chat template that renders tools in the Hermes style (Qwen3's; here
SmolLM2's weights under a template modelled on it): the tools and the conversation's structured
calls go to the template, and a Hermes-style reply comes back as OpenAI `tool_calls`, as vLLM
with `--tool-call-parser hermes` answers it. The reply is forced to one such call with a
`const_string` structural tag, so the test does not depend on what the small model would write."""

import json
import shutil
from pathlib import Path

import httpx
import pytest

from agents.serving.launch import start_engine, stop_engine
from tests.support.engine import ASK, CLOCK, WEATHER, check_weather_arguments
from tests.support.hermes import CALL, HERMES_TEMPLATE, TOOL

pytestmark = pytest.mark.model

MESSAGES = [
    {"role": "system", "content": "You help shoppers."},
    {"role": "user", "content": "My email is a@b.c."},
]


@pytest.fixture(scope="module")
def hermes_engine(base_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("hermes") / "SmolLM2-hermes"
    folder.mkdir()
    for item in Path(base_model).iterdir():  # SmolLM2's weights, linked; its template replaced
        (folder / item.name).symlink_to(item.resolve())
    (folder / "chat_template.jinja").unlink()
    shutil.copy(HERMES_TEMPLATE, folder / "chat_template.jinja")
    url, process = start_engine(folder, extra_args=["--threads", "1"])
    yield url, folder
    stop_engine(process)


def ask(url: str, model: str, **body) -> httpx.Response:
    forced = {"type": "structural_tag", "format": {"type": "const_string", "value": CALL}}
    request = {
        "model": model,
        "messages": MESSAGES,
        "tools": [TOOL],
        "temperature": 0,
        "max_tokens": 120,
        "response_format": forced,
        **body,
    }
    return httpx.post(f"{url}/chat/completions", json=request, timeout=120)


def test_a_hermes_reply_is_answered_as_tool_calls(hermes_engine):
    url, model = hermes_engine[0], hermes_engine[1].name
    reply = ask(url, model)
    assert reply.status_code == 200, reply.text
    (choice,) = reply.json()["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "find_user_id_by_email"
    assert json.loads(call["function"]["arguments"]) == {"email": "a@b.c"}


def test_streamed_the_call_is_a_tool_call_delta_and_no_content(hermes_engine):
    url, model = hermes_engine[0], hermes_engine[1].name
    reply = ask(url, model, stream=True)
    assert reply.status_code == 200, reply.text
    events = [
        json.loads(line[6:]) for line in reply.text.splitlines() if line.startswith("data: {")
    ]
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    assert "".join(d.get("content") or "" for d in deltas) == ""
    (call,) = [c for d in deltas for c in d.get("tool_calls") or []]
    assert call["function"]["name"] == "find_user_id_by_email"
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_without_tools_the_same_text_is_content(hermes_engine):
    url, model = hermes_engine[0], hermes_engine[1].name
    reply = ask(url, model, tools=None)
    (choice,) = reply.json()["choices"]
    assert choice["message"]["content"] == CALL and not choice["message"]["tool_calls"]


def test_a_conversation_with_structured_calls_renders_natively(hermes_engine):
    """The call and its result in the history go to the template as they are (it renders them
    as <tool_call> and <tool_response> blocks); the next reply is another native call."""
    url, model = hermes_engine[0], hermes_engine[1].name
    earlier = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "find_user_id_by_email", "arguments": '{"email": "x@y.z"}'},
            }
        ],
    }
    result = {"role": "tool", "tool_call_id": "call_1", "content": "Error: user not found"}
    conversation = [*MESSAGES, earlier, result]
    reply = ask(url, model, messages=conversation)
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["tool_calls"]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(hermes_engine[1])
    native = tokenizer.apply_chat_template(
        [{**m, "content": m["content"] or ""} for m in conversation],
        tools=[TOOL],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nError" in native
    prompt_ids = tokenizer(native, add_special_tokens=False).input_ids
    assert reply.json()["usage"]["prompt_tokens"] == len(prompt_ids)


# Forced calls: with a Hermes-style template the engine has its parser (vLLM is served with
# `--tool-call-parser hermes` for one), so tool_choice "required" or a named function is kept.
def forced(url: str, model: str, **body) -> httpx.Response:
    request = {
        "model": model,
        "messages": ASK,
        "tools": [WEATHER, CLOCK],
        "max_tokens": 48,
        "temperature": 0,
        **body,
    }
    return httpx.post(f"{url}/chat/completions", json=request, timeout=120)


def test_required_tool_choice_returns_a_valid_tool_call(hermes_engine):
    url, model = hermes_engine[0], hermes_engine[1].name
    reply = forced(url, model, tool_choice="required")
    assert reply.status_code == 200, reply.text
    (choice,) = reply.json()["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert not choice["message"]["content"]
    (call,) = choice["message"]["tool_calls"]  # one call unless parallel_tool_calls is true
    assert call["function"]["name"] in {"get_weather", "get_time"}
    if call["function"]["name"] == "get_weather":
        check_weather_arguments(call["function"]["arguments"])
    else:
        assert json.loads(call["function"]["arguments"]) == {}


def test_named_tool_choice_streams_that_call(hermes_engine):
    url, model = hermes_engine[0], hermes_engine[1].name
    named = {"type": "function", "function": {"name": "get_weather"}}
    reply = forced(url, model, tool_choice=named, stream=True)
    assert reply.status_code == 200, reply.text
    events = [
        json.loads(line[6:]) for line in reply.text.splitlines() if line.startswith("data: {")
    ]
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    calls = [c for d in deltas for c in d.get("tool_calls") or []]
    assert [c["function"]["name"] for c in calls] == ["get_weather"]
    check_weather_arguments(calls[0]["function"]["arguments"])
    assert not "".join(d.get("content") or "" for d in deltas)
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_a_forced_call_with_a_response_format_is_400(hermes_engine):
    url, model = hermes_engine[0], hermes_engine[1].name
    reply = forced(url, model, tool_choice="required", response_format={"type": "json_object"})
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "response_format"
