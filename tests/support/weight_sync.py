"""The heavy halves of tests/training/rollouts/test_vllm_weight_sync.py, each in a process of
its own: a full fine-tuning run, or a policy pushed twice, holds a model's whole weights, its
optimizer's state and a copy per push, and in pytest's process that memory would stay until the
suite ends (CI runs the whole suite in one process, beside other modules' servers: 8.4 GB there
once, and the OOM killer). A child gives it all back when it exits; it writes what it saw to
OUT/result.json and the test asserts on that.

    python -m tests.support.weight_sync SCENARIO URL BASE_MODEL OUT

Also here, light enough for pytest's process: a fixed conversation's log-probs, token by token
with the tokens given (no sampling, so no near-tie between two tokens can decide anything), from
weights in this process or from the server's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.processes import REPO

QUESTION = [{"role": "user", "content": "Tell me about trees."}]
REPLY = (
    "Trees are tall woody plants. They have roots, a trunk, branches and leaves, and they give"
    " us shade, fruit and wood."
)


# the tiny model of test_vllm_weight_sync.py's synced_model: a step at this rate moves its
# log-probs of the fixed conversation by about 0.25 on average, every matrix scaled by this
# by about 0.17 (both far above the 1e-6 two kernels differ by)
LR = 1e-3
SCALE = 1.5


def run_scenario(scenario: str, url: str, base_model: Path | str, out: Path, timeout=600) -> dict:
    """SCENARIO run in a child python; what it wrote (the test fails with its stderr if it
    failed)."""
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'platform'}"}
    command = [sys.executable, "-m", __name__, scenario, url, str(base_model), str(out)]
    done = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{scenario} failed in its process:\n{done.stderr[-4000:]}"
    return json.loads((out / "result.json").read_text())


def build_synced_model(folder: Path, base_model: Path | str) -> Path:
    """training.tools.tiny's Llama, 256 wide (64-wide heads) with a small init, in a child."""
    code = (
        "import sys; from pathlib import Path; from training.tools.tiny import build_tiny_model;"
        " build_tiny_model(Path(sys.argv[1]), Path(sys.argv[2]), hidden=256, init_range=0.02)"
    )
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'platform'}"}
    done = subprocess.run(
        [sys.executable, "-c", code, str(folder), str(base_model)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return folder


def scored_ids(lm: Any) -> list[int]:
    """The trees question as the chat template opens it, and a fixed reply."""
    return lm.fmt.opening(QUESTION) + lm.fmt.generation_prompt + lm.fmt.encode(REPLY)


def own_logprobs(model: Any, ids: list[int]) -> list[float]:
    """Each token's log-prob given the ones before it (the first has none), from `model`."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    chosen = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])
    return chosen[:, 0].tolist()


def served_logprobs(url: str, model: str, ids: list[int]) -> list[float]:
    """The same from the weights the server holds: its echo of the prompt's log-probs (the
    OpenAI completions API's echo + logprobs; the first token has none)."""
    import httpx

    body = {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0.0}
    body |= {"echo": True, "logprobs": 0}
    response = httpx.post(url.rstrip("/") + "/completions", json=body, timeout=120)
    response.raise_for_status()
    logprobs = response.json()["choices"][0]["logprobs"]["token_logprobs"]
    assert logprobs[0] is None and None not in logprobs[1 : len(ids)], logprobs[: len(ids)]
    return logprobs[1 : len(ids)]


def served_version(url: str) -> str:
    import httpx

    return httpx.get(url.removesuffix("/v1") + "/weight_info", timeout=10).json()["weight_version"]


def peak_rss_mib() -> float:
    """This process's peak resident memory (VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


# --- in the child ---------------------------------------------------------------------------


def _letters():
    """The toy Domain, registered here as tests/training/conftest.py does in pytest's process."""
    from agents.domains import DOMAINS
    from tests.support.training import LetterDomain

    DOMAINS[LetterDomain.name] = f"{LetterDomain.__module__}:{LetterDomain.__name__}"
    return LetterDomain()


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def agent(url: str, base_model: str, out: Path) -> dict:
    """Full fine-tuning, 2 steps, the agent's turns sampled on vLLM: every rollout's weight
    versions, and, as each version is pushed, a fixed conversation's log-probs from the
    trainer's weights then and from the server's."""
    from training.config import parse_config
    from training.rollouts.agent import WeightSyncedAgent
    from training.trainer import loop

    played: list[Any] = []
    speakers: list[Any] = []
    pushed: dict[str, dict[str, list[float]]] = {}
    name = Path(base_model).name

    class RecordingAgent(WeightSyncedAgent):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            speakers.append(self)

        def publish(self, policy, folder, version, ranks=None):
            super().publish(policy, folder, version, ranks)
            ids = scored_ids(policy)
            pushed[version] = {
                "trainer": own_logprobs(policy.model, ids),
                "server": served_logprobs(url, name, ids),
            }

        def respond(self, domain, rollouts):
            super().respond(domain, rollouts)
            played.extend(r for r in rollouts if all(r is not p for p in played))

    loop.WeightSyncedAgent = RecordingAgent
    letters = _letters()
    cfg = parse_config(
        {
            "name": "toy-full",
            "domain": "letters",
            "base_model": base_model,
            "finetune": "full",
            "steps": 2,
            "group_size": 2,
            "batch_tasks": 2,
            "lr": LR,
            "temperature": 1.0,
            "max_new_tokens": 8,
            "max_turns": 2,  # the user asks, the agent answers once
            "simulator": {"max_new_tokens": 4},
            "heldout": [],
            "rollout_endpoint": url,
            "output_dir": str(out / "run"),
            "threads": 1,
        }
    )
    loop.train(cfg, domain=letters, show_progress=False)
    return {
        "backends": [s.backend for s in speakers],
        "versions": [list(r.agent.weight_versions) for r in played],
        "rows": _rows(cfg.run_dir()),
        "pushed": pushed,
        "ids": scored_ids(speakers[0].lm),
    }


def mixed(url: str, base_model: str, out: Path) -> dict:
    """A policy pushed as "mixed-a", a turn sampled; its weights changed and pushed as
    "mixed-b", a turn sampled; then one update on the two turns (which must refuse them).
    The server's log-probs of a fixed conversation after each push, beside the policy's."""
    import torch

    from training.config import parse_config
    from training.rl.policy import Policy
    from training.rl.tokens import Transcript
    from training.rollouts.weight_sync import ServedWeights

    policy = Policy(base_model, finetune="full", lr=LR)
    name = Path(base_model).name
    server = ServedWeights(url, policy, temperature=0.0, max_new_tokens=4)
    ids = scored_ids(policy)
    prompt = policy.fmt.opening(QUESTION) + policy.fmt.generation_prompt
    result: dict[str, Any] = {"ids": ids, "base": own_logprobs(policy.model, ids)}
    try:
        server.push(policy._weights(), "mixed-a")
        result["served_a"] = served_logprobs(url, name, ids)
        (before,) = server.sample([prompt])
        with torch.no_grad():  # other weights: every matrix scaled (the embeddings too, and
            for weight in policy._weights().values():  # with them a tied output head)
                if weight.ndim == 2:
                    weight.mul_(SCALE)
        server.push(policy._weights(), "mixed-b")
        result["served_b"] = served_logprobs(url, name, ids)
        (after,) = server.sample([prompt])
    finally:
        server.close()
    result["changed"] = own_logprobs(policy.model, ids)
    result["versions"] = [before.weight_version, after.weight_version]
    transcripts = []
    for sampled in (before, after):
        transcript = Transcript()
        transcript.prompt(policy.fmt, QUESTION)
        transcript.record(policy.fmt, sampled)
        transcripts.append(transcript)
    cfg = parse_config({"name": "mixed", "domain": "p4g", "base_model": base_model, "heldout": []})
    weights = {n: w.detach().clone() for n, w in policy._weights().items()}
    try:
        policy.learn(transcripts, torch.tensor([1.0, -1.0]), cfg, temperature=1.0, beta=0.0)
    except Exception as error:  # what the test expects: the update refused
        result["refused"] = [type(error).__name__, str(error)]
    result["stepped"] = not all(torch.equal(w, weights[n]) for n, w in policy._weights().items())
    return result


def cotrain(url: str, base_model: str, out: Path) -> dict:
    """regime cotrain, finetune full, the simulator on its own endpoint (this server): the
    weight versions of every simulator turn."""
    from training.config import parse_config
    from training.regimes import regime
    from training.rollouts.simulator import ServedUser
    from training.trainer import loop

    transcripts: list[Any] = []

    class RecordingUser(ServedUser):
        def respond(self, domain, rollouts):
            super().respond(domain, rollouts)
            transcripts.extend(
                r.user for r in rollouts if all(r.user is not t for t in transcripts)
            )

    regime.ServedUser = RecordingUser
    letters = _letters()
    cfg = parse_config(
        {
            "name": "toy-fullsim",
            "domain": "letters",
            "regime": "cotrain",
            "base_model": base_model,
            "finetune": "full",
            "steps": 2,
            "group_size": 2,
            "lr": LR,
            "simulator_lr": LR,
            "simulator_beta": 0.0,
            "simulator_reward": "adversarial",
            "temperature": 1.0,
            "max_new_tokens": 4,
            "max_turns": 2,  # the user asks (on vLLM), the agent answers once (in-process)
            "simulator": {
                "endpoint": url,
                "model": base_model,
                "max_new_tokens": 6,
                "temperature": 1.0,
            },
            "heldout": [],
            "save_every": 2,
            "output_dir": str(out / "run"),
            "threads": 1,
        }
    )
    loop.train(cfg, domain=letters, show_progress=False)
    return {
        "versions": [list(t.weight_versions) for t in transcripts],
        "rows": _rows(cfg.run_dir()),
    }


SCENARIOS = {"agent": agent, "mixed": mixed, "cotrain": cotrain}


def main(argv: list[str]) -> int:
    import torch

    scenario, url, base_model, out = argv
    torch.set_num_threads(1)  # as tests/training/conftest.py: a shared 2-core machine
    result = SCENARIOS[scenario](url, base_model, Path(out))
    result["peak_rss_mib"] = peak_rss_mib()
    (Path(out) / "result.json").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
