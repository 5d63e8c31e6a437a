"""A tiny randomly initialised Llama with the SmolLM2 tokenizer, and a verifiable toy Domain.

The toy Domain ("letters") rewards the agent for the share of the letter "e" among the letters
of its replies: a random model already scores above 0 with spread inside a group, so GRPO has a
signal from the first step, and a short run must raise it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agents.domains.base import Domain, Message, Outcome, Scenario
from training.tools.tiny import build_tiny_model


@pytest.fixture(scope="session")
def tiny_model(base_model, tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"), Path(base_model))


@pytest.fixture(scope="session")
def other_tiny_model(base_model, tmp_path_factory) -> Path:
    """Another tiny model (other weights): a held-out user that shares none with the trained."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-other"), Path(base_model), seed=1)


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


@pytest.fixture(autouse=True)
def letters_registered(monkeypatch):
    """The toy Domain in the registry, so a config naming it passes the domain check."""
    from agents.domains import DOMAINS

    monkeypatch.setitem(DOMAINS, LetterDomain.name, f"{__name__}:{LetterDomain.__name__}")


@pytest.fixture
def letters() -> LetterDomain:
    return LetterDomain()


@pytest.fixture
def tool_letters() -> LetterDomain:
    return LetterDomain(tools=True)


@pytest.fixture(autouse=True)
def one_torch_thread():
    """One thread: OpenMP's spinning threads make a shared 2-core machine several times slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
