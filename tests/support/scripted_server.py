"""A scripted OpenAI-compatible server for tests about the code around the model (tool loops,
scoring), where a real model's choices cannot be controlled. Each request pops the next reply."""

import asyncio
import json
import threading
import time

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

from agents.serving.process import free_port

ARGUMENTS_PIECE = 8  # characters of a tool call's arguments per streamed chunk


class ThreadedServer:
    """A uvicorn server in a thread for the length of a `with` block (`self.server`, set by the
    subclass)."""

    server: uvicorn.Server

    def __enter__(self):
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=10)


class ScriptedServer(ThreadedServer):
    def __init__(self, replies: list[dict], models=("SmolLM2-135M-Instruct",), pace=0.0):
        """replies: {"content": str} or {"tool_calls": [(name, arguments_dict), ...]};
        models: what GET /v1/models lists (the go-live health check asks); pace: seconds
        before each streamed chunk after the first (a slow engine's tokens)."""
        self.replies = list(replies)
        self.pace = pace
        self.models = list(models)
        self.model_lists = 0  # GET /v1/models answered
        self.loaded_adapters: list[dict] = []  # POST /v1/load_lora_adapter bodies
        self.model_list_headers: list[dict] = []  # the headers of each GET /v1/models
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.client_ports: list[int] = []  # one port per TCP connection the client opened
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        app = Starlette(
            routes=[
                Route("/v1/chat/completions", self.complete, methods=["POST"]),
                Route("/v1/models", self.list_models, methods=["GET"]),
                Route("/health", self.health, methods=["GET"]),
                Route("/v1/load_lora_adapter", self.load_adapter, methods=["POST"]),
            ]
        )
        self.server = uvicorn.Server(uvicorn.Config(app, port=self.port, log_level="warning"))

    async def health(self, request: Request):
        return JSONResponse({"status": "ok"})

    async def load_adapter(self, request: Request):
        """vLLM's runtime LoRA loading: the adapter is listed from now on."""
        body = await request.json()
        self.loaded_adapters.append(body)
        if body["lora_name"] not in self.models:
            self.models.append(body["lora_name"])
        return PlainTextResponse(f"Success: LoRA adapter '{body['lora_name']}' added successfully.")

    async def list_models(self, request: Request):
        self.model_lists += 1
        self.model_list_headers.append(dict(request.headers))
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": "test"}
            for name in self.models
        ]
        return JSONResponse({"object": "list", "data": data})

    async def complete(self, request: Request):
        body = await request.json()
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        self.client_ports.append(request.client.port)
        if not self.replies:
            return JSONResponse({"error": {"message": "script exhausted"}}, status_code=500)
        reply = self.replies.pop(0)
        if not body.get("stream"):  # a whole reply (content only), as client.chat asks for
            message = {"role": "assistant", "content": reply.get("content", "")}
            choice = {"index": 0, "message": message, "finish_reason": "stop"}
            return JSONResponse(
                {
                    "id": "x",
                    "object": "chat.completion",
                    "model": body["model"],
                    "choices": [choice],
                }
            )
        usage = (body.get("stream_options") or {}).get("include_usage")
        return StreamingResponse(
            self.paced(self.chunks(body["model"], reply, usage)), media_type="text/event-stream"
        )

    async def paced(self, chunks):
        yield await anext(chunks)  # the role chunk at once
        async for chunk in chunks:
            await asyncio.sleep(self.pace)
            yield chunk

    @staticmethod
    async def chunks(model, reply, usage=False):
        def chunk(delta, finish=None):
            data = {
                "id": "x",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            return f"data: {json.dumps(data)}\n\n"

        yield chunk({"role": "assistant"})
        for word in reply.get("content", "").split(" "):
            if word:
                yield chunk({"content": word + " "})
        for i, (name, arguments) in enumerate(reply.get("tool_calls", [])):
            yield chunk(
                {
                    "tool_calls": [
                        {
                            "index": i,
                            "id": f"call_{i}",
                            "type": "function",
                            "function": {"name": name, "arguments": ""},
                        }
                    ]
                }
            )
            # the arguments a few characters at a time, as an engine streams their tokens
            text = json.dumps(arguments)
            for at in range(0, len(text), ARGUMENTS_PIECE):
                piece = {"arguments": text[at : at + ARGUMENTS_PIECE]}
                yield chunk({"tool_calls": [{"index": i, "function": piece}]})
        yield chunk({}, "tool_calls" if reply.get("tool_calls") else "stop")
        if usage:  # as vLLM sends it: a last chunk with no choices (a word counts as a token)
            words = len(reply.get("content", "").split())
            counts = {"prompt_tokens": 10, "completion_tokens": words, "total_tokens": 10 + words}
            data = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": model}
            yield f"data: {json.dumps({**data, 'choices': [], 'usage': counts})}\n\n"
        yield "data: [DONE]\n\n"
