"""An OpenAI-compatible streaming engine that misbehaves on cue, for the chat's fault tests.

Each streamed request pops the next behaviour: "ok" (a short reply at once), "slow" (a reply a
word every `pace` seconds), "stall" (two words, then silence with the connection held open),
"die" (two words, then the connection dropped mid-body). With the script empty it answers "ok".
"""

import asyncio
import json
import threading
import time

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from tests.conftest import free_port

REPLY = "Happy to help with that today"


class EngineDied(Exception):
    """Raised inside the response body: uvicorn drops the connection mid-stream."""


class FaultyEngine:
    def __init__(self, script=(), pace=0.15):
        self.script = list(script)
        self.pace = pace
        self.requests = 0
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        app = Starlette(routes=[Route("/v1/chat/completions", self.complete, methods=["POST"])])
        config = uvicorn.Config(
            app, port=self.port, log_level="critical", timeout_graceful_shutdown=1
        )
        self.server = uvicorn.Server(config)

    async def complete(self, request: Request):
        body = await request.json()
        self.requests += 1
        behaviour = self.script.pop(0) if self.script else "ok"
        chunks = self.chunks(body["model"], behaviour)
        return StreamingResponse(chunks, media_type="text/event-stream")

    async def chunks(self, model, behaviour):
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
        for n, word in enumerate(REPLY.split(" ")):
            if n == 2 and behaviour == "stall":
                await asyncio.sleep(3600)  # silent, the connection open, until cancelled
            if n == 2 and behaviour == "die":
                raise EngineDied("the engine process died mid-reply")
            if behaviour == "slow":
                await asyncio.sleep(self.pace)
            yield chunk({"content": word + " "})
        yield chunk({}, "stop")
        yield "data: [DONE]\n\n"

    def __enter__(self):
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=10)
