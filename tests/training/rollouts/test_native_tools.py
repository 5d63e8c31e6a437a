"""The native tool format (RunConfig.tool_format): a model whose chat template renders tools
(Qwen3's Hermes style; here SmolLM2's tokenizer with a template modelled on Qwen3's, since no
Qwen3 weights are on this machine) is prompted with the template's own tool block, trains on the
template's own call tokens and has its sampled calls read by vLLM's hermes parser's rule; the
stock SmolLM2 template keeps the JSON format."""

import json
import shutil
from pathlib import Path

import pytest

from agents.domains import get_domain
from agents.llm.native_tools import HermesCallFilter, parse_hermes_tool_calls
from tests.support.hermes import HERMES_TEMPLATE
from training.config import parse_config
from training.config_keys import ConfigError
from training.rl.policy import LocalModel
from training.rollouts.agent import LocalAgent, add_agent_reply, agent_prompt, agent_tool_format
from training.rollouts.rollout import Rollout

EMAIL = "ada.abara154@example.com"  # retail task 0's user, in the bundled data


@pytest.fixture(scope="module")
def hermes_model(tiny_model, tmp_path_factory) -> Path:
    """The tiny model with the Hermes-style template in place of SmolLM2's."""
    folder = tmp_path_factory.mktemp("tiny-hermes") / "model"
    shutil.copytree(tiny_model, folder)
    shutil.copy(HERMES_TEMPLATE, folder / "chat_template.jinja")
    return folder


@pytest.fixture(scope="module")
def hermes_lm(hermes_model) -> LocalModel:
    return LocalModel.load(hermes_model)


@pytest.fixture(scope="module")
def retail():
    return get_domain("retail")


def test_auto_is_native_for_a_template_with_tools_and_json_for_smollm2(tiny_model, hermes_lm):
    stock = LocalModel.load(tiny_model)
    assert agent_tool_format("auto", stock) == "json"
    assert agent_tool_format("auto", hermes_lm) == "native"
    assert agent_tool_format("json", hermes_lm) == "json"  # chosen: the JSON format anyway
    with pytest.raises(ConfigError, match="ignores tools") as refused:
        agent_tool_format("native", stock)
    assert refused.value.key == "tool_format"
    config = {"name": "t", "domain": "retail"}
    assert parse_config(config).tool_format == "auto"
    with pytest.raises(ConfigError) as bad:
        parse_config({**config, "tool_format": "xml"})
    assert bad.value.key == "tool_format"


def template_call(lm: LocalModel, system: str, user: str, call: dict, tools: list) -> str:
    """The template's rendering of an assistant turn holding `call`, as a conversation's earlier
    turn (a thinking template gives the last turn an empty <think> block, which a model would
    sample and be trained on, but which the history drops): what follows the generation
    prompt, up to and including its end-of-turn token."""
    head = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    turn = {"role": "assistant", "content": "", "tool_calls": [call]}
    render = lm.tokenizer.apply_chat_template
    before = render(head, tools=tools, tokenize=False, add_generation_prompt=True)
    after = render([*head, turn, {"role": "user", "content": "Next"}], tools=tools, tokenize=False)
    assert after.startswith(before)
    return after[len(before) :].split("<|im_end|>")[0] + "<|im_end|>"


def test_a_native_call_trains_the_templates_own_tokens_and_runs_a_retail_tool(hermes_lm, retail):
    lm, fmt = hermes_lm, hermes_lm.fmt
    scenario = retail.scenarios("train")[0]
    r = Rollout.begin(retail, scenario)  # the agent's greeting opens it
    r.add_user_reply(retail, f"I want to cancel an order. My email is {EMAIL}.")
    agent_prompt(fmt, retail, r, "native")

    # the agent's turn, as if it had sampled the call exactly as the template writes it
    call = {
        "type": "function",
        "function": {"name": "find_user_id_by_email", "arguments": json.dumps({"email": EMAIL})},
    }
    system = retail.agent_system_prompt(scenario)
    text = template_call(lm, system, r.conversation[-1]["content"], call, r.tools)
    assert text.startswith('<tool_call>\n{"name": "find_user_id_by_email", "arguments": {"email"')
    sampled = fmt.encode(text)
    assert sampled[-1] == fmt.turn_end[0]  # <|im_end|>, the stop token it samples
    r.agent.record(fmt, sampled)
    r.agent.consumed = len(r.conversation) + 1
    add_agent_reply(retail, r, lm.decode(sampled), "native")

    # the sampled block is read as the call, and the retail tool ran against the task's data
    assistant, result = r.conversation[-2:]
    assert assistant["content"] == ""
    (parsed,) = assistant["tool_calls"]
    assert parsed["function"]["name"] == "find_user_id_by_email"
    assert json.loads(parsed["function"]["arguments"]) == {"email": EMAIL}
    assert result["role"] == "tool" and result["tool_call_id"] == parsed["id"]
    assert result["content"] == "ada_abara_9334"  # her user id in the retail database

    LocalAgent(lm, 1.0, 4, "native").respond(retail, [r])  # it answers after the result
    assert r.conversation[-1]["role"] == "assistant"

    # token for token, the transcript up to its last prompt is the template's rendering of the
    # conversation (system prompt with tools, the structured call, the tool result)
    whole = [{"role": "system", "content": system}, *r.conversation[:-1]]
    expected = lm.tokenizer.apply_chat_template(
        whole, tools=r.tools, tokenize=False, add_generation_prompt=True
    )
    expected_ids = fmt.encode(expected)
    assert r.agent.ids[: len(expected_ids)] == expected_ids
    # the call's tokens carry mask 1; the tools, the tool result and the scaffolding 0
    start = next(i for i, m in enumerate(r.agent.mask) if m)
    assert r.agent.ids[start : start + len(sampled)] == sampled
    assert all(r.agent.mask[start : start + len(sampled)])
    masked = lm.tokenizer.decode(
        [t for t, m in zip(r.agent.ids, r.agent.mask, strict=True) if not m]
    )
    assert "# Tools" in masked and '"name": "find_user_id_by_email"' in masked
    assert f"<|im_start|>user\n<tool_response>\n{result['content']}\n</tool_response>" in masked
    assert "<tool_call>" not in masked.split("</tools>")[1].split("<tool_response>")[0]


def test_the_agent_reads_native_replies_as_vllms_hermes_parser_does(retail):
    """A call counts in training exactly when vLLM (--tool-call-parser hermes) would serve it."""
    block = f'<tool_call>\n{{"name": "find_user_id_by_email", "arguments": {{"email": "{EMAIL}"}}}}\n</tool_call>'
    r = Rollout.begin(retail, retail.scenarios("train")[0])
    add_agent_reply(retail, r, f"Checking.\n{block}\nOne moment.", "native")
    assistant, result = r.conversation[-2:]
    assert assistant["content"] == "Checking."  # text after the calls is not content
    assert result["content"] == "ada_abara_9334" and r.tool_rounds == 1
    broken = f'Checking.\n{block}\n<tool_call>{{"name": "calculate"}}</tool_call>'
    r = Rollout.begin(retail, retail.scenarios("train")[0])
    add_agent_reply(retail, r, broken, "native")  # one bad block: no call runs at all
    assert r.conversation[-1] == {"role": "assistant", "content": broken}
    assert r.tool_rounds == 0 and r.next_speaker(retail) == "user"


def test_the_json_format_is_unchanged_for_smollm2(tiny_model, retail):
    lm = LocalModel.load(tiny_model)
    r = Rollout.begin(retail, retail.scenarios("train")[0])
    r.add_user_reply(retail, "Hello")
    text = lm.tokenizer.decode(agent_prompt(lm.fmt, retail, r, agent_tool_format("auto", lm)))
    assert "To call a tool, write one block per call" in text  # agents.llm's JSON tool prompt
    assert "<tools>" not in text


@pytest.mark.parametrize(
    "reply, content, calls",
    [
        ("Just text.", "Just text.", []),
        ('<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>', "", [("f", {"a": 1})]),
        # text before the first block is the content; after the last one it is dropped (vLLM's)
        (
            'Let me look.\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\nDone.',
            "Let me look.",
            [("f", {})],
        ),
        (
            '<tool_call>{"name": "f", "arguments": {}}</tool_call>\n'
            '<tool_call>{"name": "g", "arguments": {"b": "x"}}',
            "",
            [("f", {}), ("g", {"b": "x"})],
        ),
        # any block that fails leaves no calls: the whole reply is content
        (
            'Hi <tool_call>{"name": "f", "arguments": {}}</tool_call><tool_call>{"name": "g"}',
            'Hi <tool_call>{"name": "f", "arguments": {}}</tool_call><tool_call>{"name": "g"}',
            [],
        ),
        ("<tool_call>not json</tool_call>", "<tool_call>not json</tool_call>", []),
    ],
)
def test_replies_are_read_by_the_hermes_rule(reply, content, calls):
    got, parsed = parse_hermes_tool_calls(reply)
    assert got == content
    assert [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed
    ] == calls
    # streamed in pieces of any size, the content pieces join to the same content
    for size in (1, 3, 7):
        stream = HermesCallFilter()
        pieces = [stream.feed(reply[i : i + size]) for i in range(0, len(reply), size)]
        assert "".join(pieces) + stream.finish() == content
        assert len(stream.tool_calls) == len(calls)


@pytest.mark.parametrize("native", [True, False])
def test_a_run_trains_and_records_its_tool_format(
    native, hermes_model, tiny_model, tool_letters, tmp_path
):
    """One step on the toy Domain with a tool: the checkpoint's manifest says how its agent
    calls tools, so a study's arm serves it that way (studies' Arm.clean reads it)."""
    from training.config import parse_config
    from training.trainer.checkpoint import ResumeError
    from training.trainer.loop import train

    model = hermes_model if native else tiny_model
    config = parse_config(
        {
            "name": "tools",
            "domain": "letters",
            "base_model": str(model),
            "steps": 1,
            "group_size": 2,
            "max_new_tokens": 6,
            "max_turns": 2,
            "threads": 1,
            "simulator": {"max_new_tokens": 4},
            "output_dir": str(tmp_path / "run"),
        }
    )
    (saved,) = train(config, lambda progress: None, domain=tool_letters, show_progress=False)
    manifest = json.loads((saved / "manifest.json").read_text())
    assert manifest["tool_format"] == ("native" if native else "json")
    if native:  # a resumed run trains the same format
        other = parse_config({**config.to_dict(), "tool_format": "json", "steps": 2})
        with pytest.raises(ResumeError, match="calls tools in the native format"):
            train(other, lambda progress: None, domain=tool_letters, show_progress=False)
    if not native:  # the stock SmolLM2 template cannot do native calls: refused at the start
        config = parse_config({**config.to_dict(), "tool_format": "native"})
        with pytest.raises(ConfigError, match="ignores tools"):
            train(config, lambda progress: None, domain=tool_letters, show_progress=False)


def test_the_online_dry_run_says_which_tool_format_the_run_trains(
    hermes_model, tiny_model, tmp_path
):
    from training.tools.dryrun import dry_run

    path = tmp_path / "run.toml"
    checks = {}
    for name, model, chosen in (("hermes", hermes_model, "auto"), ("smol", tiny_model, "native")):
        path.write_text(
            f'name = "t"\ndomain = "retail"\nbase_model = "{model}"\ntool_format = "{chosen}"\n'
        )
        checks[name] = next(c for c in dry_run(str(path))["checks"] if c["name"] == "tool format")
    assert checks["hermes"]["ok"] and "auto -> native" in checks["hermes"]["detail"]
    assert "--tool-call-parser hermes" in checks["hermes"]["detail"]
    assert not checks["smol"]["ok"] and "ignores tools" in checks["smol"]["detail"]
