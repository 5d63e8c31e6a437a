"""The embedded engine: an OpenAI-compatible server over transformers, a drop-in for vLLM's.

    python -m agents.serving.embedded.server --model DIR [--adapters DIR] [--lora NAME=PATH ...]
        [--host 127.0.0.1] [--port 8001] [--served-name NAME]

Routes: `GET /health`, `GET /metrics` (vLLM's gauges of running and waiting requests, in
Prometheus' text format), `GET /v1/models` (the base model, then every LoRA adapter),
`POST /v1/chat/completions` (streamed as server-sent events, or whole). Requests and replies
are the declared models of agents.serving.protocol; errors are vLLM's, `{"error": {"message",
"type", "param", "code"}}`: 400 for a bad body or parameter, 404 for an unknown model.

Concurrent requests are decoded together, one forward pass per step for all of them, each
with its own adapter and sampling settings (agents.serving.embedded.engine); up to --max-batch at once,
the rest wait their turn. The engine's decoding thread hands each request's pieces to the event
loop, which relays them and watches the client, so a client that disconnects leaves the batch
within one step. When the engine is
listening it prints `parley engine ready: http://HOST:PORT/v1` (with --port 0 it picks a free
port; agents.serving.launch reads that line). With `--warm FILE` (a JSON list of chat
completion requests: the studies' opening prompts, as `manage.py serve_agents` writes them) each
request's prompt is prefilled and its KV cache kept before that line, so the first conversation
that begins with it prefills only its own part.
"""

import argparse
import asyncio
import json
import logging
import os
import socket
import sys
import threading
import time
from pathlib import Path

import anyio
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from agents.environment import setting
from agents.llm.native_tools import HermesCallFilter
from agents.llm.tool_format import ToolCallFilter
from agents.serving import protocol
from agents.serving.adapters import Adapter, serving_args
from agents.serving.embedded.engine import END, WARM_TOKENS, Engine, Generation
from agents.serving.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionResponseStreamChoice,
    ChatCompletionStreamResponse,
    ChatMessage,
    DeltaMessage,
    DeltaToolCall,
    EngineError,
    ModelCard,
    ModelList,
    ToolCall,
    UsageInfo,
)

log = logging.getLogger("agents.serving.embedded.server")
# The linear weights packed by torch's oneDNN ops (embedded/weights.py, a private torch op listed
# in docs/development.md, Framework internals); off, the model's own nn.Linear weights.
PACKED_WEIGHTS = setting(
    "PARLEY_ENGINE_PACKED_WEIGHTS",
    "bool",
    True,
    help="the embedded engine's linear weights packed for torch's oneDNN kernels "
    "(`agents/serving/embedded/weights.py`, a private torch op listed in [Layout, layers and "
    "tests](development.md#framework-internals)); `0` keeps the model's own `nn.Linear` weights",
)
READY = "parley engine ready:"


def create_app(engine: Engine) -> Starlette:
    async def health(request: Request):
        return JSONResponse({"status": "ok"})

    async def metrics(request: Request):
        running, waiting = engine.load()
        return PlainTextResponse(
            protocol.metrics(engine.name, running=running, waiting=waiting),
            media_type="text/plain; version=0.0.4",
        )

    async def models(request: Request):
        base = ModelCard(
            id=engine.name, root=str(engine.model_dir), max_model_len=engine.max_model_len
        )
        adapters = [
            ModelCard(id=adapter.name, root=str(adapter.path), parent=engine.name)
            for adapter in engine.adapters().values()
        ]
        return JSONResponse(ModelList(data=[base, *adapters]).model_dump())

    async def chat_completions(request: Request):
        body = await request.body()
        chat = protocol.parse_chat_request(request.headers.get("content-type"), body)
        adapter = engine.resolve(chat.model)
        job = await anyio.to_thread.run_sync(engine.prepare, chat)
        return Completion(engine, chat, adapter, job)

    return Starlette(
        routes=[
            Route("/health", health),
            Route("/metrics", metrics),
            Route("/v1/models", models),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        ],
        exception_handlers={EngineError: _engine_error, HTTPException: _http_error},
    )


class Completion:
    """The ASGI response for one chat completion: joins the batch, relays its pieces, answers.

    The HTTP status is decided only once the generation has started (the adapter loaded), so
    a failure before the first token is still an ordinary error response.
    """

    def __init__(
        self, engine: Engine, chat: ChatCompletionRequest, adapter: Adapter | None, job: Generation
    ):
        self.engine = engine
        self.chat, self.adapter, self.job = chat, adapter, job
        self.cancel = threading.Event()
        self.id, self.created = protocol.completion_id(), protocol.now()
        # a forced tool_choice: the text is call blocks, answered as tool_calls; a template
        # with native tools: its Hermes-style calls, read by vLLM's hermes parser's rule
        self.calls: ToolCallFilter | HermesCallFilter | None = None
        if job.tool_calls:
            self.calls = ToolCallFilter()
        elif job.native_tool_calls:
            self.calls = HermesCallFilter()

    async def __call__(self, scope, receive, send):
        failure = None
        async with anyio.create_task_group() as group:

            async def watch_client():
                while (await receive())["type"] != "http.disconnect":
                    pass
                self.cancel.set()
                group.cancel_scope.cancel()

            group.start_soon(watch_client)
            try:
                await self._generate(send)
            except EngineError as error:  # nothing sent yet: an ordinary error response
                failure = error
            except OSError:  # the client went away while we were sending
                self.cancel.set()
            finally:
                group.cancel_scope.cancel()
        if failure is not None:
            await _send_json(send, failure.response, failure.status)

    async def _generate(self, send):
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        ended = asyncio.Event()  # the engine has let go of the request

        def arrive(item):
            queue.put_nowait(item)
            if item is END or isinstance(item, BaseException):
                ended.set()

        def emit(item):  # on the engine's decoding thread
            try:
                loop.call_soon_threadsafe(arrive, item)
            except RuntimeError:  # the event loop is gone: stop generating
                self.cancel.set()

        started = time.monotonic()
        self.engine.submit(self.job, self.adapter, emit, self.cancel)
        try:
            _raise_if_failed(await queue.get())  # STARTED, or why it could not start
            if self.chat.stream:
                await self._stream(send, queue)
            else:
                await self._whole(send, queue)
        finally:
            self.cancel.set()  # a no-op once it has ended; otherwise it leaves the batch
            with anyio.CancelScope(shield=True):  # the counts are final only when it has left
                await ended.wait()
            job = self.job
            log.info(
                "%s %s: %d prompt (%d cached) + %d completion tokens in %.1fs, finish_reason=%s",
                self.id,
                self.chat.model,
                len(job.prompt_ids),
                job.cached_tokens,
                job.completion_tokens,
                time.monotonic() - started,
                job.finish_reason,
            )

    async def _whole(self, send, queue):
        pieces = []
        while (item := await queue.get()) is not END:
            pieces.append(self._content(_raise_if_failed(item)))
        pieces.append(self._content(None))
        calls = [ToolCall(**call) for call in self.calls.tool_calls] if self.calls else []
        message = ChatMessage(content="".join(pieces) or (None if calls else ""), tool_calls=calls)
        choice = ChatCompletionResponseChoice(message=message, finish_reason=self._finish_reason())
        reply = ChatCompletionResponse(
            id=self.id,
            created=self.created,
            model=self.chat.model,
            choices=[choice],
            usage=self._usage(),
        )
        await _send_json(send, reply, 200)

    async def _stream(self, send, queue):
        headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})

        async def event(data):
            await send(
                {"type": "http.response.body", "body": protocol.sse(data), "more_body": True}
            )

        await event(self._chunk(DeltaMessage(role="assistant", content="")))
        try:
            while (item := await queue.get()) is not END:
                piece = self._content(_raise_if_failed(item))
                if piece or not self.calls:
                    await event(self._chunk(DeltaMessage(content=piece)))
        except EngineError as error:  # headers are sent: report in the stream, as vLLM does
            await event(error.response)
        else:
            tail = self._content(None)
            if tail:
                await event(self._chunk(DeltaMessage(content=tail)))
            for index, call in enumerate(self.calls.tool_calls if self.calls else []):
                delta = DeltaMessage(tool_calls=[DeltaToolCall(index=index, **call)])
                await event(self._chunk(delta))
            await event(self._chunk(DeltaMessage(), self._finish_reason()))
            if self.chat.include_usage:  # the usage chunk has no choices
                await event(self._chunk(None, usage=self._usage()))
        await event("[DONE]")
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _chunk(self, delta: DeltaMessage | None, finish_reason=None, usage=None):
        choices = []
        if delta is not None:
            choices = [ChatCompletionResponseStreamChoice(delta=delta, finish_reason=finish_reason)]
        return ChatCompletionStreamResponse(
            id=self.id, created=self.created, model=self.chat.model, choices=choices, usage=usage
        )

    def _content(self, piece: str | None) -> str:
        """A generated piece as content (call blocks taken out when the reply is tool calls);
        None at the end of the reply flushes what was held back."""
        if self.calls is None:
            return piece or ""
        return self.calls.finish() if piece is None else self.calls.feed(piece)

    def _finish_reason(self) -> str | None:
        reason = self.job.finish_reason
        return "tool_calls" if self.calls and self.calls.tool_calls and reason == "stop" else reason

    def _usage(self) -> UsageInfo:
        return UsageInfo.of(len(self.job.prompt_ids), self.job.completion_tokens)


def _raise_if_failed(item):
    """Queue items are pieces, markers, or the exception the request failed with."""
    if isinstance(item, EngineError):
        raise item
    if isinstance(item, BaseException):
        log.error("Generation failed", exc_info=item)
        raise EngineError(f"Generation failed: {item!r}", status=500) from item
    return item


async def _send_json(send, body: BaseModel, status: int):
    payload = body.model_dump_json().encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


async def _engine_error(request: Request, error: EngineError):
    return JSONResponse(error.body(), status_code=error.status)


async def _http_error(request: Request, error: HTTPException):
    body = protocol.http_error(error.status_code, error.detail).body()
    return JSONResponse(body, status_code=error.status_code, headers=error.headers)


def main(argv: list[str] | None = None) -> int:

    parser = argparse.ArgumentParser(
        prog="python -m agents.serving.embedded.server",
        description="Serve a Hugging Face model and its LoRA adapters with an OpenAI-compatible API.",
    )
    parser.add_argument(
        "--model", type=Path, default=None, help="model folder (default: the base model)"
    )
    parser.add_argument("--adapters", type=Path, help="folder scanned for LoRA adapter folders")
    parser.add_argument(
        "--lora", action="append", default=[], metavar="NAME=PATH", help="serve one adapter as NAME"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001, help="0 picks a free port")
    parser.add_argument("--served-name", help="name of the base model (default: its folder name)")
    parser.add_argument("--max-loras", type=int, default=4, help="adapters kept loaded at once")
    parser.add_argument(
        "--max-batch",
        type=int,
        default=32,
        help="requests decoded together; more wait their turn (1: one at a time)",
    )
    parser.add_argument(
        "--prefix-cache",
        type=int,
        default=8,
        help="recent prompts whose KV cache is kept, so a prompt that begins like one of them "
        "prefills only the rest (0: off; SmolLM2-135M's cache is 46 KB a token)",
    )
    parser.add_argument(
        "--warm",
        type=Path,
        help="JSON list of chat completion requests whose prompts are prefilled and kept before "
        "the engine reports ready (the studies' opening prompts)",
    )
    parser.add_argument(
        "--warm-tokens",
        type=int,
        default=WARM_TOKENS,
        help="prompt tokens --warm keeps at most (46 KB a token for SmolLM2-135M)",
    )
    parser.add_argument("--max-model-len", type=int, help="context length (default: the model's)")
    parser.add_argument(
        "--default-max-tokens", type=int, default=1024, help="reply budget when a request sets none"
    )
    parser.add_argument(
        "--threads",
        type=int,
        help="torch CPU threads for one request's decoding step (default: half the cores, at "
        "most 4; more than the cores less one are cut to that, with a warning: the event loop "
        "needs a core of its own)",
    )
    parser.add_argument(
        "--batch-threads",
        type=int,
        help="torch CPU threads for passes of several rows: arriving prompts prefilled, and "
        "decoding steps of two requests or more (default: every core, at most 8; more than the "
        "cores are cut to that, with a warning)",
    )
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")

    loras, model_dir = serving_args(parser, args)
    # torch's threads wait for each other's parts of every operation. libgomp's default wait (no
    # OMP_WAIT_POLICY) spins 300,000 rounds, then sleeps: between the operations of one pass the
    # wait is shorter than that, so a quiet batch keeps both cores busy, and an idle thread sleeps
    # once the passes stop. Beside a busy neighbour the passes take one thread
    # (agents.serving.embedded.cpu), so no thread spins for a core the neighbour holds. PASSIVE (sleep at
    # once) cost a quiet batch of 8 a quarter of its tokens and gained nothing beside the
    # neighbour (docs/serving.md, "Beside other processes"); a value in the environment is kept.
    import torch

    threads = decoding_threads(args.threads, _cores())
    torch.set_num_threads(threads)
    if args.batch_threads is not None and args.batch_threads < 1:
        parser.error("--batch-threads must be at least 1")

    engine = Engine(
        model_dir,
        pack_weights=PACKED_WEIGHTS.read(),
        served_name=args.served_name,
        adapters_root=args.adapters,
        loras=loras,
        max_loras=args.max_loras,
        max_model_len=args.max_model_len,
        default_max_tokens=args.default_max_tokens,
        max_batch=args.max_batch,
        prefix_cache=args.prefix_cache,
        warm_tokens=args.warm_tokens,
        threads=threads,
        batch_threads=batch_threads(args.batch_threads, _cores()),
    )
    if args.warm is not None:
        engine.warm(warm_requests(args.warm))
    return serve(create_app(engine), args.host, args.port, args.log_level)


def warm_requests(path: Path) -> list[ChatCompletionRequest]:
    """The requests of a --warm file; one that does not validate is skipped with a warning."""
    requests = []
    for body in json.loads(path.read_text()):
        try:
            requests.append(ChatCompletionRequest.model_validate(body))
        except ValueError as error:
            log.warning("Not warmed: a request in %s does not validate: %s", path, error)
    return requests


def decoding_threads(asked: int | None, cores: int) -> int:
    """torch's thread count for `--threads`, one request's decoding step: by default half
    the cores (at most 4); never more than the cores less one, which the event loop and the
    rest of the machine keep (one row gains nothing from a second thread on 2 cores:
    bench/engine_steps.py). Before steps of several rows ran on --batch-threads, every step
    ran on these, and issue 26 measured 0.9x to 3x one request's tokens/s at 8 concurrent
    with --threads 2 on 2 cores, against 3.5x with 1."""
    limit = max(1, cores - 1)
    if asked is None:
        return max(1, min(4, cores // 2, limit))
    if asked > limit:
        log.warning(
            "--threads %d is more than this machine's %d cores leave beside the event loop: "
            "using %d",
            asked,
            cores,
            limit,
        )
        return limit
    return max(1, asked)


def batch_threads(asked: int | None, cores: int) -> int:
    """torch's thread count for passes of several rows (prefills, steps of two requests or
    more): by default every core (at most 8); never more than the cores. Several rows are
    compute, so they gain from each core (issue 26: 7 arrivals' prefill 320 -> 200 ms with 2
    threads on 2 cores; 8 concurrent requests 171 -> 210 tok/s)."""
    if asked is None:
        return max(1, min(8, cores))
    if asked > cores:
        log.warning(
            "--batch-threads %d is more than this machine's %d cores: using %d", asked, cores, cores
        )
        return cores
    return asked


def _cores() -> int:
    """The cores this process may run on (its affinity, as a container or taskset sets it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def serve(app, host: str, port: int, log_level: str = "info") -> int:
    import uvicorn

    # Bind first so the ready line can name the real port (with --port 0) and early clients
    # simply wait in the listen backlog.
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        print(f"error: cannot listen on {host}:{port}: {error}", file=sys.stderr)
        return 1
    sock.listen(128)
    bound_port = sock.getsockname()[1]
    url_host = f"[{host}]" if family == socket.AF_INET6 else host
    print(f"{READY} http://{url_host}:{bound_port}/v1", flush=True)
    config = uvicorn.Config(app, log_level=log_level, lifespan="off", timeout_graceful_shutdown=5)
    uvicorn.Server(config).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
