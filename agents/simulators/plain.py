"""The single-simulator baseline: one sampled reply per turn."""

from __future__ import annotations

import json
from typing import Any

from agents.domains.base import Message
from agents.simulators.base import Simulator, UserTurn


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
    text found in it, else None."""
    try:
        value = json.loads(raw).get("reply")
    except (ValueError, AttributeError):
        value = None
    if value in choices:
        return value
    found = [(raw.find(c), c) for c in choices if c in raw]
    return min(found)[1] if found else None


class PlainSimulator(Simulator):
    async def answer(self, messages: list[Message], choices: list[str] | None) -> UserTurn:
        """`choices`: the reply must be one of these texts (asked for with a JSON schema); an
        answer that names none of them is used as it is and flagged `fell_back`."""
        params = dict(self.params)
        if choices:
            params["response_format"] = choice_format(choices)
        result = await self.client.chat(self.model, messages, **params)
        raw = result.content or ""
        if choices:
            text = chosen(raw, choices)
            return UserTurn(text or raw.strip(), raw, usage=[result.usage], fell_back=text is None)
        return UserTurn(text=raw.strip(), raw=raw, usage=[result.usage])
