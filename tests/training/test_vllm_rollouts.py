"""The agent's rollouts sampled by a real vLLM server (`rollout_endpoint`), trained in-process.

The two server tests need vLLM's own venv (`make vllm`): skipped without it, failed under CI
(PARLEY_CI=1), which installs it (vLLM on CPU starts in about a minute; both take ~80 s here).
SmolLM2 on the toy "letters" Domain, two steps. The last test checks the server's command line
and environment without vLLM.
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
from training import checkpoint, run
from training.agent import EndpointAgent, turn_ids
from training.config import RunConfig
from training.policy import LocalModel


@pytest.fixture(scope="module")
def vllm_url(base_model, vllm_ready):
    from agents.serving.launch import stop_engine
    from agents.serving.vllm import start_vllm

    url, process = start_vllm(base_model, runtime_lora_rank=8, python=vllm_ready)
    try:
        yield url
    finally:
        stop_engine(process, timeout=20)


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
    monkeypatch.setattr(run, "EndpointAgent", RecordingAgent)
    RecordingAgent.instances = []
    cfg = RunConfig.from_dict(
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
    saved = run.train(cfg, domain=letters, show_progress=False)

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
