"""vLLM serving a model whose chat template renders tools in the Hermes style (SmolLM2's weights
under a template modelled on Qwen3's, given with --chat-template): the launcher adds
`--enable-auto-tool-choice --tool-call-parser hermes` by itself, and vLLM's hermes parser answers
a Hermes-style reply as OpenAI `tool_calls`, as the embedded engine does
(tests/agents/llm/test_native_tool_calls.py). The reply is forced to one call with a `const_string`
structural tag, so the test does not depend on what the small model would write."""

import json
from pathlib import Path

import httpx
import pytest

from agents.serving.launch import stop_engine
from agents.serving.vllm import start_vllm
from tests.support.hermes import CALL, HERMES_TEMPLATE, TOOL

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def hermes_vllm(vllm_ready, base_model):
    url, process = start_vllm(
        base_model,
        python=vllm_ready,
        max_model_len=2048,
        extra_args=["--chat-template", str(HERMES_TEMPLATE)],
    )
    yield url
    stop_engine(process, timeout=20)


def test_vllm_parses_a_hermes_call_into_tool_calls(hermes_vllm, base_model):
    forced = {"type": "structural_tag", "format": {"type": "const_string", "value": CALL}}
    request = {
        "model": Path(base_model).name,
        "messages": [
            {"role": "system", "content": "You help shoppers."},
            {"role": "user", "content": "My email is a@b.c."},
        ],
        "tools": [TOOL],
        "tool_choice": "auto",
        "temperature": 0,
        "max_tokens": 120,
        "response_format": forced,
    }
    reply = httpx.post(f"{hermes_vllm}/chat/completions", json=request, timeout=300)
    assert reply.status_code == 200, reply.text
    (choice,) = reply.json()["choices"]
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "find_user_id_by_email"
    assert json.loads(call["function"]["arguments"]) == {"email": "a@b.c"}
    assert choice["finish_reason"] == "tool_calls" and not choice["message"]["content"]
