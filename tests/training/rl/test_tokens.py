"""Token bookkeeping: the training sequence is built from the exact sampled ids, and only those
carry mask 1 (the user's turns, tool results and template scaffolding are 0)."""

import pytest
import torch

from agents.llm.tool_format import CLOSE, OPEN
from agents.simulators.spec import SimulatorSpec
from training.rl.policy import LocalModel
from training.rl.tokens import ChatFormat, Transcript
from training.rollouts.agent import LocalAgent, add_agent_reply, agent_messages
from training.rollouts.rollout import Rollout, play
from training.rollouts.simulator import LocalUser


class RecordingModel(LocalModel):
    """The real tiny model, remembering what it sampled for each prompt."""

    def __init__(self, model, tokenizer):
        super().__init__(model, tokenizer)
        self.samples: list[tuple[list[int], list[int]]] = []

    def sample(self, prompts, temperature, max_new_tokens, logits_processor=None, caches=None):
        out = super().sample(prompts, temperature, max_new_tokens, logits_processor, caches)
        self.samples += list(zip(prompts, out, strict=True))
        return out


@pytest.fixture(scope="module")
def recording(tiny_model):
    base = LocalModel.load(tiny_model)
    return RecordingModel(base.model, base.tokenizer)


def policy_runs(transcript: Transcript) -> list[list[int]]:
    runs, current = [], []
    for token, m in zip(transcript.ids, transcript.mask, strict=True):
        if m:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    return runs + ([current] if current else [])


def test_policy_tokens_are_exactly_the_sampled_ids(tiny_model, recording, letters):
    torch.manual_seed(1)
    user = LocalUser(LocalModel.load(tiny_model), SimulatorSpec(max_new_tokens=6))
    recording.samples.clear()
    rollouts = play(
        letters, letters.scenarios("train")[:3], LocalAgent(recording, 1.0, 10), user, max_turns=4
    )
    for r in rollouts:
        # every prompt the agent sampled from is a prefix of its final training sequence
        mine = [(p, s) for p, s in recording.samples if r.agent.ids[: len(p)] == p]
        assert len(mine) == 2  # two agent turns in a 4-message conversation
        assert policy_runs(r.agent) == [s for _, s in mine]
        for prompt, sampled in mine:
            assert r.agent.ids[len(prompt) : len(prompt) + len(sampled)] == sampled
        # the user's words are in the sequence, never as policy tokens
        masked_text = recording.tokenizer.decode(
            [t for t, m in zip(r.agent.ids, r.agent.mask, strict=True) if not m]
        )
        for message in r.conversation:
            if message["role"] == "user":
                assert message["content"] in masked_text


def test_transcript_matches_chat_template_without_drift(recording):
    """Built turn by turn, a conversation's ids equal the template applied to the whole of it."""
    fmt = recording.fmt
    tok = recording.tokenizer
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello there"},
        {"role": "assistant", "content": "Hi! How can I help?"},
        {"role": "user", "content": "Tell me a word."},
        {"role": "assistant", "content": "Elephant."},
    ]
    t = Transcript()
    t.prompt(fmt, messages[:2])
    t.record(fmt, fmt.encode(messages[2]["content"]) + [tok.convert_tokens_to_ids("<|im_end|>")])
    t.prompt(fmt, messages[3:4])
    t.record(fmt, fmt.encode(messages[4]["content"]))  # cut off before its stop token
    expected = tok.apply_chat_template(messages, tokenize=False)
    assert t.ids == fmt.encode(expected)
    assert tok.decode([i for i, m in zip(t.ids, t.mask, strict=True) if m]) == (
        "Hi! How can I help?<|im_end|>Elephant."
    )


def test_tool_call_turn_and_results(recording, tool_letters):
    domain = tool_letters
    scenario = domain.scenarios("train")[0]
    r = Rollout.begin(domain, scenario)
    r.add_user_reply(domain, "Count the letters in 'tree'.")
    agent = LocalAgent(recording, 1.0, 6)
    # the agent's first turn, as if it had sampled a tool call
    fmt = recording.fmt
    r.agent.prompt(fmt, agent_messages(domain, r))
    call = f'{OPEN}{{"name": "count_letters", "arguments": {{"text": "tree"}}}}{CLOSE}'
    sampled = fmt.encode(call) + [recording.stop_ids[0]]
    r.agent.record(fmt, sampled)
    r.agent.consumed = len(r.conversation) + 1
    add_agent_reply(domain, r, recording.decode(sampled))
    assert r.conversation[-1] == {
        "role": "tool",
        "tool_call_id": r.conversation[-2]["tool_calls"][0]["id"],
        "name": "count_letters",
        "content": "7",
    }
    assert r.state["calls"] == 1 and r.next_speaker(domain) == "agent"
    agent.respond(domain, [r])  # the agent's next turn sees the tool result
    runs = policy_runs(r.agent)
    assert runs[0] == sampled and len(runs) == 2
    masked = fmt.tokenizer.decode(
        [t for t, m in zip(r.agent.ids, r.agent.mask, strict=True) if not m]
    )
    assert "<|im_start|>tool\n7<|im_end|>" in masked
    assert "count_letters" in masked  # the tool schema in the system prompt


def test_chat_format_pieces(recording):
    fmt = ChatFormat(recording.tokenizer)
    im_end = recording.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert recording.tokenizer.decode(fmt.generation_prompt) == "<|im_start|>assistant\n"
    assert fmt.turn_end[0] == im_end
    assert fmt.close_turn([5, im_end]) == fmt.turn_end[1:]  # the stop token was sampled
    assert fmt.close_turn([5, 6]) == fmt.turn_end  # cut at max_new_tokens
