"""Speakers on endpoints keep one client for the run: every turn of the simulator, and every
adapter load and turn of the agent on a vLLM server, goes over the connection the first one
opened (a client per turn would open a new connection, from a new port, every time)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from agents.simulators.spec import SimulatorSpec
from tests.support.scripted_server import ScriptedServer
from training.rl.policy import LocalModel
from training.rollouts.agent import EndpointAgent
from training.rollouts.rollout import play
from training.rollouts.simulator import EndpointUser


class CompletionServer(ScriptedServer):
    """vLLM's side of the trainer's EndpointAgent: token-id completions (always `token_ids`)
    and runtime LoRA loading. Records each request's path and the client's port."""

    def __init__(self, token_ids: list[int]):
        super().__init__([])
        self.token_ids = token_ids
        self.calls: list[tuple[str, int]] = []
        self.bodies: list[tuple[str, dict]] = []  # (path, request body), in order
        app = Starlette(
            routes=[
                Route("/v1/completions", self.completion, methods=["POST"]),
                Route("/v1/load_lora_adapter", self.adapter, methods=["POST"]),
                Route("/v1/unload_lora_adapter", self.adapter, methods=["POST"]),
            ]
        )
        self.server = uvicorn.Server(uvicorn.Config(app, port=self.port, log_level="warning"))

    async def completion(self, request: Request):
        body = await request.json()
        self.calls.append((request.url.path, request.client.port))
        self.bodies.append((request.url.path, body))
        choice = {
            "index": 0,
            "text": "",
            "logprobs": None,
            "finish_reason": "length",
            "token_ids": self.token_ids,
            "stop_reason": None,
        }
        return JSONResponse(
            {
                "id": "c",
                "object": "text_completion",
                "created": 0,
                "model": body["model"],
                "choices": [choice],
            }
        )

    async def adapter(self, request: Request):
        self.calls.append((request.url.path, request.client.port))
        self.bodies.append((request.url.path, await request.json()))
        return PlainTextResponse("Success")


def established(port: int, server_url: str) -> bool:
    """A TCP connection from local `port` to the server at `server_url` is open (Linux's
    /proc/net/tcp; state 01). The server's port is matched too: a local port alone may be
    another socket's meanwhile (once seen in CI, with long-lived servers beside the test)."""
    server = urlsplit(server_url).port
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, remote, state = line.split()[1:4]
        ports = int(local.split(":")[1], 16), int(remote.split(":")[1], 16)
        if ports == (port, server) and state == "01":
            return True
    return False


def test_each_role_on_an_endpoint_keeps_one_connection_for_the_run(tiny_model, letters):
    lm = LocalModel.load(tiny_model)
    words = lm.fmt.encode(" eerie tree")
    replies = [{"content": f"Tell me more, part {i}."} for i in range(6)]
    with ScriptedServer(replies) as chat, CompletionServer(words) as vllm:
        user = EndpointUser(SimulatorSpec(name="hosted", endpoint=chat.url, model="sim"))
        agent = EndpointAgent(vllm.url, lm, 1.0, 8)
        scenario = letters.scenarios("train")[0]
        for step in range(2):  # the trainer: load the step's adapter, then play
            agent.load(f"/runs/live/step-{step}", f"live-{step}")
            (rollout,) = play(letters, [scenario], agent, user, max_turns=4)
            assert rollout.end_reason == "max_turns"
        paths = [path for path, _ in vllm.calls]
        assert paths.count("/v1/completions") == 4 and "/v1/unload_lora_adapter" in paths
        assert len(chat.requests) == 4
        # one connection per role, reused by every turn and load
        assert len(set(chat.client_ports)) == 1
        assert len({port for _, port in vllm.calls}) == 1
        user_port, agent_port = chat.client_ports[0], vllm.calls[0][1]
        assert established(user_port, chat.url) and established(agent_port, vllm.url)
        user.close()
        agent.close()
        assert not established(user_port, chat.url) and not established(agent_port, vllm.url)
        with pytest.raises(RuntimeError, match="closed"):
            agent.load("/runs/live/step-2", "live-2")


def test_a_speaker_dropped_at_the_end_of_a_run_closes_its_connection(letters):
    """The trainer lets go of its speakers when train() returns: that closes their clients."""
    with ScriptedServer([{"content": "Hello."}]) as chat:
        user = EndpointUser(SimulatorSpec(name="hosted", endpoint=chat.url, model="sim"))
        play(letters, letters.scenarios("train")[:1], _Silent(), user, max_turns=1)
        (port,) = chat.client_ports
        assert established(port, chat.url)
        del user
        assert not established(port, chat.url)


class _Silent:
    """An agent that never gets a turn (the user speaks first and the run ends after it)."""

    role = "agent"

    def respond(self, domain, rollouts):
        raise AssertionError("the agent should not speak")


def test_a_served_population_samples_each_member_from_its_own_adapter(
    tiny_model, letters, tmp_path, monkeypatch
):
    """Population co-training with the simulator on a (vLLM-shaped) server: before each step
    the current adapter is published and loaded; a snapshot's turns are sampled from the
    snapshot's adapter, loaded beside it and unloaded after; every user turn the simulator
    trains on holds exactly the ids the server returned."""
    from training.config import parse_config
    from training.regimes import regime
    from training.rollouts.simulator import ServedUser
    from training.trainer import loop

    trained: list[list[int]] = []  # each user turn's mask-1 ids

    class Recording(ServedUser):
        def respond(self, domain, rollouts):
            before = [len(r.user.ids) for r in rollouts]
            super().respond(domain, rollouts)
            for r, start in zip(rollouts, before, strict=True):
                new = zip(r.user.ids[start:], r.user.mask[start:], strict=True)
                trained.append([t for t, m in new if m])

    monkeypatch.setattr(regime, "ServedUser", Recording)
    lm = LocalModel.load(tiny_model)
    words = lm.fmt.encode(" eerie tree")
    with CompletionServer(words) as server:
        cfg = parse_config(
            {
                "name": "pop",
                "domain": "letters",
                "regime": "population",
                "base_model": str(tiny_model),
                "steps": 2,
                "group_size": 2,
                "pool_every": 1,
                "max_new_tokens": 4,
                "max_turns": 2,
                "heldout": [],
                "threads": 1,
                "simulator": {"endpoint": server.url, "model": str(tiny_model)},
                "output_dir": str(tmp_path / "pop"),
            }
        )
        loop.train(cfg, domain=letters, show_progress=False)
    live, pool = cfg.run_dir() / "live" / "simulator", cfg.run_dir() / "pool"
    # (path, the adapter loaded or unloaded, or the model a completion asked for)
    asked = [(path, body.get("lora_name") or body["model"]) for path, body in server.bodies]
    assert asked == [
        ("/v1/load_lora_adapter", "pop-simulator-live-0"),
        ("/v1/completions", "pop-simulator-live-0"),
        ("/v1/completions", "pop-simulator-live-0"),
        ("/v1/load_lora_adapter", "pop-simulator-live-1"),
        ("/v1/unload_lora_adapter", "pop-simulator-live-0"),
        ("/v1/completions", "pop-simulator-live-1"),  # step 2: the current simulator
        ("/v1/load_lora_adapter", "pop-sim-step-000001"),  # and the pool's snapshot
        ("/v1/completions", "pop-sim-step-000001"),
        ("/v1/unload_lora_adapter", "pop-sim-step-000001"),
    ]
    loads = [body for path, body in server.bodies if path == "/v1/load_lora_adapter"]
    assert [body["lora_path"] for body in loads] == [
        str(live / "step-000000"),
        str(live / "step-000001"),
        str(pool / "sim-step-000001"),
    ]
    assert all(
        body["prompt"] and isinstance(body["prompt"][0], int)
        for _, body in server.bodies
        if "prompt" in body
    )
    assert [p.name for p in live.iterdir()] == ["step-000001"]  # the unloaded one is deleted
    assert trained == [words] * 4
