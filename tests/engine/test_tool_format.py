"""The JSON tool-call format: prompt block, parser, streaming filter, history rewriting."""

import json

from hypothesis import given
from hypothesis import strategies as st

from agents.llm.tool_format import (
    ToolCallFilter,
    messages_for_json_tools,
    parse_tool_calls,
    render_tool_calls,
    tool_prompt,
)

TOOL = {
    "type": "function",
    "function": {
        "name": "cancel_pending_order",
        "description": "Cancel an order that has not shipped.",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}},
    },
}


def names_and_arguments(calls):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def test_prompt_describes_tools_and_format():
    prompt = tool_prompt([TOOL])
    assert "cancel_pending_order" in prompt and "Cancel an order" in prompt
    assert "<tool_call>" in prompt and "</tool_call>" in prompt and '"arguments"' in prompt


def test_one_valid_call():
    text = 'I will cancel it.\n<tool_call>{"name": "cancel_pending_order", "arguments": {"order_id": "#W1"}}</tool_call>'
    content, calls = parse_tool_calls(text)
    assert content == "I will cancel it."
    assert names_and_arguments(calls) == [("cancel_pending_order", {"order_id": "#W1"})]
    (call,) = calls
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert isinstance(call["function"]["arguments"], str)


def test_several_calls_and_variants():
    text = (
        '<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call> and '
        '<tool_call>```json\n{"name": "b", "parameters": {"y": 2}}\n```</tool_call>'
        '<tool_call>[{"name": "c"}, {"name": "d", "arguments": "{\\"z\\": 3}"}]</tool_call>'
    )
    content, calls = parse_tool_calls(text)
    assert content == "and"
    assert names_and_arguments(calls) == [
        ("a", {"x": 1}),
        ("b", {"y": 2}),
        ("c", {}),
        ("d", {"z": 3}),
    ]
    assert len({call["id"] for call in calls}) == 4


def test_malformed_blocks_stay_as_text():
    broken = '<tool_call>{"name": "a", "arguments": {"x": 1}</tool_call>'  # a brace short
    no_name = '<tool_call>{"arguments": {}}</tool_call>'
    bad_arguments = '<tool_call>{"name": "a", "arguments": [1]}</tool_call>'
    for block in (broken, no_name, bad_arguments):
        content, calls = parse_tool_calls(f"Hello {block} bye")
        assert calls == [] and content == f"Hello {block} bye"


def test_unclosed_block_counts_only_when_its_json_is_whole():
    content, calls = parse_tool_calls('Ok <tool_call>{"name": "a", "arguments": {}}')
    assert content == "Ok" and names_and_arguments(calls) == [("a", {})]
    content, calls = parse_tool_calls('Ok <tool_call>{"name": "a", "argu')
    assert calls == [] and content == 'Ok <tool_call>{"name": "a", "argu'


def test_plain_text_is_untouched_but_stripped():
    assert parse_tool_calls("  a < b and <tool c  ") == ("a < b and <tool c", [])
    assert parse_tool_calls("") == ("", [])


def test_render_round_trips():
    calls = [
        {"id": "1", "type": "function", "function": {"name": "a", "arguments": '{"x": [1, 2]}'}},
        {"id": "2", "type": "function", "function": {"name": "b", "arguments": "{}"}},
    ]
    content, parsed = parse_tool_calls(render_tool_calls(calls))
    assert content == "" and names_and_arguments(parsed) == [("a", {"x": [1, 2]}), ("b", {})]


SAMPLE = (
    '  Checking.  <tool_call>{"name": "a", "arguments": {"x": "<tool_call>"}}</tool_call>\n'
    'then <tool_call>{oops}</tool_call> and <tool_call>{"name": "b", "arguments": {}}</tool_call>  '
)


@given(st.lists(st.integers(min_value=0, max_value=len(SAMPLE)), max_size=12))
def test_stream_filter_matches_the_parser_for_any_split(cuts):
    bounds = [0, *sorted(cuts), len(SAMPLE)]
    parser = ToolCallFilter()
    pieces = [parser.feed(SAMPLE[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)]
    pieces.append(parser.finish())
    content, calls = parse_tool_calls(SAMPLE)
    assert "".join(pieces) == content == "Checking.  \nthen <tool_call>{oops}</tool_call> and"
    assert names_and_arguments(parser.tool_calls) == names_and_arguments(calls)
    assert names_and_arguments(calls) == [("a", {"x": "<tool_call>"}), ("b", {})]


def test_messages_for_json_tools():
    history = [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "Cancel #W1"},
        {
            "role": "assistant",
            "content": "Sure.",
            "tool_calls": [
                {
                    "id": "c",
                    "type": "function",
                    "function": {
                        "name": "cancel_pending_order",
                        "arguments": '{"order_id": "#W1"}',
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c", "content": "done"},
    ]
    rewritten = messages_for_json_tools(history, [TOOL])
    assert rewritten[0]["content"].startswith("Be kind.\n\n# Tools")
    assert "tool_calls" not in rewritten[2]
    content, calls = parse_tool_calls(rewritten[2]["content"])
    assert content == "Sure." and calls[0]["function"]["name"] == "cancel_pending_order"
    assert rewritten[3] == history[3]
    assert history[2]["tool_calls"], "the caller's messages are not modified"
    # no system message: one is added; no tools: nothing is added
    assert messages_for_json_tools(history[1:2], [TOOL])[0]["role"] == "system"
    assert messages_for_json_tools(history[1:2], None) == history[1:2]
