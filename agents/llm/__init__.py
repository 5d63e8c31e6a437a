"""Every model call in parley goes through here: one async OpenAI-compatible client.

See agents.llm.client for timeouts, retries and timing, agents.llm.tool_format for the JSON
tool-call format used with models that have no native tool calling, agents.llm.native_tools
for the Hermes-style format of those that have (Qwen3), and agents.llm.providers for how each
hosted API's requests are shaped (declared once).
"""

from agents.llm.client import ChatResult, ChatStream, CompletionResult, LLMClient, shared_client
from agents.llm.errors import LLMConnectionError, LLMError, LLMHTTPError, LLMTimeout
from agents.llm.tool_format import parse_tool_calls, render_tool_calls, tool_prompt

__all__ = [
    "ChatResult",
    "ChatStream",
    "CompletionResult",
    "LLMClient",
    "LLMConnectionError",
    "LLMError",
    "LLMHTTPError",
    "LLMTimeout",
    "parse_tool_calls",
    "render_tool_calls",
    "shared_client",
    "tool_prompt",
]
