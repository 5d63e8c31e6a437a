"""The embedded engine's OpenAI-compatible API, over HTTP against the real process."""

import json
import re
import time

import httpx
import pytest

pytestmark = pytest.mark.model

QUESTION = "Name three fruits."


def sse_events(response: httpx.Response) -> list:
    """The `data:` payloads of a streamed response, decoded (the literal "[DONE]" kept)."""
    events = []
    for block in response.text.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        payload = block[len("data: ") :]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


@pytest.fixture(scope="module")
def greedy(served) -> dict:
    """The base model's greedy reply to QUESTION, the reference several tests compare with."""
    return served.chat(QUESTION, max_tokens=12)


def test_health_and_models_list_base_and_adapters(served):
    assert httpx.get(served.url.removesuffix("/v1") + "/health").status_code == 200
    models = httpx.get(f"{served.url}/models").json()
    assert models["object"] == "list"
    by_id = {entry["id"]: entry for entry in models["data"]}
    assert models["data"][0]["id"] == served.base
    assert set(by_id) == {served.base, "tiny-lora", "plain", "explicit"}
    assert by_id["tiny-lora"]["parent"] == served.base
    assert by_id["tiny-lora"]["root"].endswith("run-1/step-2")


def test_stream_format(served, greedy):
    body = {
        "model": served.base,
        "messages": [{"role": "user", "content": QUESTION}],
        "temperature": 0,
        "max_tokens": 12,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    response = served.post(body)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response)

    assert events[-1] == "[DONE]"
    *chunks, usage_chunk, _ = events
    role, *content, final = chunks
    for chunk in chunks + [usage_chunk]:
        assert chunk["object"] == "chat.completion.chunk"
        assert chunk["id"] == role["id"] and chunk["id"].startswith("chatcmpl-")
        assert chunk["model"] == served.base and isinstance(chunk["created"], int)
    assert role["choices"][0]["delta"]["role"] == "assistant"
    assert role["choices"][0]["finish_reason"] is None
    assert content, "no content deltas"
    for chunk in content:
        (choice,) = chunk["choices"]
        assert choice["index"] == 0 and choice["finish_reason"] is None
        assert set(choice["delta"]) == {"content"} and choice["delta"]["content"]
    assert final["choices"][0]["finish_reason"] == "length"
    assert final["choices"][0]["delta"] == {}
    assert usage_chunk["choices"] == []
    usage = usage_chunk["usage"]
    assert usage["completion_tokens"] == 12
    assert usage["total_tokens"] == usage["prompt_tokens"] + 12 > 12
    # streaming and non-streaming greedy decoding produce the same text
    text = "".join(chunk["choices"][0]["delta"]["content"] for chunk in content)
    assert text == greedy["choices"][0]["message"]["content"]


def test_stream_without_usage_has_no_usage_chunk(served):
    body = {
        "model": served.base,
        "messages": [{"role": "user", "content": QUESTION}],
        "max_tokens": 2,
        "stream": True,
    }
    events = sse_events(served.post(body))
    assert events[-1] == "[DONE]"
    assert all(event["choices"] for event in events[:-1])


def test_non_streaming_shape(greedy, served):
    assert greedy["object"] == "chat.completion"
    assert greedy["id"].startswith("chatcmpl-") and greedy["model"] == served.base
    (choice,) = greedy["choices"]
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"].strip()
    assert choice["finish_reason"] == "length"
    usage = greedy["usage"]
    assert usage["completion_tokens"] == 12
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_greedy_is_deterministic(served, greedy):
    again = served.chat(QUESTION, max_tokens=12)
    assert again["choices"][0]["message"]["content"] == greedy["choices"][0]["message"]["content"]


def test_seed_makes_sampling_reproducible(served):
    params = {"temperature": 1.0, "top_p": 0.95, "max_tokens": 8}
    first = served.chat("Write a word.", seed=7, **params)["choices"][0]["message"]["content"]
    second = served.chat("Write a word.", seed=7, **params)["choices"][0]["message"]["content"]
    assert first == second


def test_max_tokens_respected(served):
    reply = served.chat(QUESTION, max_tokens=3)
    assert reply["usage"]["completion_tokens"] == 3
    assert reply["choices"][0]["finish_reason"] == "length"
    reply = served.chat(QUESTION, max_completion_tokens=2, max_tokens=50)
    assert reply["usage"]["completion_tokens"] == 2


def test_stop_sequence_cuts_the_text(served, greedy):
    text = greedy["choices"][0]["message"]["content"]
    assert len(text) >= 12, text
    stop = text[len(text) // 2 : len(text) // 2 + 3]  # a sequence the model produces mid-reply
    for stream in (False, True):
        body = {
            "model": served.base,
            "messages": [{"role": "user", "content": QUESTION}],
            "temperature": 0,
            "max_tokens": 12,
            "stop": [stop, "never-produced"],
            "stream": stream,
        }
        response = served.post(body)
        if stream:
            chunks = [e for e in sse_events(response) if e != "[DONE]"]
            cut = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
            finish = chunks[-1]["choices"][0]["finish_reason"]
        else:
            cut = response.json()["choices"][0]["message"]["content"]
            finish = response.json()["choices"][0]["finish_reason"]
        assert cut == text[: text.index(stop)]
        assert finish == "stop"


def test_chat_template_roles(served):
    """System, assistant and tool turns (and content parts) are accepted and rendered."""
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [{"type": "text", "text": "Look up order 7."}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_order", "arguments": '{"id": 7}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"status": "shipped"}'},
    ]
    response = served.post({"model": served.base, "messages": messages, "max_tokens": 2})
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["prompt_tokens"] > 40


def test_unknown_model_is_404(served):
    response = served.post(
        {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert response.status_code == 404
    error = response.json()["error"]
    assert "no-such-model" in error["message"]
    assert error == {**error, "type": "NotFoundError", "param": "model", "code": 404}


# vLLM 0.32 answers two kinds of 400 (vllm/entrypoints/serve/exception_handling): a body that
# does not fit its pydantic models is a "Bad Request" whose param is the field's path under
# "body"; a well-formed request it refuses (sampling bounds) is a "BadRequestError" naming the
# parameter. The embedded engine answers both the same way.
NOT_THE_MODEL = "Bad Request"
REFUSED = "BadRequestError"
BAD_BODIES = [
    ({"temperature": "hot"}, NOT_THE_MODEL, "body.temperature"),
    ({"max_tokens": 2.5}, NOT_THE_MODEL, "body.max_tokens"),
    ({"seed": "x"}, NOT_THE_MODEL, "body.seed"),
    ({"stop": 3}, NOT_THE_MODEL, "body.stop"),
    ({"messages": []}, NOT_THE_MODEL, "body.messages"),
    ({"messages": None}, NOT_THE_MODEL, "body.messages"),  # missing
    ({"messages": [{"role": "robot", "content": "hi"}]}, NOT_THE_MODEL, "body.messages.0.role"),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        NOT_THE_MODEL,
        "body.messages.0.content",
    ),
    ({"model": None}, NOT_THE_MODEL, "body.model"),
    ({"stream": False, "stream_options": {"include_usage": True}}, NOT_THE_MODEL, "stream_options"),
    ({"temperature": 5}, REFUSED, "temperature"),
    ({"temperature": -0.5}, REFUSED, "temperature"),
    ({"top_p": 0}, REFUSED, "top_p"),
    ({"max_tokens": 0}, REFUSED, "max_tokens"),
    ({"max_completion_tokens": 0}, REFUSED, "max_completion_tokens"),
    ({"n": 2}, REFUSED, "n"),  # vLLM samples n choices; this engine one
    ({"stop": [""]}, REFUSED, "stop"),
]


@pytest.mark.parametrize(
    "change,kind,param", BAD_BODIES, ids=[f"{p}-{next(iter(c))}" for c, _, p in BAD_BODIES]
)
def test_invalid_parameters_are_vllms_400(served, change, kind, param):
    body = {"model": served.base, "messages": [{"role": "user", "content": "hi"}], **change}
    body = {key: value for key, value in body.items() if value is not None or key == "model"}
    response = served.post(body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["param"], error["code"]) == (kind, param, 400)
    assert error["message"]
    if kind == NOT_THE_MODEL:  # vLLM's wording of a RequestValidationError
        assert (
            error["message"].startswith("1 validation error:\n  {") or "errors:" in error["message"]
        )


def test_invalid_json_is_400(served):
    headers = {"content-type": "application/json"}
    response = httpx.post(
        f"{served.url}/chat/completions", content=b"{not json", headers=headers, timeout=30
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("Bad Request", "body", 400)
    assert "json_invalid" in error["message"]


def test_a_body_that_is_not_json_is_400(served):
    response = httpx.post(f"{served.url}/chat/completions", content=b"{}", timeout=30)
    assert response.status_code == 400
    assert response.json() == {
        "error": {
            "message": "1 validation error:\n  Unsupported Media Type: Only 'application/json' "
            "is allowed",
            "type": "Bad Request",
            "param": None,
            "code": 400,
        }
    }


def test_context_length_is_checked(served):
    """As vLLM: a reply budget beyond the model's length, or a prompt longer than it, is a 400
    (a budget beyond the room the prompt leaves is cut to it: test_decoding.py)."""
    body = {
        "model": served.base,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 10**6,
    }
    response = served.post(body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["param"]) == ("BadRequestError", "max_tokens")
    assert "cannot be greater than max_model_len" in error["message"]
    long = {"role": "user", "content": "sea " * 9000}  # more tokens than SmolLM2's 8192
    response = served.post({**body, "messages": [long], "max_tokens": 1})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "input_tokens"


def test_unknown_routes_are_vllm_shaped(served):
    response = httpx.get(f"{served.url}/chat/completions", timeout=30)
    assert response.status_code == 405
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("Method Not Allowed", 405)


@pytest.mark.parametrize(
    "path",
    [
        "/v1/completions",
        "/v1/load_lora_adapter",
        "/v1/unload_lora_adapter",
        "/pause",
        "/resume",
        "/update_weights",
        "/inference/v1/generate",
    ],
)
def test_vllms_other_routes_are_not_served(served, path):
    """docs/serving.md's contract with vLLM: a caller that needs one of vLLM's other routes (raw
    completions, adapters loaded at run time, a trainer's weight transfer) gets a 404 in vLLM's
    shape, never a reply that pretends the route did its job."""
    response = httpx.post(served.url.removesuffix("/v1") + path, json={}, timeout=30)
    assert response.status_code == 404
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("Not Found", 404)


def test_adapters_are_served_and_change_the_reply(served, greedy):
    base_text = greedy["choices"][0]["message"]["content"]
    tuned = served.chat(QUESTION, model="tiny-lora", max_tokens=12)
    assert tuned["model"] == "tiny-lora"
    assert tuned["choices"][0]["message"]["content"] != base_text
    # the same weights under two other names give the same reply
    for name in ("plain", "explicit"):
        same = served.chat(QUESTION, model=name, max_tokens=12)
        assert same["choices"][0]["message"]["content"] == tuned["choices"][0]["message"]["content"]
    # --max-loras 2 evicted one of three; the base model runs with adapters disabled
    again = served.chat(QUESTION, max_tokens=12)
    assert again["choices"][0]["message"]["content"] == base_text


def test_new_adapter_folder_is_served_without_restart(served, adapters_root):
    import shutil

    target = adapters_root / "late"
    shutil.copytree(adapters_root / "plain", target)
    try:
        ids = [entry["id"] for entry in httpx.get(f"{served.url}/models").json()["data"]]
        assert "late" in ids
        assert served.chat("hi", model="late", max_tokens=1)["usage"]["completion_tokens"] == 1
    finally:
        shutil.rmtree(target)
    response = served.post({"model": "late", "messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 404


def test_client_disconnect_stops_generation(served):
    body = {
        "model": served.base,
        "messages": [{"role": "user", "content": "Write a long story about the sea."}],
        "max_tokens": 300,
        "temperature": 0,
        "stream": True,
    }
    with httpx.Client(timeout=120) as client:
        with client.stream("POST", f"{served.url}/chat/completions", json=body) as response:
            for line in response.iter_lines():
                if '"content":"' in line and '"content":""' not in line:
                    break  # one real token arrived; now hang up
    # The engine logs how each generation ended; this one must be aborted early.
    deadline = time.monotonic() + 60
    pattern = re.compile(r"(\d+) completion tokens in [\d.]+s, finish_reason=abort")
    while time.monotonic() < deadline:
        match = pattern.search(served.process.log_path.read_text())
        if match:
            break
        time.sleep(0.2)
    assert match, "the engine did not report an aborted generation"
    assert int(match.group(1)) < 300
    # and the engine is free for the next request
    assert served.chat("hi", max_tokens=1)["usage"]["completion_tokens"] == 1


def test_a_broken_adapter_is_a_clear_400_and_harms_nothing(served, adapters_root, greedy):
    import shutil

    target = adapters_root / "broken"
    shutil.copytree(adapters_root / "plain", target)
    (target / "adapter_model.safetensors").write_bytes(b"not a tensor file")
    try:
        response = served.post(
            {"model": "broken", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        )
    finally:
        shutil.rmtree(target)
    assert response.status_code == 400
    assert "Could not load the LoRA adapter `broken`" in response.json()["error"]["message"]
    again = served.chat(QUESTION, max_tokens=12)
    assert again["choices"][0]["message"]["content"] == greedy["choices"][0]["message"]["content"]
