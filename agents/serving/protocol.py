"""The OpenAI chat-completions wire format: request validation and response shapes.

Only what the embedded engine honours is validated; other OpenAI fields (logprobs,
presence_penalty, response_format, ...) are accepted and ignored, as vLLM ignores what it
does not support. `tools` are passed to the chat template (SmolLM2's ignores them): the engine
has no native tool calling, callers use agents.llm's JSON tool format.
"""

import json
import time
import uuid
from dataclasses import dataclass, field

from agents.llm.tool_format import render_tool_calls

ROLES = {"system", "developer", "user", "assistant", "tool"}


class OpenAIError(Exception):
    """An error answered as `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(self, status: int, message: str, *, code: str | None = None, param=None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param

    def body(self) -> dict:
        kind = {
            400: "invalid_request_error",
            404: "invalid_request_error",
            405: "invalid_request_error",
            500: "server_error",
        }.get(self.status, "api_error")
        return {
            "error": {
                "message": self.message,
                "type": kind,
                "param": self.param,
                "code": self.code,
            }
        }


def invalid(message: str, param: str | None = None, code: str = "invalid_value") -> OpenAIError:
    return OpenAIError(400, message, code=code, param=param)


@dataclass
class ChatRequest:
    model: str
    messages: list[dict]  # normalised: role in system/user/assistant/tool, content a string
    max_tokens: int | None = None
    temperature: float = 1.0  # OpenAI's default; 0 means greedy
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    tools: list[dict] | None = None


def parse_chat_request(raw: bytes) -> ChatRequest:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as error:
        message = f"We could not parse the JSON body of your request: {error}"
        raise invalid(message, code="invalid_json") from error
    if not isinstance(body, dict):
        raise invalid("The request body must be a JSON object.", code="invalid_json")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("`model` is required and must be a string.", "model")
    n = body.get("n")
    if n is not None and n != 1:
        raise invalid("Only n=1 is supported.", "n")
    stream = _typed(body, "stream", bool, False)
    options = _typed(body, "stream_options", dict, None)
    if options is not None and not stream:
        raise invalid("`stream_options` is only allowed when `stream` is true.", "stream_options")
    max_tokens = body.get("max_completion_tokens")
    max_name = "max_completion_tokens"
    if max_tokens is None:
        max_tokens, max_name = body.get("max_tokens"), "max_tokens"
    if max_tokens is not None and (not _is_int(max_tokens) or max_tokens < 1):
        raise invalid(f"`{max_name}` must be a positive integer.", max_name)
    temperature = _number(body, "temperature", 1.0, low=0.0, high=2.0)
    top_p = _number(body, "top_p", 1.0, low=0.0, high=1.0)
    if top_p <= 0:
        raise invalid("`top_p` must be greater than 0.", "top_p")
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise invalid("`seed` must be an integer.", "seed")
    tools = _typed(body, "tools", list, None)
    return ChatRequest(
        model=model,
        messages=_messages(body.get("messages")),
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        stop=_stop(body.get("stop")),
        stream=stream,
        include_usage=bool(options and options.get("include_usage")),
        tools=tools or None,
    )


def _messages(messages) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise invalid("`messages` must be a non-empty list.", "messages")
    out = []
    for i, message in enumerate(messages):
        param = f"messages[{i}]"
        if not isinstance(message, dict):
            raise invalid(f"{param} must be an object.", param)
        role = message.get("role")
        if role not in ROLES:
            raise invalid(f"{param}.role must be one of {sorted(ROLES)}, not {role!r}.", param)
        content = _content(message.get("content"), param)
        if role == "assistant" and message.get("tool_calls"):
            blocks = render_tool_calls(message["tool_calls"])
            content = f"{content}\n{blocks}" if content else blocks
        out.append({"role": "system" if role == "developer" else role, "content": content})
    return out


def _content(content, param: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise invalid(f"{param}.content: only text parts are supported.", param)
            texts.append(str(part.get("text", "")))
        return "".join(texts)
    raise invalid(f"{param}.content must be a string or a list of text parts.", param)


def _stop(stop) -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise invalid("`stop` must be a non-empty string or a list of them.", "stop")
    return stops


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(body: dict, name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise invalid(f"`{name}` must be a number between {low:g} and {high:g}.", name)
    return float(value)


def _typed(body: dict, name: str, kind: type, default):
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, kind):
        raise invalid(f"`{name}` must be a {kind.__name__}.", name)
    return value


# Responses -------------------------------------------------------------------------------


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def chunk(cid: str, model: str, delta: dict | None, finish_reason=None, usage=None) -> dict:
    """One chat.completion.chunk; with delta None it is the usage-only chunk (choices [])."""
    body = {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
    }
    if delta is None:
        body["choices"] = []
        body["usage"] = usage
    else:
        body["choices"] = [
            {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        ]
    return body


def completion(cid: str, model: str, text: str, finish_reason: str | None, usage: dict) -> dict:
    return {
        "id": cid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        ],
        "usage": usage,
    }


def sse(data) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()
