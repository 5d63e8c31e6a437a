"""A study served by `manage.py serve_agents` on vLLM, end to end: two replicas of SmolLM2 with
the LoRA adapters of a real training run, a participant chatting through the real consumer.

vLLM on CPU takes a minute or two to start, so the command and its two replicas start once for
the module and the tests run in file order against them: the command registered the endpoint
and pointed the study's arms at it; a checkpoint attached later is loaded on both replicas
without a restart; a participant's turns stream from vLLM and are stored with their timing
and replica, and when that replica is killed mid-study the next turn is served by the other;
Ctrl-C stops every replica's process group.
"""

import asyncio
import json
import os
import signal
import time

import httpx
import pytest
from channels.db import database_sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator

from agents.domains import DOMAINS
from agents.models import Checkpoint, ModelEndpoint
from agents.serving.process import free_port, group_alive
from studies.chat.routing import websocket_urlpatterns
from studies.models import Arm, Message
from studies.participation.arrive import arrive
from studies.participation.consent import give_consent
from studies.setup.arm_endpoints import point_arms, register_endpoint
from tests.support.processes import ServeAgents, child_env
from tests.support.studies import make_study, prolific
from tests.support.training import LetterDomain
from training.config import parse_config
from training.trainer import loop

pytestmark = [pytest.mark.model, pytest.mark.django_db(transaction=True)]
SLUG = "vllm-study"


@pytest.fixture(scope="module")
def trained(base_model, tmp_path_factory) -> list[Checkpoint]:
    """The two checkpoints (steps 1 and 2) of a real LoRA training run of SmolLM2 on the toy
    letters Domain, as the trainer wrote them."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(DOMAINS, LetterDomain.name, f"{LetterDomain.__module__}:LetterDomain")
        config = parse_config(
            {
                "name": "study-vllm",
                "domain": LetterDomain.name,
                "base_model": str(base_model),
                "steps": 2,
                "group_size": 2,
                "lr": 5e-2,
                "max_new_tokens": 4,
                "max_turns": 2,
                "simulator": {"max_new_tokens": 4},
                "heldout": [],
                "save_every": 1,
                "output_dir": str(tmp_path_factory.mktemp("runs") / "run"),
                "threads": 1,
            }
        )
        folders = loop.train(config, domain=LetterDomain(), show_progress=False)
    manifests = [json.loads((folder / "manifest.json").read_text()) for folder in folders]
    assert [m["step"] for m in manifests] == [1, 2] and all(m["adapter"] for m in manifests)
    return [
        Checkpoint(name=m["name"], path=str(folder), base_model=m["base_model"], step=m["step"])
        for folder, m in zip(folders, manifests, strict=True)
    ]


def two_free_ports() -> int:
    """A port P with P + 1 free as well (serve_agents puts replicas on consecutive ports)."""
    from agents.serving.process import port_is_free

    while True:
        port = free_port()
        if port < 65535 and port_is_free("127.0.0.1", port + 1):
            return port


@pytest.fixture(scope="module")
def served(vllm_ready, trained, django_db_setup, django_db_blocker):
    """`serve_agents --engine vllm --study SLUG --replicas 2` for a study whose arm asks for the
    step-1 checkpoint (the other arm asks for the base model)."""
    with django_db_blocker.unblock():
        for checkpoint in trained:
            Checkpoint.objects.filter(name=checkpoint.name).delete()
            checkpoint.save()
        study = make_study(slug=SLUG, arms=("trained", "base"))
        study.arms.filter(name="trained").update(model_name=trained[0].name)
        env = child_env(VLLM_CPU_KVCACHE_SPACE="1", PARLEY_VLLM_PYTHON=str(vllm_ready))
    command = ServeAgents(
        *("--engine", "vllm", "--study", SLUG, "--replicas", "2"),
        *("--port", str(two_free_ports()), "--max-model-len", "1024"),
        env=env,
    )
    yield command
    command.interrupt()


def served_models(url: str) -> set[str]:
    return {card["id"] for card in httpx.get(f"{url}/models", timeout=30).json()["data"]}


def test_the_arms_point_at_the_new_endpoint_and_a_new_checkpoint_loads_live(
    served, trained, admin_client
):
    endpoint = ModelEndpoint.objects.get(name=SLUG)
    assert endpoint.kind == "vllm" and endpoint.urls() == list(served.replicas)
    arms = {arm.name: arm for arm in Arm.objects.filter(study__slug=SLUG)}
    assert {arm.endpoint_id for arm in arms.values()} == {endpoint.pk}
    step1, step2 = trained
    for url in served.replicas:
        assert served_models(url) == {"SmolLM2-135M-Instruct", step1.name}

    # the admin's action, as a researcher attaches the step-2 checkpoint to the trained arm
    checkpoint = Checkpoint.objects.get(name=step2.name)
    response = admin_client.post(
        "/admin/agents/checkpoint/",
        {
            "action": "attach_to_arm",
            "_selected_action": [checkpoint.pk],
            "apply": "1",
            "arms": [arms["trained"].pk],
            "endpoint": endpoint.pk,
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    arms["trained"].refresh_from_db()
    assert arms["trained"].model_name == step2.name
    for url in served.replicas:  # both replicas serve it, and neither restarted
        assert served_models(url) == {"SmolLM2-135M-Instruct", step1.name, step2.name}
        assert group_alive(served.replicas[url])
        reply = httpx.post(
            f"{url}/chat/completions",
            json={
                "model": step2.name,
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 4,
                "temperature": 0,
            },
            timeout=120,
        )
        assert reply.status_code == 200 and reply.json()["model"] == step2.name


app = URLRouter(websocket_urlpatterns)


@database_sync_to_async
def chatting_participant(served, model_name):
    study = make_study(slug="vllm-chat", arms=("trained",))
    endpoint = register_endpoint(SLUG, "vllm", list(served.replicas))
    point_arms(study, endpoint, {"trained": model_name})
    participant, _ = arrive(study, prolific(pid="vllm-participant"))
    return give_consent(participant, True)


@database_sync_to_async
def agent_messages(participant):
    return list(
        Message.objects.filter(
            conversation__participant=participant, role=Message.Role.ASSISTANT
        ).order_by("seq")
    )


async def turn(chat, number: int) -> list[dict]:
    """Send the participant's message and return the events up to the stored reply."""
    await chat.send_json_to({"type": "message", "id": f"m-{number}", "text": "Tell me a story."})
    events = []
    while not events or events[-1]["type"] != "reply":
        # generous: CI's two runs can meet in the vLLM tests, five vLLM processes on 2 cores
        # (load 62, 20 of 23 GiB), and a first turn then took over 120 s (session 21's CI)
        events.append(await chat.receive_json_from(timeout=300))
    await chat.receive_json_from(timeout=30)  # the status that follows the reply
    return events


@pytest.mark.asyncio
async def test_turns_stream_from_vllm_and_fail_over_when_the_replica_dies(served, trained):
    step1 = trained[0]
    participant = await chatting_participant(served, step1.name)
    chat = WebsocketCommunicator(app, f"/ws/p/{participant.token}/")
    assert (await chat.connect(timeout=30))[0]
    assert (await chat.receive_json_from())["type"] == "history"

    events = await turn(chat, 1)
    assert len([e for e in events if e["type"] == "delta"]) >= 2, "the reply streams"
    (first,) = await agent_messages(participant)
    assert first.model == step1.name and first.content == events[-1]["message"]["content"]
    assert 0 < first.ttft_ms <= first.latency_ms and first.completion_tokens
    assert first.replica in served.replicas

    # the replica that answered dies mid-study (its whole process group: vLLM and engine core)
    os.killpg(served.replicas[first.replica], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while group_alive(served.replicas[first.replica]) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    # serve_agents says so (its health probes' request lines may come first), and serves on
    assert "stopped" in served.next_saying("replica ", timeout=30)

    events = await turn(chat, 2)
    assert events[-1]["message"]["content"]
    second = (await agent_messages(participant))[-1]
    (survivor,) = set(served.replicas) - {first.replica}
    assert second.replica == survivor and second.model == step1.name
    assert 0 < second.ttft_ms <= second.latency_ms
    await chat.disconnect()
    # and starts the dead one again; the next test's Ctrl-C is about a serving command, so it
    # waits for that start to end (a Ctrl-C during a start: tests/studies/setup/test_serve_agents)
    assert "started again" in served.next_saying(f"replica {first.replica}", timeout=300)


def test_ctrl_c_stops_every_replica(served):
    assert served.interrupt() == 0, served.log()
    assert not [url for url, pid in served.replicas.items() if group_alive(pid)]
