"""An OpenAI-compatible streaming engine that misbehaves on cue, for the chat's fault tests.

Each streamed request pops the next behaviour: "ok" (a short reply at once), "slow" (a reply a
word every `pace` seconds), "stall" (two words, then silence with the connection held open),
"late" (silence for `pace` seconds before the first word), "mute" (silence before the first word,
the connection held open), "die" (two words, then the connection dropped mid-body). With the
script empty it answers "ok".
"""

import asyncio

from starlette.requests import Request
from starlette.responses import StreamingResponse

from tests.support.scripted_server import ScriptedServer

REPLY = "Happy to help with that today"
FAULT_AT = 3  # the role chunk and two words go out before a stall or a death


class EngineDied(Exception):
    """Raised inside the response body: uvicorn drops the connection mid-stream."""


class FaultyEngine(ScriptedServer):
    def __init__(self, script=(), pace=0.15):
        super().__init__([])
        self.script = list(script)
        self.pace = pace
        self.open_streams = 0
        self.server.config.timeout_graceful_shutdown = 1  # a stalled stream must not hold exit

    async def complete(self, request: Request):
        body = await request.json()
        self.requests.append(body)
        behaviour = self.script.pop(0) if self.script else "ok"
        chunks = self.faulty_chunks(body["model"], behaviour)
        return StreamingResponse(chunks, media_type="text/event-stream")

    async def faulty_chunks(self, model, behaviour):
        self.open_streams += 1
        try:
            async for chunk in self.behaving(model, behaviour):
                yield chunk
        finally:  # the reply ended, or the client hung up (Starlette cancels the body)
            self.open_streams -= 1

    async def behaving(self, model, behaviour):
        n = 0
        async for chunk in self.chunks(model, {"content": REPLY}):
            if n == 1 and behaviour == "late":
                await asyncio.sleep(self.pace)
            if (n, behaviour) in ((1, "mute"), (FAULT_AT, "stall")):
                await asyncio.sleep(3600)  # silent, the connection open, until cancelled
            if n == FAULT_AT and behaviour == "die":
                raise EngineDied("the engine process died mid-reply")
            if n and behaviour == "slow":
                await asyncio.sleep(self.pace)
            n += 1
            yield chunk
