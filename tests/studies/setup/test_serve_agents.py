"""`manage.py serve_agents` with the embedded engine (vLLM's run is tests/agents/serving/vllm's):
replicas on consecutive ports, the endpoint registered and the study's arms pointed at it, and
every replica's process group gone when the command is stopped. Bad input is refused before
anything starts."""

import os
import signal
import time

import httpx
import psutil
import pytest
from django.core.management import CommandError, call_command

from agents.models import Checkpoint, ModelEndpoint, Replica
from agents.paths import data_dir
from agents.serving.process import free_port, group_alive, port_is_free
from studies.management.commands.serve_agents import warm_requests
from studies.models import Arm, Study
from tests.support.processes import CHECKPOINT_NAME, ServeAgents, child_env
from tests.support.studies import make_study

pytestmark = pytest.mark.django_db(transaction=True)


def two_free_ports() -> int:
    """A port P with P + 1 free as well (replicas go on consecutive ports)."""
    while True:
        port = free_port()
        if port < 65535 and port_is_free("127.0.0.1", port + 1):
            return port


@pytest.mark.model
def test_serves_the_study_on_two_replicas_and_stops_them_all(base_model, checkpoints):
    (folder,) = checkpoints.glob("*/checkpoints/step-*")
    Checkpoint.objects.create(name=CHECKPOINT_NAME, path=str(folder))
    study = make_study(slug="served", arms=("tuned", "base"))
    study.arms.filter(name="tuned").update(model_name=CHECKPOINT_NAME)
    port = two_free_ports()

    command = ServeAgents(
        *("--engine", "embedded", "--study", "served", "--replicas", "2", "--port", str(port)),
        env=child_env(),
        timeout=300,
    )
    try:
        urls = [f"http://127.0.0.1:{port}/v1", f"http://127.0.0.1:{port + 1}/v1"]
        assert list(command.replicas) == urls
        for url in urls:
            served = {card["id"] for card in httpx.get(f"{url}/models").json()["data"]}
            assert {"SmolLM2-135M-Instruct", CHECKPOINT_NAME} <= served

        endpoint = ModelEndpoint.objects.get(name="served")
        assert endpoint.kind == "embedded" and endpoint.urls() == urls
        arms = Arm.objects.filter(study=study)
        assert {arm.endpoint_id for arm in arms} == {endpoint.pk}
        assert {arm.model_name for arm in arms} == {CHECKPOINT_NAME, "SmolLM2-135M-Instruct"}
        for replica_port in (port, port + 1):  # each arm's opening, before it answered /health
            log = (data_dir() / "logs" / f"embedded-{replica_port}.log").read_text()
            assert "Warmed 2 prompt(s)" in log, log
    finally:
        # SIGTERM, as `make demo` stops its engine (Ctrl-C is the vLLM test's)
        code = command.interrupt(sig=signal.SIGTERM)
    assert code == 0, command.log()
    assert not [url for url, pid in command.replicas.items() if group_alive(pid)]


@pytest.mark.model
def test_a_killed_replica_is_started_again_and_the_admins_replicas_are_kept(base_model, tmp_path):
    """`make demo`'s engine: its replica killed outright (SIGKILL) is started again on its port
    while the command serves on; a replica added to the endpoint in the admin survives the
    command's (re)start, and the endpoint's stored health follows the replica."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    added = "http://127.0.0.1:9/v1"  # another server, added in the admin
    ModelEndpoint.register("default", "embedded", [url])
    Replica.objects.create(endpoint=ModelEndpoint.objects.get(name="default"), url=added)
    command = ServeAgents(
        *("--engine", "embedded", "--adapters", str(tmp_path), "--port", str(port)),
        env=child_env(),
        timeout=300,
    )
    try:
        endpoint = ModelEndpoint.objects.get(name="default")
        assert endpoint.urls() == [url, added]  # nothing stored is lost
        (pid,) = command.replicas.values()
        os.killpg(pid, signal.SIGKILL)
        stopped = command.next_saying(f"replica {url} stopped")
        assert stopped.startswith(f"replica {url} stopped (code -9); starting it again in 1 s")
        started = command.next_saying(f"replica {url} ")
        assert started.startswith(f"replica {url} started again (pid "), command.log()
        assert command.process.poll() is None
        assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
        assert httpx.get(f"{url}/models").json()["data"][0]["id"] == "SmolLM2-135M-Instruct"
        statuses = dict(endpoint.replicas.values_list("url", "status"))
        assert statuses == {url: "up", added: "down"}
    finally:
        code = command.interrupt(sig=signal.SIGTERM)
    assert code == 0, command.log()
    assert not group_alive(int(started.split("pid ")[1].rstrip(")")))


@pytest.mark.model
def test_ctrl_c_while_a_replica_starts_again_stops_it_too(base_model, tmp_path):
    """Ctrl-C that comes while a killed replica is being started again (its engine still
    loading) ends the command within the minute, exit 0, and leaves no engine on the port: the
    interrupt is not taken for a failed start (fails when Supervised swallows it: -9). The
    vLLM study's Ctrl-C test met this moment in CI."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    command = ServeAgents(
        *("--engine", "embedded", "--adapters", str(tmp_path), "--port", str(port)),
        env=child_env(),
        timeout=300,
    )
    try:
        (pid,) = command.replicas.values()
        os.killpg(pid, signal.SIGKILL)
        stopped = command.next_saying(f"replica {url} stopped")
        assert stopped.startswith(f"replica {url} stopped (code -9); starting it again in 1 s")
        deadline = time.monotonic() + 60
        while not starting(port):  # the new engine is loading, not yet answering
            assert time.monotonic() < deadline, command.log()
            time.sleep(0.1)
    finally:
        code = command.interrupt(timeout=60)
    assert code == 0, command.log()
    assert not starting(port) and port_is_free("127.0.0.1", port), command.log()


def starting(port: int) -> list[psutil.Process]:
    """The embedded engines started on `port`."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        line = process.info["cmdline"] or []
        if "agents.serving.embedded.server" in line and str(port) in line:
            found.append(process)
    return found


def test_a_replica_started_again_is_probed_until_it_reads_up(monkeypatch):
    """A replica started again has answered /health; a probe that times out on a busy machine
    (3 s) must not leave it stored "down" until the next beat: it is asked again. A replica
    that stopped is stored at once."""
    from studies.management.commands import serve_agents

    url = "http://127.0.0.1:9/v1"
    ModelEndpoint.register("default", "embedded", [url])
    endpoint = ModelEndpoint.objects.get(name="default")
    answers = iter(["down", "down", "up"])
    probed = []

    def probe(endpoint):
        probed.append(1)
        endpoint.replicas.update(status=next(answers))

    monkeypatch.setattr(serve_agents, "check_endpoint", probe)
    monkeypatch.setattr(serve_agents.time, "sleep", lambda s: None)
    command = serve_agents.Command()
    command.check_health(endpoint, up=url)
    assert len(probed) == 3 and endpoint.replicas.get().status == "up"
    probed.clear()
    command.check_health(endpoint)  # stopped: one probe, stored as it answered
    assert len(probed) == 1


def test_refuses_what_it_cannot_serve(base_model):
    with pytest.raises(CommandError, match="No study 'nowhere'"):
        call_command("serve_agents", "--study", "nowhere")
    study = make_study(slug="unknown-model")
    study.arms.filter(name="a").update(model_name="never-trained-step9")
    with pytest.raises(CommandError, match=r"arm\(s\) a \(never-trained-step9\)"):
        call_command("serve_agents", "--engine", "embedded", "--study", study.slug)
    with pytest.raises(CommandError, match="at least 1"):
        call_command("serve_agents", "--replicas", "0")


def test_refuses_a_taken_port(base_model):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(CommandError, match=f"port {port} on 127.0.0.1 is taken"):
            call_command("serve_agents", "--engine", "embedded", "--port", str(port))


def test_warms_the_arms_it_will_serve(base_model):
    """The study's arms; without a study, the active arms of open studies on the endpoint
    that lists the first replica's URL or is named --name (`make demo`'s `default`)."""
    url = "http://127.0.0.1:8765/v1"
    served = make_study(slug="on-url", arms=("a", "b"), engine=url)
    make_study(slug="elsewhere", arms=("c",), engine="http://127.0.0.1:8766/v1")
    closed = make_study(slug="closed", arms=("d",), engine=url, status=Study.Status.CLOSED)
    served.arms.filter(name="b").update(active=False)

    def prompts(requests):
        return {body["messages"][0]["content"] for body in requests}

    assert prompts(warm_requests(None, None, url)) == {"You are assistant a."}
    assert prompts(warm_requests(closed, None, url)) == {"You are assistant d."}
    named = warm_requests(None, ModelEndpoint.objects.get(replicas__url=url.rstrip("/")).name, "")
    assert prompts(named) == {"You are assistant a."}
    assert warm_requests(None, None, "http://127.0.0.1:9/v1") == []
