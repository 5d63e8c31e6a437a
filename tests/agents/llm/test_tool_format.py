"""The JSON tool-call format: prompt block, parser, streaming filter, history rewriting."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.llm.tool_format import (
    ToolCallFilter,
    messages_for_json_tools,
    parse_tool_calls,
    render_tool_calls,
    tool_call_format,
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


CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
CALL = '<tool_call>{"name": "cancel_pending_order", "arguments": {"order_id": "#W1"}}</tool_call>'


def accepts(tools, choice, text, parallel=False) -> bool:
    """Whether the grammar of tool_call_format takes `text` as a whole output (xgrammar over
    the real tokenizer, as the engine and vLLM compile it)."""
    import xgrammar
    from transformers import AutoTokenizer

    from agents.serving.prepare import ensure_base_model

    tokenizer = AutoTokenizer.from_pretrained(ensure_base_model())
    compiler = xgrammar.GrammarCompiler(xgrammar.TokenizerInfo.from_huggingface(tokenizer))
    tag = {"type": "structural_tag", "format": tool_call_format(tools, choice, parallel)}
    matcher = xgrammar.GrammarMatcher(compiler.compile_structural_tag(json.dumps(tag)))
    return matcher.accept_string(text) and matcher.is_completed()


def test_auto_format_takes_text_and_well_formed_calls_only():
    tools = [TOOL, CLOCK]
    assert accepts(tools, "auto", "Let me check. " + CALL + " Done.")
    assert accepts(tools, "auto", "Just text, no call.")
    assert not accepts(tools, "auto", CALL.replace("order_id", "id"))  # off its schema
    assert not accepts(tools, "auto", CALL.replace("cancel_pending_order", "drop_order"))
    assert not accepts(tools, "auto", CALL.replace("}}</tool_call>", "}"))  # never closed


def test_forced_formats_take_calls_only():
    tools = [TOOL, CLOCK]
    clock = '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    assert accepts(tools, "required", CALL)
    assert not accepts(tools, "required", "Sure. " + CALL)
    assert not accepts(tools, "required", "")  # at least one call
    assert not accepts(tools, "required", CALL + "\n" + clock)  # one unless parallel
    assert accepts(tools, "required", CALL + "\n" + clock, parallel=True)
    named = {"type": "function", "function": {"name": "get_time"}}
    assert accepts(tools, named, clock) and not accepts(tools, named, CALL)
    with pytest.raises(ValueError, match="drop_order"):
        tool_call_format(tools, {"type": "function", "function": {"name": "drop_order"}})
