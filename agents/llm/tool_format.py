"""Tool calls written as JSON in the text, for models without native tool calling (SmolLM2).

The format (the Hermes convention, which vLLM's `hermes` tool parser also reads):

    <tool_call>{"name": "get_order_details", "arguments": {"order_id": "#W123"}}</tool_call>

one block per call, anywhere in the reply; text outside the blocks is the reply's content.
Tool results come back as messages with role `tool`. The caller appends `tool_prompt(tools)` to
the system prompt; `parse_tool_calls(text)` turns a reply into (content, tool_calls) with
tool_calls in the OpenAI shape `[{"id", "type": "function", "function": {"name", "arguments"}}]`
(arguments a JSON string). A block that is not valid JSON with a string `name` (and an object
`arguments`, or `parameters`) is left in the content as text, never dropped.

`ToolCallFilter` does the same on a stream: it holds back text that may be the start of a block,
so streamed pieces never show call JSON, and its pieces concatenate to the parsed content.
`render_tool_calls` writes OpenAI tool_calls back into this format for the next prompt.
"""

import json
import re
import uuid

from agents.messages import content_text

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")


def tool_prompt(tools: list[dict]) -> str:
    """The block appended to the system prompt: the available tools and how to call them."""
    lines = [
        "# Tools",
        "",
        "You may call the following tools. Each is described by a JSON schema:",
        "",
    ]
    for tool in tools:
        lines.append(json.dumps(tool.get("function", tool), ensure_ascii=False))
    lines += [
        "",
        "To call a tool, write one block per call, exactly like this:",
        f'{OPEN}{{"name": "<tool name>", "arguments": {{<arguments as a JSON object>}}}}{CLOSE}',
        "You may write several blocks to call several tools. The results come back in messages "
        "from the `tool` role. When you do not need a tool, answer normally without any block.",
    ]
    return "\n".join(lines)


def render_tool_calls(tool_calls: list[dict]) -> str:
    """OpenAI-shaped tool_calls as the text blocks the model would have written."""
    blocks = []
    for call in tool_calls or []:
        function = call.get("function", call)
        arguments = function.get("arguments") or {}
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                pass  # keep the string as written
        payload = {"name": function.get("name", ""), "arguments": arguments}
        blocks.append(OPEN + json.dumps(payload, ensure_ascii=False) + CLOSE)
    return "\n".join(blocks)


def parse_tool_calls(text: str) -> tuple[str, list[dict]]:
    """Split a reply into its content (blocks removed, stripped) and OpenAI-shaped tool calls."""
    parser = ToolCallFilter()
    content = parser.feed(text) + parser.finish()
    return content, parser.tool_calls


class ToolCallFilter:
    """Streaming split of text into content pieces and tool calls (see module docstring).

    Leading and trailing whitespace of the whole content is dropped (held back until more
    content follows), so the pieces concatenate to exactly what `parse_tool_calls` returns.
    """

    def __init__(self):
        self.tool_calls: list[dict] = []
        self._buffer = ""  # text not yet classified
        self._inside = False  # the buffer starts with an open block
        self._pending_space = ""  # whitespace held until non-space content follows
        self._started = False  # some content has been emitted

    def feed(self, text: str) -> str:
        self._buffer += text
        out = []
        while True:
            if self._inside:
                end = self._buffer.find(CLOSE)
                if end < 0:
                    break
                end += len(CLOSE)
                out.append(self._block(self._buffer[:end]))
                self._buffer, self._inside = self._buffer[end:], False
            else:
                start = self._buffer.find(OPEN)
                if start >= 0:
                    out.append(self._content(self._buffer[:start]))
                    self._buffer, self._inside = self._buffer[start:], True
                    continue
                keep = partial_suffix(self._buffer, OPEN)
                cut = len(self._buffer) - keep
                out.append(self._content(self._buffer[:cut]))
                self._buffer = self._buffer[cut:]
                break
        return "".join(out)

    def finish(self) -> str:
        """Flush at the end of the reply; an unclosed block still counts if its JSON is whole."""
        rest, self._buffer = self._buffer, ""
        piece = self._block(rest) if self._inside else self._content(rest)
        self._inside = False
        return piece

    def _block(self, block: str) -> str:
        body = block[len(OPEN) :]
        if body.endswith(CLOSE):
            body = body[: -len(CLOSE)]
        calls = _calls_from_json(body)
        if calls is None:
            return self._content(block)  # malformed: keep it as text
        self.tool_calls.extend(calls)
        return ""

    def _content(self, text: str) -> str:
        if not text:
            return ""
        text = self._pending_space + text
        if not self._started:
            text = text.lstrip()
        stripped = text.rstrip()
        self._pending_space = text[len(stripped) :]
        if stripped:
            self._started = True
        return stripped


def _calls_from_json(body: str) -> list[dict] | None:
    body = _FENCE.sub("", body.strip())
    try:
        payload = json.loads(body)
    except json.JSONDecodeError:
        return None
    items = payload if isinstance(payload, list) else [payload]
    calls = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            return None
        arguments = item.get("arguments", item.get("parameters", {}))
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                return None
        if not isinstance(arguments, dict):
            return None
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {
                    "name": item["name"],
                    "arguments": json.dumps(arguments, ensure_ascii=False),
                },
            }
        )
    return calls or None


def partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a proper start of `marker`."""
    if marker[0] not in text[-(len(marker) - 1) :]:  # the common case, for every streamed piece
        return 0
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:size]):
            return size
    return 0


def messages_for_json_tools(messages: list[dict], tools: list[dict] | None) -> list[dict]:
    """A conversation rewritten for the JSON format: the tool prompt joins the system message
    and earlier assistant tool_calls become text blocks, so any plain chat engine accepts it."""
    out = []
    for message in messages:
        message = dict(message)
        if message.get("role") == "assistant" and message.get("tool_calls"):
            text = content_text(message.get("content"))
            blocks = render_tool_calls(message.pop("tool_calls"))
            message["content"] = f"{text}\n{blocks}" if text else blocks
        out.append(message)
    if tools:
        block = tool_prompt(tools)
        if out and out[0].get("role") == "system":
            system = content_text(out[0].get("content"))
            out[0] = {**out[0], "content": f"{system}\n\n{block}" if system else block}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


# Constraints: the one schema of this format, for the engines' structured outputs -------------


def tool_call_schema(tools: list[dict]) -> dict:
    """The JSON schema of one call's JSON (between the tags): a tool's name and arguments that
    match that tool's parameter schema. The one builder of it: the embedded engine's
    tool_choice and the `structured` tool format (vLLM's structured outputs) both use it."""
    calls = []
    for tool in tools:
        function = tool.get("function", tool)
        parameters = function.get("parameters") or {"type": "object", "properties": {}}
        calls.append(
            {
                "type": "object",
                "properties": {"name": {"const": function["name"]}, "arguments": parameters},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    if not calls:
        raise ValueError("a tool-call schema needs at least one tool")
    return calls[0] if len(calls) == 1 else {"anyOf": calls}


def tool_call_format(
    tools: list[dict], tool_choice: str | dict = "auto", parallel: bool = True
) -> dict:
    """The structural tag (xgrammar's format, which vLLM takes as `response_format`
    {"type": "structural_tag", "format": ...}) that keeps this format's calls well formed:

    - "auto": any text, but once the model writes `<tool_call>` the block must be a valid call
      of one of `tools`, closed by `</tool_call>`;
    - "required", or {"type": "function", "function": {"name": ...}}: only call blocks (that
      function's for a named choice), at least one; just one when not `parallel`.
    """
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name")
        tools = [t for t in tools if t.get("function", t).get("name") == name]
        if not tools:
            raise ValueError(f"tool_choice names {name!r}, which is not one of the tools")
        parallel = False  # a named choice is one call of that function, as OpenAI's
    elif tool_choice not in ("auto", "required"):
        raise ValueError(
            f"tool_choice must be 'auto', 'required' or a named function: {tool_choice!r}"
        )
    tag = {
        "type": "tag",
        "begin": OPEN,
        # at most one space between tokens, as the prompt's example writes it: a small model
        # otherwise spends its budget on indentation and is cut off mid-call
        "content": {
            "type": "json_schema",
            "json_schema": tool_call_schema(tools),
            "max_whitespace_cnt": 1,
        },
        "end": CLOSE,
    }
    if tool_choice == "auto":
        return {"type": "triggered_tags", "triggers": [OPEN], "tags": [tag]}
    return {
        "type": "tags_with_separator",
        "tags": [tag],
        "separator": "\n",
        "at_least_one": True,
        "stop_after_first": not parallel,
    }


def tool_call_response_format(
    tools: list[dict], tool_choice: str | dict = "auto", parallel: bool = True
) -> dict:
    """`tool_call_format` as the request's `response_format` (vLLM and the embedded engine)."""
    return {"type": "structural_tag", "format": tool_call_format(tools, tool_choice, parallel)}
