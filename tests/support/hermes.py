"""The Qwen3-style (Hermes) chat template the native tool-format tests put on SmolLM2's
tokenizer, with one retail tool and one call written as that template writes it."""

from pathlib import Path

HERMES_TEMPLATE = Path(__file__).parent.parent / "fixtures" / "hermes_chat_template.jinja"
TOOL = {
    "type": "function",
    "function": {
        "name": "find_user_id_by_email",
        "description": "Find a user id by email.",
        "parameters": {
            "type": "object",
            "properties": {"email": {"type": "string"}},
            "required": ["email"],
        },
    },
}
CALL = (
    '<tool_call>\n{"name": "find_user_id_by_email", "arguments": {"email": "a@b.c"}}\n</tool_call>'
)
