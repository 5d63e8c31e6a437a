"""OpenAI-style chat messages, the one format every part of parley speaks.

  {"role": "assistant", "content": str | None, "tool_calls": [...]}
  {"role": "tool", "tool_call_id": str, "name": str, "content": str}
  {"role": "user" | "system", "content": str | [{"type": "text", "text": str}, ...]}

One helper reads a message's text and one counts turns, so the Domains, the client's tool
format and the simulators agree on both.
"""

from __future__ import annotations

from typing import Any

Message = dict[str, Any]


def message_text(message: Message) -> str:
    """A message's text: `content` as a string, None, or OpenAI content parts (concatenated,
    as the OpenAI API joins them)."""
    return content_text(message.get("content"))


def content_text(content: Any) -> str:
    """The text of a `content` value (a string, None or a list of content parts)."""
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content if isinstance(content, str) else ""


def count_turns(conversation: list[Message]) -> int:
    """Messages of the user and the agent with visible text (tool traffic is not a turn)."""
    return sum(1 for m in conversation if m["role"] in ("user", "assistant") and message_text(m))


# Sent when the user speaks first, since chat templates expect a user turn to answer.
OPENING = "(The chat has started. Write your first message.)"


def user_view(conversation: list[Message]) -> list[Message]:
    """The conversation from the user's side: roles flipped, tool traffic dropped, and
    consecutive messages of one speaker merged (some chat templates require alternation)."""
    flipped: list[Message] = []
    for message in conversation:
        role, content = message.get("role"), message.get("content")
        if role not in ("user", "assistant") or not isinstance(content, str) or not content.strip():
            continue  # tool results and tool-call-only agent turns are invisible to the user
        role = "assistant" if role == "user" else "user"
        if flipped and flipped[-1]["role"] == role:
            flipped[-1] = {"role": role, "content": flipped[-1]["content"] + "\n\n" + content}
        else:
            flipped.append({"role": role, "content": content})
    return flipped or [{"role": "user", "content": OPENING}]
