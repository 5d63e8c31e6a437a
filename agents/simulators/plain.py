"""The single-simulator baseline: one sampled reply per turn."""

from __future__ import annotations

import json
from typing import Any

from agents.domains.base import Message
from agents.simulators.base import (
    Simulator,
    UserTurn,
    choice_instruction,
    find_choice,
    match_choice,
    with_instruction,
)


def choice_format(choices: list[str]) -> dict[str, Any]:
    """The OpenAI `response_format` for a choice turn: {"reply": one of the allowed texts}."""
    schema = {
        "type": "object",
        "properties": {"reply": {"type": "string", "enum": list(choices)}},
        "required": ["reply"],
        "additionalProperties": False,
    }
    return {
        "type": "json_schema",
        "json_schema": {"name": "reply", "strict": True, "schema": schema},
    }


def chosen(raw: str, choices: list[str]) -> str | None:
    """The allowed text a choice-turn answer gives: its JSON "reply", else the first allowed
    text found in it (up to case, spacing and number spelling), else None."""
    try:
        value = json.loads(raw).get("reply")
    except (ValueError, AttributeError):
        value = None
    if isinstance(value, str) and match_choice(value, choices):
        return match_choice(value, choices)
    return find_choice(raw, choices)


class PlainSimulator(Simulator):
    def __init__(self, client: Any, model: str, retries: int = 2, **params: Any):
        """`retries`: re-asks of a choice turn whose answer is none of the choices."""
        super().__init__(client, model, **params)
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        self.retries = retries

    async def answer(self, messages: list[Message], choices: list[str] | None) -> UserTurn:
        """`choices`: the reply must be one of these texts, asked for with a JSON schema (and in
        words where the provider does not enforce it); an answer naming none of them is asked
        again `retries` times, then the last is used as it is and flagged `fell_back`."""
        params = dict(self.params)
        if not choices:
            result = await self.client.chat(self.model, messages, **params)
            raw = result.content or ""
            return UserTurn(text=raw.strip(), raw=raw, usage=[result.usage])
        params["response_format"] = choice_format(choices)
        if not self.enforces_choices():
            messages = with_instruction(messages, choice_instruction(choices))
        usage, errors = [], []
        while True:
            result = await self.client.chat(self.model, messages, **params)
            raw = result.content or ""
            usage.append(result.usage)
            text = chosen(raw, choices)
            if text is not None:
                return UserTurn(text, raw, attempts=len(usage), errors=errors, usage=usage)
            errors.append(f"not one of the allowed texts: {raw[:80]!r}")
            if len(usage) > self.retries:
                return UserTurn(
                    raw.strip(),
                    raw,
                    attempts=len(usage),
                    fell_back=True,
                    errors=errors,
                    usage=usage,
                )
