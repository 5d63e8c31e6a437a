"""Helpers shared by training's tests (imported from here, never from a conftest or a test
module): the toy Domain, and running a config in 1 process and launched on 2.

The toy Domain ("letters") rewards the agent for the share of the letter "e" among the letters
of its replies: a random model already scores above 0 with spread inside a group, so GRPO has a
signal from the first step, and a short run must raise it.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import psutil
import pytest
import torch
from safetensors.torch import load_file

from agents.domains.base import Domain, Message, Outcome, Scenario
from tests.support.dying_rank import DIE_AT, with_dying_rank
from tests.support.processes import REPO
from training.config import load_config
from training.rl.distributed import launch_command
from training.trainer import checkpoint
from training.trainer.loop import train


def letter_share(text: str, letter: str = "e") -> float:
    letters = [c for c in text.lower() if c.isalpha()]
    return sum(c == letter for c in letters) / len(letters) if letters else 0.0


class LetterDomain(Domain):
    """Toy verifiable task: reward = share of "e" among the letters the agent wrote. Scenarios with
    `tools` give the agent a `count_letters` tool (to exercise the tool path)."""

    name = "letters"
    max_turns = 4
    max_tool_calls_per_turn = 3

    def __init__(self, tools: bool = False):
        self.with_tools = tools

    def scenarios(self, split: str | None = None) -> list[Scenario]:
        all_ = [
            Scenario(f"{s}-{i}", self.name, {"split": s, "topic": f"topic {i}"})
            for s, n in (("train", 4), ("test", 2))
            for i in range(n)
        ]
        return [s for s in all_ if split is None or s.payload["split"] == split]

    def agent_system_prompt(self, scenario: Scenario) -> str:
        return f"Write words about {scenario.payload['topic']}."

    def tools(self, scenario: Scenario) -> list[dict[str, Any]]:
        if not self.with_tools:
            return []
        return [
            {
                "type": "function",
                "function": {
                    "name": "count_letters",
                    "description": "Count letters in a text.",
                    "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
                },
            }
        ]

    def new_state(self, scenario: Scenario) -> dict:
        return {"calls": 0}

    def execute_tool(self, state: Any, name: str, arguments: dict | str) -> str:
        state["calls"] += 1
        return "7" if name == "count_letters" else f"Error: unknown tool {name!r}"

    def user_instructions(self, scenario: Scenario) -> str:
        return "Ask for words."

    def simulator_system_prompt(self, scenario: Scenario) -> str:
        return f"You want words about {scenario.payload['topic']}."

    def score(
        self, conversation: list[Message], state: Any, end_reason: str | None = None
    ) -> Outcome:
        agent = " ".join(m.get("content") or "" for m in conversation if m["role"] == "assistant")
        share = letter_share(agent)
        return Outcome(reward=share, success=share > 0.2, details={"end_reason": end_reason})


def launch(config_file, out, processes=2, env=None, timeout=600, args=(), die_at=None):
    """Run the launcher; ranks that hang past `timeout` (out of lockstep under FSDP) are killed
    with it, and the test fails. `die_at` ("RANK:STEP"): that rank dies at the end of that step
    (tests/support/dying_rank.py)."""
    command = launch_command(config_file, processes, args=["--output-dir", str(out), *args])
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'platform'}:{REPO}", **(env or {})}
    if die_at:
        command, env[DIE_AT] = with_dying_rank(command), die_at
    with subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            # the ranks run in sessions of their own (torchrun's): kill them by id, then it
            for child in [*psutil.Process(process.pid).children(recursive=True), process]:
                child.kill()
            process.communicate()
            pytest.fail(f"the ranks did not finish within {timeout} s (a hang?)")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def adapter(out, step):
    return load_file(checkpoint.checkpoint_dir(out, step) / "adapter_model.safetensors")


def assert_same(a, b):
    """Equal to float tolerance: Adam divides by sqrt(v), so an element whose gradient is ~0
    moves by rounding noise scaled up to about lr x 1e-3 (weights are ~0.1, lr 1e-2)."""
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-3, atol=1e-4)


def metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def one_and_two(path, tmp_path, timeout=600):
    """The run in this process and launched on 2, each in its own folder: (one, two)."""
    one, two = tmp_path / "one", tmp_path / "two"
    train(load_config(path, {"output_dir": str(one)}), show_progress=False)
    done = launch(path, two, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return one, two
