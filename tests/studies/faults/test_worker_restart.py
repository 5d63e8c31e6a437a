"""The ASGI server restarts (a deploy, a crash) while a reply streams: the participant's message
is already stored, the page reconnects to the new server and gets the reply, stored once."""

import asyncio
import json
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from websockets.asyncio.client import connect

from agents.serving.process import free_port
from studies.models import Message
from studies.participation.arrive import arrive
from studies.participation.consent import give_consent
from tests.support.faulty_engine import REPLY, FaultyEngine
from tests.support.processes import REPO, child_env
from tests.support.studies import make_study, prolific


def start_server(port: int) -> subprocess.Popen:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "parley.asgi:application",
            "--port",
            str(port),
            "--timeout-graceful-shutdown",
            "1",
        ],
        cwd=REPO,
        env=child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)
            return process
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                pytest.fail("the ASGI server did not start")
            time.sleep(0.2)


async def events_until(socket, kind: str, timeout: float = 30) -> list[dict]:
    events = []
    while not events or events[-1]["type"] != kind:
        events.append(json.loads(await asyncio.wait_for(socket.recv(), timeout)))
    return events


@pytest.mark.django_db(transaction=True)
def test_a_server_restart_mid_reply_loses_nothing():
    port = free_port()
    address = f"ws://127.0.0.1:{port}"
    with FaultyEngine(["slow", "ok"], pace=0.5) as engine:
        study = make_study(slug="restart", engine=engine.url)
        participant, _ = arrive(study, prolific(pid="restart"))
        participant = give_consent(participant, True)
        path = f"{address}/ws/p/{participant.token}/"
        server = start_server(port)
        try:

            async def send_then_lose_the_server():
                async with connect(path) as socket:
                    await events_until(socket, "history")
                    await socket.send(json.dumps({"type": "message", "id": "r1", "text": "Hi"}))
                    await events_until(socket, "delta")  # the reply is streaming
                    server.send_signal(signal.SIGTERM)  # the deploy restarts the worker
                    with pytest.raises(Exception):  # noqa: B017 - any close or reset will do
                        await events_until(socket, "reply", timeout=20)

            asyncio.run(send_then_lose_the_server())
            server.wait(timeout=20)
            messages = Message.objects.filter(conversation__participant=participant)
            assert list(messages.values_list("role", "client_id")) == [("user", "r1")]

            server = start_server(port)

            async def reconnect():  # as chat.js does after a close
                async with connect(path) as socket:
                    history = await events_until(socket, "history")
                    assert [m["client_id"] for m in history[-1]["messages"]] == ["r1"]
                    reply = await events_until(socket, "reply")
                    return reply[-1]["message"]["content"]

            assert asyncio.run(reconnect()).strip() == REPLY
            assert [m.role for m in messages.order_by("seq")] == ["user", "assistant"]
        finally:
            server.terminate()
            server.wait(timeout=20)
