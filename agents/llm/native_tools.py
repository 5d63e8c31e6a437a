"""Native tool calls: models whose chat template renders `tools` itself (Qwen3's, in the Hermes
style) are prompted, trained and served in that template's own format, not agents.llm's JSON one.

What a Hermes-style template does (Qwen3's public template): the system turn lists the tools as
JSON inside `<tools></tools>` under `# Tools`; an assistant turn's structured `tool_calls` become

    <tool_call>
    {"name": "get_order_details", "arguments": {"order_id": "#W123"}}
    </tool_call>

blocks after its content; tool results (role `tool`) are `<tool_response>` blocks inside a user
turn. vLLM reads such replies with `--tool-call-parser hermes`; `parse_hermes_tool_calls` and
`HermesCallFilter` read them by that parser's rule (below), so a call counts in training exactly
when it would count served.

The rule, after vLLM's Hermes2ProToolParser.extract_tool_calls (vllm-project/vllm,
vllm/entrypoints/openai/tool_parsers/hermes_tool_parser.py at 00854322d230): a reply without
`<tool_call>` is content only; otherwise every `<tool_call>...</tool_call>` block (the last may
be left unclosed) must be a JSON object with `name` and `arguments`, and the content is the text
before the first block; if any block fails, there are no calls and the whole reply is content.
(vLLM keeps the content's surrounding whitespace; here it is stripped, as the JSON format's
parser does, so a call re-rendered by the template gives back the sampled text.)
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

from agents.llm.tool_format import CLOSE, OPEN, partial_suffix

# How a trained agent writes tool calls, the one declaration (training's RunConfig.tool_format
# and its help read it): what a run trains and what its checkpoints are served with. (A request's
# format, agents.llm.client.TOOL_FORMATS, is the arm's: "native" there serves "native" here.)
TRAINED_TOOL_FORMATS = {
    "auto": "native when the chat template renders tools (Qwen3), else json (SmolLM2)",
    "json": "agents.llm's JSON <tool_call> blocks, described in the system prompt",
    "native": "the chat template's own tool format (Hermes style: vLLM --tool-call-parser hermes)",
}
HERMES = "hermes"  # the vLLM tool-call parser of Hermes-style templates, the one parley reads

_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "parley_probe_tool",
        "description": "A stand-in tool: does the template render tools?",
        "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
    },
}
_PROBE = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
_BLOCKS = re.compile(
    re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE) + "|" + re.escape(OPEN) + "(.*)", re.S
)


def template_tool_style(tokenizer: Any) -> str | None:
    """How `tokenizer`'s chat template writes tools: HERMES (it renders them, with `<tool_call>`
    markup), "other" (it renders them some other way, which parley does not parse), or None (it
    ignores them, as SmolLM2's does). Found by rendering a probe conversation with one tool."""
    render = tokenizer.apply_chat_template
    with_tools = render(_PROBE, tools=[_PROBE_TOOL], tokenize=False)
    if _PROBE_TOOL["function"]["name"] not in with_tools:
        return None
    return HERMES if OPEN in with_tools else "other"


def model_tool_style(model_dir: Path | str, chat_template: Path | str | None = None) -> str | None:
    """template_tool_style of a model folder's tokenizer (`chat_template`: a template, or its
    file, that replaces the folder's, as vLLM's --chat-template does). None for a folder with no
    tokenizer."""
    folder = Path(model_dir)
    if not (folder / "tokenizer_config.json").is_file():
        return None
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    if chat_template:  # a file, or the template itself (vLLM's --chat-template takes both)
        path = Path(chat_template)
        tokenizer.chat_template = path.read_text() if path.is_file() else str(chat_template)
    if not tokenizer.chat_template:
        return None
    return template_tool_style(tokenizer)


def resolve_tool_format(tool_format: str, style: str | None) -> str:
    """The format a model is trained and served in ("json" or "native"), from the chosen one
    (TRAINED_TOOL_FORMATS) and its template's style; ValueError for "native" the template cannot do."""
    if tool_format not in TRAINED_TOOL_FORMATS:
        raise ValueError(
            f"tool_format must be one of {', '.join(TRAINED_TOOL_FORMATS)}: {tool_format!r}"
        )
    if tool_format == "auto":
        return "native" if style == HERMES else "json"
    if tool_format == "native" and style != HERMES:
        why = "ignores tools" if style is None else "writes tools in a style other than Hermes"
        raise ValueError(
            f'tool_format "native": this chat template {why}; parley reads native tool calls '
            'in the Hermes style only (Qwen3\'s). Use "json" (or "auto")'
        )
    return tool_format


def template_messages(messages: list[dict]) -> list[dict]:
    """A conversation as a native template takes it: structured tool_calls and tool messages as
    they are (the template renders both); only `content` None becomes ""."""
    return [{**m, "content": m.get("content") or ""} for m in messages]


def parse_hermes_tool_calls(text: str) -> tuple[str, list[dict]]:
    """A reply split into (content, OpenAI-shaped tool_calls) by the Hermes rule (module doc)."""
    parser = HermesCallFilter()
    content = parser.feed(text) + parser.finish()
    return content, parser.tool_calls


class HermesCallFilter:
    """The Hermes rule on a stream: text before the first `<tool_call>` is content as it comes
    (a possible start of the tag and trailing whitespace are held back); from the tag on, all is
    held until `finish`, which reads it as calls or, if it fails, releases it as content. The
    pieces concatenate to parse_hermes_tool_calls' content. (The same interface as
    agents.llm.tool_format.ToolCallFilter.)"""

    def __init__(self):
        self.tool_calls: list[dict] = []
        self._held = ""  # from the first tag on, or a possible start of it
        self._inside = False
        self._space = ""  # trailing whitespace of the content so far
        self._started = False

    def feed(self, text: str) -> str:
        if self._inside:
            self._held += text
            return ""
        text = self._held + text
        start = text.find(OPEN)
        if start >= 0:
            self._held, self._inside = text[start:], True
            return self._content(text[:start])
        keep = partial_suffix(text, OPEN)
        self._held = text[len(text) - keep :]
        return self._content(text[: len(text) - keep])

    def finish(self) -> str:
        held, self._held = self._held, ""
        if self._inside:
            calls = _hermes_calls(held)
            if calls is not None:
                self.tool_calls = calls
                return ""
            return self._content(held)  # a block that fails: the whole reply is content
        return self._content(held)

    def _content(self, text: str) -> str:
        text = self._space + text
        if not self._started:
            text = text.lstrip()
        out = text.rstrip()
        self._space = text[len(out) :]
        self._started = self._started or bool(out)
        return out


def _hermes_calls(text: str) -> list[dict] | None:
    calls = []
    for closed, unclosed in _BLOCKS.findall(text):
        try:
            payload = json.loads(closed or unclosed)
            name, arguments = payload["name"], payload["arguments"]
        except (ValueError, KeyError, TypeError):
            return None
        if not isinstance(name, str):
            return None
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
            }
        )
    return calls or None
