"""Helpers for CooperBench tests: scripted speakers whose replies are tool calls in the JSON
text format, the gold patches of parley's bundled task as agents' steps, and the skip rule for
machines without bubblewrap (never under CI)."""

import json
import os
import shutil

import pytest

from agents.domains.cooperbench.domain import BUNDLED
from agents.domains.cooperbench.task import read_task
from agents.llm.tool_format import CLOSE, OPEN
from agents.sandbox import Limits
from training.rollouts.agent import add_agent_reply

needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None and not os.environ.get("PARLEY_CI"),
    reason="bubblewrap is not installed",
)
TASK = read_task(BUNDLED / "tinycalc_task" / "task1")
LIMITS = Limits(cpu_seconds=30, memory_bytes=2 * 1024**3, wall_seconds=30, output_bytes=200_000)


def call(name, **arguments):
    return f"{OPEN}{json.dumps({'name': name, 'arguments': arguments})}{CLOSE}"


def apply_gold(feature):
    """A step that applies a feature's gold patch with git, as an agent could in bash."""
    patch = TASK.features[feature].gold_patch
    return "Applying my change.\n" + call("bash", command=f"git apply <<'PATCH'\n{patch}PATCH")


class Scripted:
    """A speaker whose replies are fixed texts, one per step, through the rollout's own paths
    (the agent's add_agent_reply, the user's add_user_reply), so tool calls run in the Domain."""

    def __init__(self, role, steps):
        self.role, self.steps = role, list(steps)

    def respond(self, domain, rollouts):
        for r in rollouts:
            text = self.steps.pop(0) if self.steps else "Nothing more to do."
            if self.role == "agent":
                add_agent_reply(domain, r, text)
            else:
                r.add_user_reply(domain, text)


def scenario(domain, first, second):
    (found,) = [s for s in domain.scenarios() if s.payload["features"] == [first, second]]
    return found
