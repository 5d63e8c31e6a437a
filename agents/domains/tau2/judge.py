"""The NL-assertion judge: a model behind an OpenAI-compatible endpoint reads the transcript and
says which assertions the agent met, as tau2-bench's evaluator_nl_assertions does (one request
per conversation, every assertion graded in it, a JSON reply of
{"results": [{"expectedOutcome", "reasoning", "metExpectation"}]}, temperature 0 by default).

The request goes through agents.llm, the one client every model call uses. Domain.score is
synchronous (training and studies call it outside any event loop, or from a worker thread), so
the judge runs its request on a loop of its own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import re
from typing import Any

from agents.llm.client import LLMClient

from ..base import Message, message_text

INSTRUCTIONS = """You grade a customer-service conversation against a list of expected outcomes.
The conversation is between an agent and a customer; tool calls and their results are shown.
Decide for each expected outcome separately whether the agent satisfied it.

Reply with JSON only, in this shape:
{"results": [{"expectedOutcome": "<the expected outcome, copied from the input>",
              "reasoning": "<a short reason>",
              "metExpectation": true or false}]}
with one item per expected outcome, in the order given."""


def transcript(conversation: list[Message]) -> str:
    """One line per message, "role: text", tool calls written out (the judge must see what the
    agent did, not only what it said)."""
    lines = []
    for message in conversation:
        text = message_text(message)
        calls = [
            f"{(c.get('function') or {}).get('name', '')}"
            f"({(c.get('function') or {}).get('arguments', '')})"
            for c in message.get("tool_calls") or []
        ]
        if calls:
            text = (text + " " if text else "") + "[tool calls: " + "; ".join(calls) + "]"
        lines.append(f"{message.get('role', '')}: {text}")
    return "\n".join(lines)


def judge_messages(assertions: list[str], conversation: list[Message]) -> list[dict[str, str]]:
    user = (
        "conversation:\n"
        + transcript(conversation)
        + "\n\nexpectedOutcomes:\n"
        + json.dumps(assertions, ensure_ascii=False)
    )
    return [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": user}]


def read_verdicts(content: str, assertions: list[str]) -> list[bool]:
    """The judge's verdict on each assertion, in the assertions' order. Items are matched by the
    outcome they repeat, else by position when there is one per assertion; a reply that leaves
    any assertion without a boolean verdict is refused (the caller marks the part unjudged)."""
    fenced = re.search(r"```(?:json)?\s*(.*?)```", content, re.DOTALL | re.IGNORECASE)
    text = fenced.group(1) if fenced else content
    start, end = text.find("{"), text.rfind("}")
    try:
        data = json.loads(text[start : end + 1]) if start >= 0 else None
    except json.JSONDecodeError:
        data = None
    results = data.get("results") if isinstance(data, dict) else None
    if not isinstance(results, list) or not all(isinstance(r, dict) for r in results):
        raise ValueError(f"the NL judge's reply is not the results JSON: {content[:200]!r}")
    by_text = {
        " ".join(str(r.get("expectedOutcome", "")).split()).lower(): r.get("metExpectation")
        for r in results
    }
    verdicts: list[Any] = [by_text.get(" ".join(a.split()).lower()) for a in assertions]
    if any(v is None for v in verdicts) and len(results) == len(assertions):
        verdicts = [r.get("metExpectation") for r in results]
    if not all(isinstance(v, bool) for v in verdicts):
        raise ValueError(
            f"the NL judge gave {len(results)} results, not a true/false verdict on each of the"
            f" {len(assertions)} assertions: {content[:200]!r}"
        )
    return verdicts


class LLMJudge:
    """A callable judge (scoring.NLJudge) over `model` served at `endpoint`."""

    def __init__(
        self,
        endpoint: str,
        model: str,
        *,
        api_key: str | None = None,
        provider: str = "auto",
        temperature: float = 0.0,
        max_tokens: int = 2048,
        timeout: float = 120.0,
    ):
        if not endpoint or not model:
            raise ValueError("an NL judge needs an endpoint and a model")
        self.endpoint, self.model = endpoint, model
        self.api_key, self.provider, self.timeout = api_key, provider, timeout
        self.params = {"temperature": temperature, "max_tokens": max_tokens}

    def __repr__(self) -> str:
        return f"LLMJudge({self.model!r} at {self.endpoint})"

    async def ask(self, assertions: list[str], conversation: list[Message]) -> list[bool]:
        async with LLMClient(
            self.endpoint, api_key=self.api_key, provider=self.provider, timeout=self.timeout
        ) as client:
            result = await client.chat(
                self.model, judge_messages(assertions, conversation), **self.params
            )
        return read_verdicts(result.content, assertions)

    def __call__(self, assertions: list[str], conversation: list[Message]) -> list[bool]:
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no loop in this thread: run one
            return asyncio.run(self.ask(assertions, conversation))
        # called from inside a loop (an async caller's sync code): a thread of its own
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, self.ask(assertions, conversation)).result()
