"""The engine's sampling, stop-sequence handling and reply budget, without a server."""

import pytest
import torch

from agents.serving.embedded.decoding import StopText, sample
from agents.serving.embedded.engine import Engine
from agents.serving.protocol import ChatCompletionRequest, EngineError


def test_temperature_zero_is_argmax():
    logits = torch.tensor([0.1, 3.0, 2.9, -1.0])
    assert sample(logits, 0.0, 1.0) == 1


def test_top_p_keeps_the_smallest_nucleus():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    generator = torch.Generator().manual_seed(0)
    drawn = {sample(logits, 1.0, 0.7, generator) for _ in range(300)}
    assert drawn == {0, 1}  # 0.5 + 0.3 reaches 0.7; 2 and 3 are cut
    drawn = {sample(logits, 1.0, 1.0, generator) for _ in range(300)}
    assert drawn == {0, 1, 2, 3}


def test_seeded_sampling_repeats():
    logits = torch.randn(1000)
    first = [sample(logits, 1.0, 0.9, torch.Generator().manual_seed(5)) for _ in range(5)]
    again = [sample(logits, 1.0, 0.9, torch.Generator().manual_seed(5)) for _ in range(5)]
    assert first == again


def grow(stops, steps):
    """Feed growing decoded texts; returns (pieces, stopped)."""
    text_stop = StopText(stops)
    pieces = []
    for text in steps:
        piece, stopped = text_stop.advance(text)
        pieces.append(piece)
        if stopped:
            return pieces, True
    return pieces + [text_stop.flush()], False


def test_stop_sequence_split_across_tokens_is_held_then_cut():
    pieces, stopped = grow(["END"], ["Hello", "Hello E", "Hello EN", "Hello END", "Hello END!"])
    assert stopped and "".join(pieces) == "Hello "
    assert pieces[1] == " "  # "E" is held back: it may start the stop sequence


def test_false_start_of_a_stop_sequence_is_released():
    pieces, stopped = grow(["END"], ["Hello E", "Hello EX"])
    assert not stopped and "".join(pieces) == "Hello EX" and pieces[0] == "Hello "


def test_incomplete_utf8_is_held_back():
    pieces, _ = grow([], ["a\ufffd", "a\u00e9"])
    assert pieces == ["a", "\u00e9", ""]


@pytest.mark.model
def test_a_reply_budget_beyond_the_room_is_cut_to_it(base_model):
    """vLLM's rule: max_tokens up to the model's length is accepted and cut to what the prompt
    leaves; beyond the model's length it is refused."""
    engine = Engine(base_model, max_model_len=64)

    def request(max_tokens):
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        return ChatCompletionRequest(**body, max_tokens=max_tokens)

    job = engine.prepare(request(60))
    assert job.max_new_tokens == 64 - len(job.prompt_ids) < 60
    assert engine.prepare(request(5)).max_new_tokens == 5
    with pytest.raises(EngineError) as info:
        engine.prepare(request(65))
    assert info.value.status == 400 and info.value.response.error.param == "max_tokens"
