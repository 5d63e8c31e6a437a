"""The one async client for OpenAI-compatible engines (vLLM, the embedded engine, hosted APIs).

    async with LLMClient("http://127.0.0.1:8001/v1") as client:
        stream = client.stream_chat(model, messages, temperature=0.7, max_tokens=200)
        async for piece in stream:          # assistant text as it arrives
            ...
        stream.result                       # ChatResult: content, tool_calls, usage, ttft, ...
        result = await client.chat(model, messages)

Timeouts: `connect_timeout` bounds opening a connection; `timeout` bounds every wait for the
next byte (for a non-streamed reply that is the whole generation; for a stream, the wait for
the first chunk and then between chunks).

Retries: connection failures (refused, connect timeout, dropped before any token) and 5xx/429
answers are retried up to `max_retries` times with exponential backoff (`backoff` * 2**n, or
the server's Retry-After), but only before the first piece has been handed to the caller, so
streamed text is never duplicated. Other 4xx answers and read timeouts are not retried.

Tool calls: with tool_format="native" the `tools` go to the engine and streamed tool_call
deltas are assembled by index. With tool_format="json" (models without native tool calling,
see agents.llm.tool_format) the tools are described in the system prompt and the reply's
`<tool_call>` blocks are parsed out of the text; callers see the same ChatResult either way.
"""

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field

import httpx

from agents.llm.errors import LLMConnectionError, LLMError, LLMHTTPError, LLMTimeout
from agents.llm.tool_format import ToolCallFilter, messages_for_json_tools

TOOL_FORMATS = ("native", "json")


@dataclass
class ChatResult:
    content: str
    tool_calls: list[dict] = field(default_factory=list)  # [{"id", "type", "function"}]
    finish_reason: str | None = None
    model: str = ""
    usage: dict | None = None  # {"prompt_tokens", "completion_tokens", "total_tokens"}
    ttft: float | None = None  # seconds from the call to the first content or tool token
    latency: float = 0.0  # seconds from the call to the end of the reply
    attempts: int = 1


@dataclass
class CompletionResult:
    """One /v1/completions choice. `token_ids` are the sampled ids when the engine returns them
    (vLLM with `return_token_ids=True`), else None."""

    text: str
    token_ids: list[int] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None  # vLLM: the stop token id or string, None for eos
    logprobs: dict | None = None  # the choice's `logprobs` as the engine sent it (`logprobs=N`)
    model: str = ""
    usage: dict | None = None
    attempts: int = 1


class LLMClient:
    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8001/v1",
        api_key: str | None = None,
        timeout: float = 60.0,
        connect_timeout: float = 5.0,
        max_retries: int = 2,
        backoff: float = 0.5,
        tool_format: str = "native",
    ):
        _check_tool_format(tool_format)
        self.base_url = base_url.rstrip("/")
        self.max_retries = max_retries
        self.backoff = backoff
        self.tool_format = tool_format
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
        )

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.aclose()

    async def aclose(self):
        await self._http.aclose()

    def stream_chat(
        self,
        model: str,
        messages: list[dict],
        tools: list[dict] | None = None,
        *,
        tool_format: str | None = None,
        **params,
    ) -> "ChatStream":
        """A reply streamed piece by piece; `stream.result` holds the ChatResult afterwards."""
        body, json_tools = self._body(model, messages, tools, tool_format, params)
        body["stream"] = True
        body["stream_options"] = {"include_usage": True, **(params.get("stream_options") or {})}
        return ChatStream(self, body, json_tools)

    async def chat(
        self,
        model: str,
        messages: list[dict],
        tools: list[dict] | None = None,
        *,
        tool_format: str | None = None,
        **params,
    ) -> ChatResult:
        """A whole reply in one response."""
        body, json_tools = self._body(model, messages, tools, tool_format, params)
        body["stream"] = False
        started = time.monotonic()
        data, attempts = await self._request("POST", "/chat/completions", body)
        latency = time.monotonic() - started
        try:
            choice = data["choices"][0]
            message = choice.get("message") or {}
        except (KeyError, IndexError, TypeError) as error:
            raise LLMError(f"Malformed chat completion from {self.base_url}: {data!r}") from error
        content = message.get("content") or ""
        tool_calls = [_complete_call(call) for call in message.get("tool_calls") or []]
        if json_tools:
            parser = ToolCallFilter()
            content = parser.feed(content) + parser.finish()
            tool_calls += parser.tool_calls
        return ChatResult(
            content=content,
            tool_calls=tool_calls,
            finish_reason=_finish_reason(choice.get("finish_reason"), tool_calls),
            model=data.get("model", model),
            usage=data.get("usage"),
            ttft=latency if content or tool_calls else None,
            latency=latency,
            attempts=attempts,
        )

    async def complete(
        self, model: str, prompt: str | list[int], *, return_token_ids: bool = False, **params
    ) -> CompletionResult:
        """A raw completion of `prompt` (text, or token ids so that no chat template or
        re-tokenization stands between the caller and the model), not streamed. With
        `return_token_ids` vLLM also answers the sampled token ids (a trainer needs exactly those).
        """
        body = {"model": model, "prompt": prompt, "stream": False}
        if return_token_ids:
            body["return_token_ids"] = True
        body.update({k: v for k, v in params.items() if v is not None})
        data, attempts = await self._request("POST", "/completions", body)
        try:
            choice = data["choices"][0]
        except (KeyError, IndexError, TypeError) as error:
            raise LLMError(f"Malformed completion from {self.base_url}: {data!r}") from error
        ids = choice.get("token_ids")
        if return_token_ids and ids is None:
            raise LLMError(f"{self.base_url} returned no token_ids (is it vLLM?)")
        return CompletionResult(
            text=choice.get("text") or "",
            token_ids=list(ids) if ids is not None else None,
            finish_reason=choice.get("finish_reason"),
            stop_reason=choice.get("stop_reason"),
            logprobs=choice.get("logprobs"),
            model=data.get("model", model),
            usage=data.get("usage"),
            attempts=attempts,
        )

    async def load_lora_adapter(self, name: str, path: str, *, replace: bool = False) -> None:
        """vLLM: serve the LoRA adapter folder `path` as model `name` from now on (the server
        needs --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, and must see `path`).
        `replace`: an adapter already loaded under `name` is replaced (else vLLM answers 400)."""
        body = {"lora_name": name, "lora_path": path}
        if replace:
            body["load_inplace"] = True
        await self._post_plain("/load_lora_adapter", body)

    async def unload_lora_adapter(self, name: str) -> None:
        """vLLM: stop serving the runtime-loaded adapter `name`."""
        await self._post_plain("/unload_lora_adapter", {"lora_name": name})

    async def _post_plain(self, path: str, body: dict) -> None:
        # vLLM answers these with plain text, not JSON, so _request does not fit; not retried
        # (a load that timed out may have happened)
        try:
            response = await self._http.post(path, json=body)
        except Exception as error:
            raise _as_llm_error(error, self.base_url + path) from error
        if response.status_code >= 400:
            raise _http_error(response, response.text)

    async def list_models(self) -> list[str]:
        data, _ = await self._request("GET", "/models", None)
        try:
            return [entry["id"] for entry in data["data"]]
        except (KeyError, TypeError) as error:
            raise LLMError(f"Malformed model list from {self.base_url}: {data!r}") from error

    def _body(self, model, messages, tools, tool_format, params) -> tuple[dict, bool]:
        tool_format = tool_format or self.tool_format
        _check_tool_format(tool_format)
        json_tools = tool_format == "json"
        if json_tools:
            messages = messages_for_json_tools(messages, tools)
            params = {
                k: v for k, v in params.items() if k not in ("tool_choice", "parallel_tool_calls")
            }
        body = {"model": model, "messages": messages}
        if tools and not json_tools:
            body["tools"] = tools
        body.update({k: v for k, v in params.items() if v is not None and k != "stream_options"})
        return body, json_tools

    async def _request(self, method: str, path: str, body: dict | None) -> tuple[dict, int]:
        """One JSON request with retries; returns (decoded body, attempts)."""
        attempts = 0
        while True:
            attempts += 1
            try:
                response = await self._http.request(method, path, json=body)
                if response.status_code >= 400:
                    raise _http_error(response, response.text)
                try:
                    return response.json(), attempts
                except json.JSONDecodeError as error:
                    raise LLMError(f"{self.base_url}{path} answered with invalid JSON") from error
            except Exception as error:
                error = _as_llm_error(error, self.base_url + path)
                delay = self._retry_delay(error, attempts)
                if delay is None:
                    error.attempts = attempts
                    raise error from error.__cause__
                await asyncio.sleep(delay)

    def _retry_delay(self, error: LLMError, attempts: int) -> float | None:
        """Seconds to wait before the next attempt, or None to give up."""
        if not error.retryable or attempts > self.max_retries:
            return None
        retry_after = getattr(error, "retry_after", None)
        if retry_after is not None:
            return min(retry_after, 30.0)
        return self.backoff * 2 ** (attempts - 1)


class ChatStream:
    """Async iterator of assistant text pieces; `result` is set once the reply has ended.

    Breaking out of `async for` early leaves the connection open until `aclose()`; use
    `async with client.stream_chat(...) as stream:` to have it closed for you.
    """

    def __init__(self, client: LLMClient, body: dict, json_tools: bool):
        self._client = client
        self._body = body
        self._json_tools = json_tools
        self._result: ChatResult | None = None
        self._pieces = self._run()

    @property
    def result(self) -> ChatResult:
        if self._result is None:
            raise RuntimeError("The stream has not finished: iterate it to the end first.")
        return self._result

    def __aiter__(self):
        return self

    async def __anext__(self) -> str:
        return await self._pieces.__anext__()

    async def aclose(self):
        await self._pieces.aclose()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.aclose()

    async def _run(self):
        client, url = self._client, self._client.base_url + "/chat/completions"
        started = time.monotonic()
        attempts = 0
        streamed = []  # pieces handed to the caller: after the first one, no more retries
        while True:
            attempts += 1
            reply = _Reply(self._json_tools)
            try:
                async with client._http.stream(
                    "POST", "/chat/completions", json=self._body
                ) as response:
                    if response.status_code >= 400:
                        raise _http_error(
                            response, (await response.aread()).decode(errors="replace")
                        )
                    async for chunk in _sse_chunks(response):
                        piece = reply.add(chunk, started)
                        if piece:
                            streamed.append(piece)
                            yield piece
                if not (reply.finished or reply.finish_reason):
                    raise LLMConnectionError(f"The stream from {url} ended before the reply did.")
                break
            except Exception as error:
                error = _as_llm_error(error, url)
                delay = None if streamed else client._retry_delay(error, attempts)
                if delay is None:
                    error.attempts = attempts
                    error.partial = "".join(streamed)
                    raise error from error.__cause__
                await asyncio.sleep(delay)
        tail = reply.close()
        if tail:
            streamed.append(tail)
            yield tail
        self._result = ChatResult(
            content="".join(streamed),
            tool_calls=reply.tool_calls(),
            finish_reason=_finish_reason(reply.finish_reason, reply.tool_calls()),
            model=reply.model or self._body["model"],
            usage=reply.usage,
            ttft=reply.ttft,
            latency=time.monotonic() - started,
            attempts=attempts,
        )


class _Reply:
    """Accumulates one streamed reply: content, tool-call deltas by index, usage, timing."""

    def __init__(self, json_tools: bool):
        self.parser = ToolCallFilter() if json_tools else None
        self.calls: dict[int, dict] = {}
        self.finish_reason = None
        self.finished = False
        self.model = None
        self.usage = None
        self.ttft = None

    def add(self, chunk, started: float) -> str:
        if chunk is None:  # [DONE]
            self.finished = True
            return ""
        if "error" in chunk:
            error = chunk["error"] if isinstance(chunk["error"], dict) else {}
            raise LLMError(f"The engine failed mid-stream: {error.get('message', chunk)}")
        self.model = chunk.get("model") or self.model
        self.usage = chunk.get("usage") or self.usage
        piece = ""
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            content = delta.get("content")
            if content or delta.get("tool_calls"):
                self.ttft = self.ttft if self.ttft is not None else time.monotonic() - started
            if content:
                piece += self.parser.feed(content) if self.parser else content
            for call in delta.get("tool_calls") or []:
                self._add_call(call)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return piece

    def _add_call(self, delta: dict):
        slot = self.calls.setdefault(
            delta.get("index", len(self.calls)),
            {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
        )
        slot["id"] = delta.get("id") or slot["id"]
        slot["type"] = delta.get("type") or slot["type"]
        function = delta.get("function") or {}
        slot["function"]["name"] += function.get("name") or ""
        slot["function"]["arguments"] += function.get("arguments") or ""

    def close(self) -> str:
        return self.parser.finish() if self.parser else ""

    def tool_calls(self) -> list[dict]:
        calls = [_complete_call(self.calls[index]) for index in sorted(self.calls)]
        return calls + (self.parser.tool_calls if self.parser else [])


async def _sse_chunks(response: httpx.Response):
    """Decoded `data:` payloads of a server-sent event stream; None for `[DONE]`."""
    data = []
    async for line in response.aiter_lines():
        if line.startswith("data:"):
            data.append(line[5:].lstrip())
        elif not line.strip() and data:
            payload, data = "\n".join(data), []
            if payload == "[DONE]":
                yield None
                return
            try:
                yield json.loads(payload)
            except json.JSONDecodeError as error:
                raise LLMError(f"Unreadable stream chunk: {payload[:200]!r}") from error
    if data and "\n".join(data) == "[DONE]":  # a last event without its blank line
        yield None


def _complete_call(call: dict) -> dict:
    function = call.get("function") or {}
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments or {}, ensure_ascii=False)
    return {
        "id": call.get("id") or f"call_{uuid.uuid4().hex[:24]}",
        "type": call.get("type") or "function",
        "function": {"name": function.get("name", ""), "arguments": arguments},
    }


def _finish_reason(reason: str | None, tool_calls: list[dict]) -> str | None:
    return "tool_calls" if tool_calls and reason == "stop" else reason


def _http_error(response: httpx.Response, text: str) -> LLMHTTPError:
    message = text.strip()[:500]
    try:
        message = json.loads(text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        pass
    retry_after = None
    try:
        retry_after = float(response.headers.get("retry-after", ""))
    except ValueError:
        pass
    return LLMHTTPError(
        f"{response.request.method} {response.request.url} failed with "
        f"{response.status_code}: {message}",
        status=response.status_code,
        retry_after=retry_after,
    )


def _as_llm_error(error: Exception, url: str) -> LLMError:
    if isinstance(error, LLMError):
        return error
    if isinstance(error, httpx.ConnectTimeout):
        wrapped = LLMTimeout(f"Timed out connecting to {url}.", connecting=True)
    elif isinstance(error, httpx.TimeoutException):
        wrapped = LLMTimeout(f"Timed out waiting for {url} to answer.", connecting=False)
    elif isinstance(error, httpx.ConnectError):
        wrapped = LLMConnectionError(f"Could not connect to {url}: {error}")
    elif isinstance(error, httpx.TransportError):  # dropped connection, protocol error
        wrapped = LLMConnectionError(f"The connection to {url} failed: {error!r}")
    else:
        raise error
    wrapped.__cause__ = error
    return wrapped


def _check_tool_format(tool_format: str):
    if tool_format not in TOOL_FORMATS:
        raise ValueError(f"tool_format must be one of {TOOL_FORMATS}, not {tool_format!r}")
