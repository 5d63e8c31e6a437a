"""Trained and frozen roles sampled by a real vLLM server: the agent (`rollout_endpoint`) and a
co-trained simulator (`[simulator] endpoint`), each trained in-process on exactly the ids vLLM
sampled from the adapter it hot-loads after each update; a Verbalized Sampling simulator held to
the k = 5 JSON schema by vLLM's structured outputs.

The server tests need vLLM's own venv (`make vllm`): skipped without it, failed under CI
(PARLEY_CI=1), which installs it (vLLM on CPU starts in about a minute: one server,
tests/conftest.py's vllm_url, serves the suite). SmolLM2 on the toy "letters" Domain, two
steps. The last test checks the server's command line and environment without vLLM.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import httpx
import pytest
import torch

from agents.llm import LLMClient
from agents.llm.client import CompletionResult
from agents.simulators.spec import SimulatorSpec
from training.config import parse_config
from training.regimes import regime
from training.rl.policy import LocalModel
from training.rollouts.agent import EndpointAgent
from training.rollouts.served import turn_ids
from training.rollouts.simulator import EndpointUser, ServedUser
from training.trainer import checkpoint, loop


class RecordingAgent(EndpointAgent):
    """The trainer's EndpointAgent, keeping each rollout and the ids recorded into it per turn."""

    instances: list[RecordingAgent] = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.turns: dict[int, list[list[int]]] = {}  # id(rollout) -> its sampled ids, per turn
        self.rollouts = []
        RecordingAgent.instances.append(self)

    def respond(self, domain, rollouts):
        before = [len(r.agent.ids) for r in rollouts]
        super().respond(domain, rollouts)
        for r, start in zip(rollouts, before, strict=True):
            if id(r) not in self.turns:
                self.rollouts.append(r)
            new = zip(r.agent.ids[start:], r.agent.mask[start:], strict=True)
            self.turns.setdefault(id(r), []).append([t for t, m in new if m])


@pytest.fixture
def server_answers(monkeypatch) -> list[CompletionResult]:
    """Every completion vLLM answered through LLMClient.complete, as it answered it."""
    answers = []
    complete = LLMClient.complete

    async def recording(self, *args, **kwargs):
        result = await complete(self, *args, **kwargs)
        answers.append(result)
        return result

    monkeypatch.setattr(LLMClient, "complete", recording)
    return answers


def served_requests(url: str) -> float:
    """vLLM's own count of finished requests (its Prometheus /metrics)."""
    text = httpx.get(url.removesuffix("/v1") + "/metrics", timeout=10).text
    counts = re.findall(r"^vllm:request_success_total\{[^}]*\} ([0-9.e+]+)$", text, re.M)
    return sum(float(c) for c in counts)


def test_rollouts_through_vllm_train_and_reload_the_adapter(
    vllm_url, base_model, tmp_path, letters, monkeypatch, server_answers
):
    monkeypatch.setattr(loop, "EndpointAgent", RecordingAgent)
    RecordingAgent.instances = []
    cfg = parse_config(
        {
            "name": "toy-vllm",
            "domain": "letters",
            "base_model": str(base_model),
            "steps": 2,
            "group_size": 2,
            "batch_tasks": 2,
            "lr": 5e-3,
            "temperature": 1.0,
            "max_new_tokens": 8,
            "max_turns": 2,  # the user asks, the agent answers once
            "simulator": {"max_new_tokens": 4},
            "heldout": [],
            "save_every": 1,
            "rollout_endpoint": vllm_url,
            "output_dir": str(tmp_path / "run"),
            "threads": 1,
        }
    )
    before = served_requests(vllm_url)
    saved = loop.train(cfg, domain=letters, show_progress=False)

    (agent,) = RecordingAgent.instances
    # every agent turn was a completion vLLM answered, and nothing else was asked of it
    assert len(server_answers) == 2 * 2 * 2  # steps x tasks x G, one agent turn each
    assert served_requests(vllm_url) - before == len(server_answers)
    assert {a.model for a in server_answers} == {"toy-vllm-live-0", "toy-vllm-live-1"}
    # the trained (mask 1) tokens of the transcripts are exactly the ids vLLM returned
    returned = sorted(tuple(turn_ids(a, agent.lm.stop_ids)) for a in server_answers)
    recorded = sorted(tuple(ids) for r in agent.rollouts for ids in agent.turns[id(r)])
    assert recorded == returned
    assert all(0 < len(a.token_ids) <= cfg.max_new_tokens for a in server_answers)
    for r in agent.rollouts:
        assert sum(r.agent.mask) == sum(len(ids) for ids in agent.turns[id(r)])

    # each step wrote a checkpoint, and took an optimizer step
    assert [p.name for p in saved] == ["step-000001", "step-000002"]
    assert (saved[-1] / "adapter_model.safetensors").is_file()
    assert checkpoint.read_manifest(saved[-1])["step"] == 2
    rows = [json.loads(line) for line in (cfg.run_dir() / "metrics.jsonl").read_text().splitlines()]
    assert all(row["grad_norm"] > 0 for row in rows)

    # the server now samples from the adapter trained in step 1; step 0's is unloaded and gone
    models = asyncio.run(_models(vllm_url))
    assert "toy-vllm-live-1" in models and "toy-vllm-live-0" not in models
    assert [p.name for p in (cfg.run_dir() / "live").iterdir()] == ["step-000001"]

    # and what it serves is the trained adapter: its log-prob of a token is the trainer's
    trained = LocalModel.load(base_model, adapter=str(saved[0]))
    prompt = trained.fmt.opening([{"role": "user", "content": "Tell me about trees."}])
    prompt += trained.fmt.generation_prompt
    served = asyncio.run(_first_logprob(vllm_url, "toy-vllm-live-1", prompt))
    base = asyncio.run(_first_logprob(vllm_url, Path(base_model).name, prompt))
    token, logprob = served
    with torch.no_grad():
        logits = trained.model(torch.tensor([prompt])).logits[0, -1]
    ours = float(torch.log_softmax(logits.float(), -1)[token])
    assert logprob == pytest.approx(ours, abs=2e-3)
    assert served != base  # the adapter moved the model

    # a resumed run loads its adapter under a name the server already has: it is replaced
    agent.load(str(saved[-1]), "toy-vllm-live-1")
    assert asyncio.run(_first_logprob(vllm_url, "toy-vllm-live-1", prompt)) != served


def test_a_turn_ended_by_a_stop_token_keeps_it(vllm_url, base_model, server_answers):
    """A turn that a stop token ended keeps that token (trained on, as in-process sampling)."""
    lm = LocalModel.load(base_model)
    prompt = lm.fmt.opening([{"role": "user", "content": "Say OK."}]) + lm.fmt.generation_prompt
    first = asyncio.run(_first_logprob(vllm_url, Path(base_model).name, prompt))[0]
    # make the model's own greedy first token a stop token: the turn ends at once
    lm.stop_ids = sorted({*lm.stop_ids, first})
    agent = EndpointAgent(vllm_url, lm, temperature=0.0, max_new_tokens=8)
    agent.model = Path(base_model).name  # the base model, no adapter
    (ids,) = agent.sample([prompt])
    (answer,) = [a for a in server_answers if a.token_ids is not None and a.logprobs is None]
    assert answer.finish_reason == "stop"
    assert ids == turn_ids(answer, lm.stop_ids)
    assert ids[-1] == first and ids.count(first) == 1


async def _models(url: str) -> list[str]:
    async with LLMClient(url) as client:
        return await client.list_models()


async def _first_logprob(url: str, model: str, prompt: list[int]) -> tuple[int, float]:
    """The greedy first token of `prompt` under `model` on the server, and its log-prob."""
    async with LLMClient(url) as client:
        result = await client.complete(
            model, prompt, return_token_ids=True, max_tokens=1, temperature=0.0, logprobs=1
        )
    return result.token_ids[0], result.logprobs["token_logprobs"][0]


def test_runtime_lora_server_command_and_environment(base_model):
    """What start_vllm(runtime_lora_rank=R) launches (checked without vLLM, so it runs in CI)."""
    from agents.serving.vllm import build_command, vllm_env

    command = build_command(base_model, 8000, None, python="/opt/py", runtime_lora_rank=16)
    assert command[command.index("--max-lora-rank") + 1] == "16"
    assert "--enable-lora" in command and "--lora-modules" not in command
    assert int(command[command.index("--max-loras") + 1]) >= 2  # the next loads beside the last
    assert vllm_env(runtime_lora=True)["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert "--enable-lora" not in build_command(base_model, 8000, None, python="/opt/py")
    compact = build_command(base_model, 8000, python="/opt/py", compact_json=True)
    config = json.loads(compact[compact.index("--structured-outputs-config") + 1])
    assert config == {"backend": "xgrammar", "disable_any_whitespace": True}


class RecordingUser(ServedUser):
    """The trainer's co-trained simulator on vLLM, keeping the ids recorded into each rollout's
    user transcript per turn (its mask-1 tokens: what its update trains on)."""

    instances: list[RecordingUser] = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.turns: list[list[int]] = []
        RecordingUser.instances.append(self)

    def respond(self, domain, rollouts):
        before = [len(r.user.ids) for r in rollouts]
        super().respond(domain, rollouts)
        for r, start in zip(rollouts, before, strict=True):
            new = zip(r.user.ids[start:], r.user.mask[start:], strict=True)
            self.turns.append([t for t, m in new if m])


def test_cotrained_simulator_on_vllm_trains_on_its_sampled_ids_and_reloads(
    vllm_url, base_model, tmp_path, letters, monkeypatch, server_answers
):
    """regime cotrain with [simulator] endpoint: vLLM samples the simulator's turns from the
    adapter published before each step; its update trains on exactly the ids vLLM returned."""
    monkeypatch.setattr(regime, "ServedUser", RecordingUser)
    RecordingUser.instances = []
    cfg = parse_config(
        {
            "name": "toy-sim",
            "domain": "letters",
            "regime": "cotrain",
            "base_model": str(base_model),
            "steps": 2,
            "group_size": 4,
            "lr": 5e-3,
            "simulator_lr": 5e-2,
            "simulator_beta": 0.0,
            "simulator_reward": "adversarial",
            "temperature": 1.0,
            "max_new_tokens": 6,
            "max_turns": 2,  # the user asks (on vLLM), the agent answers once (in-process)
            "simulator": {
                "endpoint": vllm_url,
                "model": str(base_model),
                "max_new_tokens": 6,
                "temperature": 1.0,
            },
            "heldout": [],
            "save_every": 1,
            "output_dir": str(tmp_path / "run"),
            "threads": 1,
        }
    )
    saved = loop.train(cfg, domain=letters, show_progress=False)

    (user,) = RecordingUser.instances
    # every user turn was a completion vLLM answered, from that step's published adapter
    assert len(server_answers) == 2 * 4  # steps x G, one user turn each
    assert {a.model for a in server_answers} == {
        "toy-sim-simulator-live-0",
        "toy-sim-simulator-live-1",
    }
    # the simulator's trained (mask 1) tokens are exactly the ids vLLM returned
    returned = sorted(tuple(turn_ids(a, user.lm.stop_ids)) for a in server_answers)
    assert sorted(tuple(ids) for ids in user.turns) == returned
    assert all(0 < len(a.token_ids) <= 6 for a in server_answers)
    rows = [json.loads(line) for line in (cfg.run_dir() / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["sim/learned"] == 1.0 and rows[0]["sim/grad_norm"] > 0

    # the server samples from the simulator as step 1's update left it; step 0's is unloaded
    models = asyncio.run(_models(vllm_url))
    assert "toy-sim-simulator-live-1" in models and "toy-sim-simulator-live-0" not in models
    trained = LocalModel.load(base_model, adapter=str(saved[0] / "simulator"))
    prompt = trained.fmt.opening([{"role": "user", "content": "Tell me about trees."}])
    prompt += trained.fmt.generation_prompt
    token, logprob = asyncio.run(_first_logprob(vllm_url, "toy-sim-simulator-live-1", prompt))
    with torch.no_grad():
        logits = trained.model(torch.tensor([prompt])).logits[0, -1]
    assert logprob == pytest.approx(float(torch.log_softmax(logits.float(), -1)[token]), abs=2e-3)
    base = asyncio.run(_first_logprob(vllm_url, Path(base_model).name, prompt))
    assert (token, logprob) != base  # the update moved it


def test_verbalized_simulator_on_vllm_answers_the_k5_schema(vllm_url, base_model, monkeypatch):
    """A Verbalized Sampling simulator on vLLM: each request carries the k = 5 JSON schema as
    response_format, vLLM's structured outputs hold the answer to it (5 candidates, each text
    one of the P4G markers; an answer that does not read was cut off by the budget, and is
    asked again), and the distribution it wrote is the turn's Decision."""
    from agents.domains import get_domain
    from agents.simulators import parse_verbalized
    from training.rollouts.rollout import Rollout

    answered = []
    chat = LLMClient.chat

    async def recording(self, model, messages, **params):
        result = await chat(self, model, messages, **params)
        answered.append((params, result))
        return result

    monkeypatch.setattr(LLMClient, "chat", recording)
    decision = get_domain("p4g-decision")
    rollouts = []
    for task in decision.scenarios("test")[:2]:
        rollout = Rollout.begin(decision, task)
        rollout.conversation.append({"role": "assistant", "content": "Could you give $2?"})
        rollout.max_turns = decision.max_turns
        rollouts.append(rollout)
    spec = SimulatorSpec(
        name="vs",
        kind="verbalized",
        endpoint=vllm_url,
        model=Path(base_model).name,
        max_new_tokens=160,
        retries=3,
    )
    user = EndpointUser(spec)
    try:
        user.respond(decision, rollouts)
    finally:
        user.close()
    markers = decision.user_choices(rollouts[0].scenario, [], True)
    parsed = 0
    for params, result in answered:
        schema = params["response_format"]["json_schema"]["schema"]
        items = schema["properties"]["responses"]
        assert (items["minItems"], items["maxItems"]) == (5, 5)
        assert items["items"]["properties"]["text"]["enum"] == markers
        try:
            candidates = parse_verbalized(result.content, k=5)
        except ValueError:
            # the schema held to the end of the budget (SmolLM2 can write a probability's digits
            # without end): only a cut-off answer is asked again
            assert result.finish_reason == "length", result.content
            continue
        parsed += 1
        assert all(c.text in markers for c in candidates)
    assert parsed == 2  # one read answer per reply
    for r in rollouts:
        assert r.fallbacks == 0 and r.conversation[-1]["content"] in markers
        (written,) = r.decisions
        assert written.texts == markers and sum(written.probs) == pytest.approx(1.0)
        assert written.texts[written.index] == r.conversation[-1]["content"]


def test_two_processes_share_one_served_simulator(vllm_url, base_model, tmp_path):
    """Co-training on 2 processes with the simulator on vLLM: rank 0 alone saves and hot-loads
    the simulator's adapter after each update and the other rank samples it by name (both
    loading it would unload it under each other's feet); the run ends on the last one."""
    from tests.support.training import launch

    path = tmp_path / "cotrain-vllm.toml"
    path.write_text(
        "\n".join(
            [
                'name = "dp-sim"',
                'domain = "p4g"',
                'regime = "cotrain"',
                f'base_model = "{base_model}"',
                "steps = 2",
                "group_size = 2",
                "batch_tasks = 2",
                "max_turns = 4",
                "max_new_tokens = 6",
                "temperature = 1.0",
                "save_every = 2",
                "eval_every = 100",
                "threads = 1",
                "heldout = []",
                "[tasks]",
                "max_train = 2",
                "max_eval = 1",
                "[simulator]",
                'name = "persuadee"',
                f'endpoint = "{vllm_url}"',
                f'model = "{base_model}"',
                "max_new_tokens = 6",
                "temperature = 1.0",
            ]
        )
    )
    done = launch(path, tmp_path / "run")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(row)["step"] for row in rows] == [1, 2]  # rank 0 alone wrote them
    models = asyncio.run(_models(vllm_url))
    assert "dp-sim-simulator-live-1" in models and "dp-sim-simulator-live-0" not in models
