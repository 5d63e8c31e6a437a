"""The one async client for OpenAI-compatible engines (vLLM, the embedded engine, hosted APIs).

    async with LLMClient("http://127.0.0.1:8001/v1") as client:
        stream = client.stream_chat(model, messages, temperature=0.7, max_tokens=200)
        async for piece in stream:          # assistant text as it arrives
            ...
        stream.result                       # ChatResult: content, tool_calls, usage, ttft, ...
        result = await client.chat(model, messages)

The wire format is the `openai` package's (AsyncOpenAI: requests, error bodies), except for a
streamed chat: its request is the same JSON, sent with aiohttp, and its server-sent events are
read as plain JSON lines. A streamed chat is the platform's hottest path (every participant's
turn): openai's typed request and chunk models, then httpx's per-read machinery, were the
largest CPU costs of a turn (bench/chat_load.py).
Parameters the OpenAI API does not name (vLLM's `top_k`, `skip_special_tokens`,
`stop_token_ids`, `return_token_ids`, guided decoding, ...) go to the engine in `extra_body`.

One client serves many calls: it keeps one connection pool, which belongs to the event loop
it was first used on. `shared_client` gives a process one long-lived client per endpoint and
event loop (a study arm's chat turns).

Replicas: a client may be given several base URLs, the replicas of one endpoint. Each call
picks one (agents.llm.replicas): a call with a `conversation` key goes to that conversation's
own replica; one that cannot be reached is remembered as down and the call's next attempt, and
the next turn, go to a healthy one. The result names the replica that served it.

Timeouts: `connect_timeout` bounds opening a connection; `timeout` bounds every wait for the
next byte (for a non-streamed reply that is the whole generation; for a stream, the wait for
the first chunk and then between chunks).

Retries (tenacity; openai's own are off because they retry read timeouts and cannot see a
stream that drops before its first token): connection failures (refused, connect timeout,
dropped before any token) and 5xx/429 answers are retried up to `max_retries` times with
exponential backoff (`backoff` * 2**n, or the server's Retry-After; none before a replica not
tried yet), but only before the first piece has been handed to the caller, so streamed text is
never duplicated. Other 4xx answers
and read timeouts are not retried (the engine may still be working on the request).

Tool calls: with tool_format="native" the `tools` go to the engine and streamed tool_call
deltas are assembled by index. With tool_format="json" (models without native tool calling,
see agents.llm.tool_format) the tools are described in the system prompt and the reply's
`<tool_call>` blocks are parsed out of the text; callers see the same ChatResult either way.
tool_format="structured" is the JSON format with the engine keeping every call well formed: the
request carries a structural-tag `response_format` built from the tools (tool_call_format; vLLM
and the embedded engine both enforce it), free text until `<tool_call>`, then a valid call of
one of the tools; a `tool_choice` of "required" or a named function forces calls.

Providers: every chat request is shaped for the API it goes to (agents.llm.providers: GPT-5's
`max_completion_tokens` and fixed temperature, OpenRouter's reasoning form, ...). `provider`
names one, or "auto" recognises it from the base URL and each call's model; a local engine is
"generic" and gets the request as given.
"""

import asyncio
import contextlib
import inspect
import json
import threading
import time
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import aiohttp
import httpx2
import openai
from openai.resources.chat.completions import AsyncCompletions as _ChatCompletions
from openai.resources.completions import AsyncCompletions as _Completions
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt

from agents.llm.errors import LLMConnectionError, LLMError, LLMHTTPError, LLMTimeout
from agents.llm.providers import AUTO, Provider, provider_for
from agents.llm.replicas import Failover, Replicas, mark_down, mark_up
from agents.llm.tool_format import (
    ToolCallFilter,
    messages_for_json_tools,
    tool_call_response_format,
)

TOOL_FORMATS = ("native", "json", "structured")
# vLLM's documented key for servers started without --api-key; never the caller's OPENAI_API_KEY
NO_KEY = "EMPTY"


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
    replica: str = ""  # base URL of the replica that served it


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
    replica: str = ""  # base URL of the replica that served it


class LLMClient:
    def __init__(
        self,
        base_url: str | Sequence[str] = "http://127.0.0.1:8001/v1",
        api_key: str | None = None,
        timeout: float = 60.0,
        connect_timeout: float = 5.0,
        max_retries: int = 2,
        backoff: float = 0.5,
        tool_format: str = "native",
        provider: str | Provider = AUTO,
    ):
        _check_tool_format(tool_format)
        provider_for(provider, "", "")  # an unknown name fails here, not at the first call
        self.provider = provider
        # one base URL, or the replicas of one endpoint (the first stands for them in messages)
        self.replicas = Replicas([base_url] if isinstance(base_url, str) else base_url)
        self.base_url = self.replicas.urls[0]
        self.max_retries = max_retries
        self.backoff = backoff
        self.tool_format = tool_format
        self.openai = openai.AsyncOpenAI(
            base_url=self.base_url,
            api_key=api_key or NO_KEY,
            timeout=openai.Timeout(timeout, connect=connect_timeout),
            max_retries=0,  # ours, below
        )
        self._apis = {self.base_url: self.openai}  # by replica, sharing one connection pool
        # Streamed chats (see the module docstring): their own pool, opened on first use (it
        # belongs to the running event loop), with the same timeouts and key.
        self._timeout, self._connect_timeout = timeout, connect_timeout
        self._headers = {"Authorization": f"Bearer {api_key or NO_KEY}"}
        self._streams: aiohttp.ClientSession | None = None

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.aclose()

    async def aclose(self):
        await self.openai.close()
        if self._streams is not None:
            await self._streams.close()

    def forget_streams(self) -> None:
        """Mark the stream pool closed once its event loop has ended (nothing can be awaited
        there any more), so that it is not reported as left open."""
        if self._streams is not None and not self._streams.closed:
            connector = self._streams.connector
            with contextlib.suppress(Exception):  # its transports belong to the closed loop
                # aiohttp 3.12+ made close() a coroutine, which cannot run now; its synchronous
                # part (_close) is what marks the pool closed and drops the transports.
                closing = getattr(connector, "_close", None) or connector.close
                result = closing()
                if inspect.iscoroutine(result):
                    result.close()

    def _api(self, url: str) -> openai.AsyncOpenAI:
        """The openai client of one replica (a copy sharing the first one's pool)."""
        api = self._apis.get(url)
        if api is None:
            api = self._apis[url] = self.openai.with_options(base_url=url)
        return api

    def stream_session(self) -> aiohttp.ClientSession:
        if self._streams is None or self._streams.closed:
            self._streams = aiohttp.ClientSession(
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(
                    total=None, connect=self._connect_timeout, sock_read=self._timeout
                ),
                connector=aiohttp.TCPConnector(limit=0),  # the engine bounds its own queue
            )
        return self._streams

    def stream_chat(
        self,
        model: str,
        messages: list[dict],
        tools: list[dict] | None = None,
        *,
        tool_format: str | None = None,
        conversation: str | None = None,
        avoid: Collection[str] = (),
        **params,
    ) -> "ChatStream":
        """A reply streamed piece by piece; `stream.result` holds the ChatResult afterwards.
        `conversation`: the key that keeps a conversation on one replica; `avoid`: replicas
        the caller knows to be down (tried last)."""
        stream_options = {"include_usage": True, **(params.pop("stream_options", None) or {})}
        request, json_tools = self._chat_request(model, messages, tools, tool_format, params)
        request.update(stream=True, stream_options=stream_options)
        return ChatStream(self, request, json_tools, Failover(self.replicas, conversation, avoid))

    def request_body(
        self,
        model: str,
        messages: list[dict],
        tools: list[dict] | None = None,
        *,
        tool_format: str | None = None,
        **params,
    ) -> dict:
        """The chat completion body `chat` would send for these arguments (`stream_chat` adds
        only its streaming fields): the prompt an engine renders from it is the request's own,
        token for token, so an engine warmed with it reuses the prefill (serve_agents)."""
        params.pop("stream_options", None)
        return self._chat_request(model, messages, tools, tool_format, params)[0]

    async def chat(
        self,
        model: str,
        messages: list[dict],
        tools: list[dict] | None = None,
        *,
        tool_format: str | None = None,
        conversation: str | None = None,
        avoid: Collection[str] = (),
        **params,
    ) -> ChatResult:
        """A whole reply in one response (`conversation`, `avoid`: as for stream_chat)."""
        params.pop("stream_options", None)
        request, json_tools = self._chat_request(model, messages, tools, tool_format, params)
        started = time.monotonic()
        data, attempts, replica = await self._retried(
            lambda api: api.chat.completions.create(**request, stream=False),
            "/chat/completions",
            Failover(self.replicas, conversation, avoid),
        )
        latency = time.monotonic() - started
        try:
            choice = data.choices[0]
            message = choice.message
        except (AttributeError, IndexError, TypeError) as error:
            raise LLMError(f"Malformed chat completion from {self.base_url}: {data!r}") from error
        content = (message and message.content) or ""
        calls = (message and message.tool_calls) or []
        tool_calls = [_complete_call(call.to_dict()) for call in calls]
        if json_tools:
            parser = ToolCallFilter()
            content = parser.feed(content) + parser.finish()
            tool_calls += parser.tool_calls
        return ChatResult(
            content=content,
            tool_calls=tool_calls,
            finish_reason=_finish_reason(choice.finish_reason, tool_calls),
            model=data.model or model,
            usage=_as_dict(data.usage),
            ttft=latency if content or tool_calls else None,
            latency=latency,
            attempts=attempts,
            replica=replica,
        )

    async def complete(
        self, model: str, prompt: str | list[int], *, return_token_ids: bool = False, **params
    ) -> CompletionResult:
        """A raw completion of `prompt` (text, or token ids so that no chat template or
        re-tokenization stands between the caller and the model), not streamed. With
        `return_token_ids` vLLM also answers the sampled token ids (a trainer needs exactly those).
        """
        if return_token_ids:
            params["return_token_ids"] = True
        request = _request(_COMPLETION_PARAMS, params)
        data, attempts, replica = await self._retried(
            lambda api: api.completions.create(model=model, prompt=prompt, stream=False, **request),
            "/completions",
            Failover(self.replicas),
        )
        try:
            choice = data.choices[0]
        except (AttributeError, IndexError, TypeError) as error:
            raise LLMError(f"Malformed completion from {self.base_url}: {data!r}") from error
        ids = getattr(choice, "token_ids", None)  # vLLM's extra field
        if return_token_ids and ids is None:
            raise LLMError(f"{self.base_url} returned no token_ids (is it vLLM?)")
        return CompletionResult(
            text=choice.text or "",
            token_ids=list(ids) if ids is not None else None,
            finish_reason=choice.finish_reason,
            stop_reason=getattr(choice, "stop_reason", None),
            logprobs=_as_dict(choice.logprobs),
            model=data.model or model,
            usage=_as_dict(data.usage),
            attempts=attempts,
            replica=replica,
        )

    async def load_lora_adapter(self, name: str, path: str, *, replace: bool = False) -> None:
        """vLLM: serve the LoRA adapter folder `path` as model `name` from now on, on every
        replica (each needs --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, and must
        see `path`).
        `replace`: an adapter already loaded under `name` is replaced (else vLLM answers 400)."""
        body = {"lora_name": name, "lora_path": path}
        if replace:
            body["load_inplace"] = True
        await self._post_plain("/load_lora_adapter", body)

    async def unload_lora_adapter(self, name: str) -> None:
        """vLLM: stop serving the runtime-loaded adapter `name`, on every replica."""
        await self._post_plain("/unload_lora_adapter", {"lora_name": name})

    async def _post_plain(self, path: str, body: dict) -> None:
        # vLLM answers these with plain text, so the raw response is asked for; not retried
        # (a load that timed out may have happened)
        for url in self.replicas.urls:
            try:
                await self._api(url).post(path, cast_to=httpx2.Response, body=body)
            except Exception as error:
                raise _as_llm_error(error, url + path) from error

    async def list_models(self) -> list[str]:
        page, _, _ = await self._retried(
            lambda api: api.models.list(), "/models", Failover(self.replicas)
        )
        try:
            return [entry.id for entry in page.data]
        except (AttributeError, TypeError) as error:
            raise LLMError(f"Malformed model list from {self.base_url}: {page!r}") from error

    def provider_for(self, model: str) -> Provider:
        """The provider this client's requests for `model` are shaped for."""
        return provider_for(self.provider, self.base_url, model)

    def _chat_request(self, model, messages, tools, tool_format, params) -> tuple[dict, bool]:
        tool_format = tool_format or self.tool_format
        _check_tool_format(tool_format)
        json_tools = tool_format in ("json", "structured")
        if json_tools:
            messages = messages_for_json_tools(messages, tools)
            choice = params.get("tool_choice") or "auto"
            # several forced calls only when asked for, as the embedded engine: a small model
            # repeats its call until the token budget runs out
            parallel = bool(params.get("parallel_tool_calls"))
            params = {
                k: v for k, v in params.items() if k not in ("tool_choice", "parallel_tool_calls")
            }
            if tool_format == "structured" and tools and choice != "none":
                if params.get("response_format") is not None:
                    raise ValueError(
                        "tool_format='structured' sends its own response_format; do not set one"
                    )
                params["response_format"] = tool_call_response_format(tools, choice, parallel)
        params, _ = self.provider_for(model).shape(params)
        request = {"model": model, "messages": messages, **_request(_CHAT_PARAMS, params)}
        if tools and not json_tools:
            request["tools"] = tools
        return request, json_tools

    def _retrying(self, failover: Failover) -> AsyncRetrying:
        """Up to max_retries more attempts after a retryable LLMError (see the module docstring);
        no wait before one that goes to a replica not tried yet."""
        return AsyncRetrying(
            stop=stop_after_attempt(self.max_retries + 1),
            wait=lambda state: 0.0 if failover.switches() else self._retry_delay(state),
            retry=retry_if_exception(lambda error: isinstance(error, LLMError) and error.retryable),
            reraise=True,
        )

    def _retry_delay(self, state) -> float:
        retry_after = getattr(state.outcome.exception(), "retry_after", None)
        if retry_after is not None:
            return min(retry_after, 30.0)
        return self.backoff * 2 ** (state.attempt_number - 1)

    async def _retried(self, call, path: str, failover: Failover):
        """`await call(api)` with retries, each attempt on the replica `failover` gives;
        returns (its result, attempts, the replica that answered)."""
        attempts, replica = 0, ""

        async def attempt():
            nonlocal attempts, replica
            attempts += 1
            replica = failover.next()
            try:
                result = await call(self._api(replica))
            except Exception as error:
                raise _failed_at(replica, _as_llm_error(error, replica + path)) from error
            mark_up(replica)
            return result

        try:
            return await self._retrying(failover)(attempt), attempts, replica
        except LLMError as error:
            error.attempts = attempts
            raise


_shared: dict[asyncio.AbstractEventLoop, dict[tuple, LLMClient]] = {}
_shared_lock = threading.Lock()  # each thread runs its own loop; the dict is the process's


def shared_client(
    base_url: str | Sequence[str], api_key: str | None = None, **options
) -> LLMClient:
    """This process's long-lived client for `base_url` (or these replicas' URLs) with this key
    and these LLMClient options, on the running event loop: one connection pool per endpoint,
    not one per call.

    A connection pool belongs to the loop it was opened on, so each loop gets its own client;
    those of loops that have closed are dropped. Nobody closes a shared client: do not use it
    in `async with` (one closed anyway is replaced on the next call)."""
    loop = asyncio.get_running_loop()
    urls = (base_url,) if isinstance(base_url, str) else tuple(base_url)
    key = (tuple(url.rstrip("/") for url in urls), api_key, tuple(sorted(options.items())))
    with _shared_lock:
        for closed in [other for other in _shared if other.is_closed()]:
            for dropped in _shared.pop(closed).values():
                dropped.forget_streams()
        clients = _shared.setdefault(loop, {})
        client = clients.get(key)
        if client is None or client.openai.is_closed():
            client = clients[key] = LLMClient(urls, api_key=api_key, **options)
        return client


class ChatStream:
    """Async iterator of assistant text pieces; `result` is set once the reply has ended.

    Breaking out of `async for` early leaves the connection open until `aclose()`; use
    `async with client.stream_chat(...) as stream:` to have it closed for you.
    """

    def __init__(self, client: LLMClient, request: dict, json_tools: bool, failover: Failover):
        self._client = client
        self._request = request
        self._json_tools = json_tools
        self._failover = failover
        self._replica = client.base_url  # the replica of the attempt under way
        self._url = client.base_url + "/chat/completions"
        self._result: ChatResult | None = None
        self._reply: _Reply | None = None  # the attempt under way
        self._attempts = 0
        self._pieces = self._run()

    @property
    def result(self) -> ChatResult:
        if self._result is None:
            raise RuntimeError("The stream has not finished: iterate it to the end first.")
        return self._result

    @property
    def last_token(self) -> float | None:
        """time.monotonic() of the engine's latest token, text or tool call, shown or held back
        (None before the first): progress while a tool call streams and yields no text."""
        return self._reply.heard if self._reply else None

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
        started = time.monotonic()
        try:
            # Retried as a whole: nothing has reached the caller until it returns.
            retrying = self._client._retrying(self._failover)
            reply, opened, first = await retrying(self._first_piece, started)
        except LLMError as error:
            error.attempts = self._attempts
            raise
        streamed = [first] if first else []
        try:
            if first:
                yield first
            async for chunk in opened.chunks:  # from here on a failure is not retried
                piece = reply.add(chunk, started)
                if piece:
                    streamed.append(piece)
                    yield piece
            reply.check_ended(self._url)
        except Exception as error:
            failure = _failed_at(self._replica, _as_llm_error(error, self._url))
            failure.attempts, failure.partial = self._attempts, "".join(streamed)
            raise failure from error
        finally:
            await opened.close()
        tail = reply.close()
        if tail:
            streamed.append(tail)
            yield tail
        self._result = ChatResult(
            content="".join(streamed),
            tool_calls=reply.tool_calls(),
            finish_reason=_finish_reason(reply.finish_reason, reply.tool_calls()),
            model=reply.model or self._request["model"],
            usage=reply.usage,
            ttft=reply.ttft,
            latency=time.monotonic() - started,
            attempts=self._attempts,
            replica=self._replica,
        )

    async def _first_piece(self, started: float):
        """One attempt, on the next replica: open the stream and read it up to the first piece
        of text for the caller (or to its end, for a reply that is only tool calls)."""
        self._attempts += 1
        self._replica = self._failover.next()
        self._url = self._replica + "/chat/completions"
        reply = self._reply = _Reply(self._json_tools)
        opened = None
        try:
            opened = await _Opened.post(self._client.stream_session(), self._url, self._request)
            async for chunk in opened.chunks:
                piece = reply.add(chunk, started)
                if piece:
                    break
            else:
                piece = ""
                reply.check_ended(self._url)
        except BaseException as error:
            # Cancelled too (a stall, the participant gone): the stream is closed at once, so
            # the engine sees the disconnect and stops generating (a reply that is all tool
            # calls is read here to its end: the window where a stall is most likely).
            if opened is not None:
                await opened.close()
            if not isinstance(error, Exception):
                raise
            raise _failed_at(self._replica, _as_llm_error(error, self._url)) from error
        mark_up(self._replica)
        return reply, opened, piece


class _Opened:
    """One open SSE response: its chunks (the JSON of each `data:` event), read by one iterator
    across the first piece and the rest, and the response itself, released (its connection
    back in the pool) however the reading ends."""

    def __init__(self, response: aiohttp.ClientResponse, url: str):
        self.response = response
        self.url = url
        self.chunks = self._chunks()

    @classmethod
    async def post(cls, session: aiohttp.ClientSession, url: str, request: dict) -> "_Opened":
        body = {k: v for k, v in request.items() if k != "extra_body"}
        body.update(request.get("extra_body") or {})
        response = await session.post(url, json=body)
        if response.status >= 400:
            try:
                text = await response.text(errors="replace")
            finally:
                response.release()
            raise _status_error("POST", url, response.status, text, response.headers)
        return cls(response, url)

    async def _chunks(self):
        data: list[str] = []
        done = False
        rest = b""  # a line not yet ended
        # Blocks as they arrive, split into lines here: one await a block, where reading line
        # by line awaited twice an event (its `data:` line and the blank line that ends it).
        # Read to the body's end even after [DONE]: a response left unfinished closes its
        # connection instead of returning it to the pool.
        async for block in self.response.content.iter_any():
            if done:
                continue
            *lines, rest = (rest + block).split(b"\n")
            for raw in lines:
                line = raw.decode("utf-8", "replace").rstrip("\r")
                if line.startswith("data:"):
                    data.append(line[5:].lstrip(" "))
                    continue
                if line or not data:  # a comment, an `event:`/`id:` field, or a keep-alive
                    continue
                event, data = "\n".join(data), []  # a blank line ends the event
                if event == "[DONE]":
                    done = True
                    break
                yield self._parsed(event)

    def _parsed(self, event: str) -> dict:
        try:
            chunk = json.loads(event)
        except ValueError:
            raise LLMError(f"Malformed event from {self.url}: {event[:200]!r}") from None
        if isinstance(chunk, dict) and chunk.get("error"):  # an error inside a 200 stream
            error = chunk["error"]
            message = error.get("message") if isinstance(error, dict) else error
            raise LLMError(f"The engine failed mid-stream: {message}")
        return chunk

    async def close(self):
        await self.chunks.aclose()
        self.response.release()


class _Reply:
    """Accumulates one streamed reply: content, tool-call deltas by index, usage, timing."""

    def __init__(self, json_tools: bool):
        self.parser = ToolCallFilter() if json_tools else None
        self.calls: dict[int, dict] = {}
        self.finish_reason = None
        self.model = None
        self.usage = None
        self.ttft = None
        self.heard: float | None = None  # time.monotonic() of the latest chunk from the first token

    def add(self, chunk: dict, started: float) -> str:
        self.model = chunk.get("model") or self.model
        self.usage = chunk.get("usage") or self.usage
        piece = ""
        for choice in chunk.get("choices") or []:
            if (choice.get("index") or 0) != 0:
                continue
            delta = choice.get("delta") or {}
            content = delta.get("content")
            calls = delta.get("tool_calls") or []
            if content or calls:
                self.ttft = self.ttft if self.ttft is not None else time.monotonic() - started
            if content:
                piece += self.parser.feed(content) if self.parser else content
            for call in calls:
                self._add_call(call)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        # From the first token on, any chunk is progress (the finish, the usage); before it
        # only a token is, not the role chunk some engines send before their prefill.
        if self.ttft is not None:
            self.heard = time.monotonic()
        return piece

    def check_ended(self, url: str):
        # The SSE layer hides `[DONE]`; a reply is whole once it has said why it finished.
        if not self.finish_reason:
            raise LLMConnectionError(f"The stream from {url} ended before the reply did.")

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


# The keyword arguments openai's create() names; any other parameter is an engine extra.
_CHAT_PARAMS = frozenset(inspect.signature(_ChatCompletions.create).parameters)
_COMPLETION_PARAMS = frozenset(inspect.signature(_Completions.create).parameters)
_OWN_PARAMS = {"self", "model", "messages", "prompt", "stream", "extra_body"}


def _request(named: frozenset, params: dict) -> dict:
    """Keyword arguments for openai's create(): the parameters it names, the rest (vLLM's
    extras) in `extra_body`. None means "not set", as it always has for this client."""
    request, extra = {}, dict(params.get("extra_body") or {})
    for key, value in params.items():
        if value is None or key in _OWN_PARAMS:
            continue
        (request if key in named else extra)[key] = value
    if extra:
        request["extra_body"] = extra
    return request


def _as_dict(value) -> dict | None:
    """An openai response object as the JSON the engine sent (None stays None)."""
    return value.to_dict() if value is not None else None


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


def _failed_at(replica: str, error: LLMError) -> LLMError:
    """`error`, after remembering its replica as down when it could not be reached (refused,
    or no connection in time; not a dropped connection, which a live server's idle keep-alive
    can be): the next calls try the other replicas first."""
    if isinstance(error, LLMConnectionError | LLMTimeout) and error.connecting:
        mark_down(replica)
    return error


def _as_llm_error(error: Exception, url: str) -> LLMError:
    """openai's exception (or httpx's, from a streamed chat) as ours, with the same messages
    as before; anything else re-raised."""
    if isinstance(error, LLMError):
        return error
    if isinstance(error, httpx2.TransportError):
        return _transport_error(error, url)
    if isinstance(error, aiohttp.ClientError | asyncio.TimeoutError):  # a streamed chat's
        return _stream_error(error, url)
    cause = error.__cause__
    if isinstance(error, openai.APIConnectionError) and isinstance(cause, httpx2.TransportError):
        return _transport_error(cause, url)  # APITimeoutError is an APIConnectionError
    if isinstance(error, openai.APITimeoutError):
        return LLMTimeout(f"Timed out waiting for {url} to answer.", connecting=False)
    if isinstance(error, openai.APIConnectionError):
        return LLMConnectionError(f"The connection to {url} failed: {cause or error!r}")
    if isinstance(error, openai.APIStatusError):
        return _http_error(error.response)
    if isinstance(error, openai.APIError):  # an error event inside a 200 stream
        return LLMError(f"The engine failed mid-stream: {error.message}")
    raise error


def _transport_error(error: httpx2.TransportError, url: str) -> LLMError:
    if isinstance(error, httpx2.ConnectTimeout | httpx2.PoolTimeout):
        return LLMTimeout(f"Timed out connecting to {url}.", connecting=True)
    if isinstance(error, httpx2.TimeoutException):
        return LLMTimeout(f"Timed out waiting for {url} to answer.", connecting=False)
    if isinstance(error, httpx2.ConnectError):
        return LLMConnectionError(f"Could not connect to {url}: {error}", connecting=True)
    return LLMConnectionError(f"The connection to {url} failed: {error}")


def _stream_error(error: Exception, url: str) -> LLMError:
    """aiohttp's failures, with the same messages as httpx's (`_transport_error`)."""
    if isinstance(error, aiohttp.ConnectionTimeoutError):
        return LLMTimeout(f"Timed out connecting to {url}.", connecting=True)
    if isinstance(error, asyncio.TimeoutError):  # the socket read timeout, among others
        return LLMTimeout(f"Timed out waiting for {url} to answer.", connecting=False)
    if isinstance(error, aiohttp.ClientConnectorError):
        return LLMConnectionError(f"Could not connect to {url}: {error}", connecting=True)
    return LLMConnectionError(f"The connection to {url} failed: {error!r}")


def _http_error(response: httpx2.Response) -> LLMHTTPError:
    return _status_error(
        response.request.method,
        response.request.url,
        response.status_code,
        response.text,
        response.headers,
    )


def _status_error(method: str, url, status: int, text: str, headers) -> LLMHTTPError:
    message = text.strip()[:500]
    try:
        message = json.loads(text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        pass
    retry_after = None
    try:
        retry_after = float(headers.get("retry-after", ""))
    except ValueError:
        pass
    return LLMHTTPError(
        f"{method} {url} failed with {status}: {message}", status=status, retry_after=retry_after
    )


def _check_tool_format(tool_format: str):
    if tool_format not in TOOL_FORMATS:
        raise ValueError(f"tool_format must be one of {TOOL_FORMATS}, not {tool_format!r}")
