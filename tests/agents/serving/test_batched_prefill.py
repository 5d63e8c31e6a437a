"""Arrivals are prefilled together into the engine's preallocated KV cache: a batch of prompts
of different lengths decodes greedily to the tokens each gives alone, a burst bigger than one
prefill pass is spread over several with decoding steps between them, and replies are
decoded incrementally to the text of a whole decode."""

import threading

import pytest
import torch

from agents.serving.embedded import engine as engine_module
from agents.serving.embedded.decoding import Detokenizer
from agents.serving.embedded.engine import END, STARTED, Engine, Generation
from agents.serving.embedded.server import batch_threads, decoding_threads
from agents.serving.protocol import ChatCompletionRequest

PROMPTS = [
    "Why?",
    "Name three fruits.",
    "Tell me a short story about a lighthouse keeper, the sea and a storm at night.",
    "Write a friendly note asking a neighbour to water my plants while I am away.",
    "How does a refrigerator keep food cold?",
]


@pytest.fixture(scope="module")
def engine(base_model):
    """No prefix cache: every prompt is prefilled whole, alone or in a batch."""
    engine = Engine(base_model, max_batch=8, prefix_cache=0)
    yield engine
    engine.close()


def greedy(engine: Engine, content: str, max_tokens: int) -> Generation:
    request = ChatCompletionRequest(
        model=engine.name,
        messages=[{"role": "user", "content": content}],
        temperature=0,
        max_tokens=max_tokens,
    )
    return engine.prepare(request)


class Reply:
    """A submitted greedy request: its pieces, and when each came relative to the others."""

    log: list = []  # (reply, item), in the order the decoding thread emitted them

    def __init__(self, engine: Engine, content: str, max_tokens: int = 16):
        self.job = greedy(engine, content, max_tokens)
        self.pieces: list[str] = []
        self.ended = threading.Event()
        self.cancel = threading.Event()
        engine.submit(self.job, None, self.emit, self.cancel)

    def emit(self, item):
        Reply.log.append((self, item))
        if isinstance(item, str):
            self.pieces.append(item)
        if item is END or isinstance(item, BaseException):
            self.ended.set()

    @property
    def text(self) -> str:
        assert self.ended.wait(120)
        return "".join(self.pieces)


def prefill_passes(engine, monkeypatch) -> list[int]:
    """The number of prompts in each prefill pass from now on."""
    passes = []
    prefill = engine._prefill
    monkeypatch.setattr(
        engine,
        "_prefill",
        lambda arrived, first: passes.append(len(arrived)) or prefill(arrived, first),
    )
    return passes


@pytest.mark.model
def test_a_batch_of_different_length_prompts_decodes_as_each_alone(engine, monkeypatch):
    alone = [Reply(engine, prompt).text for prompt in PROMPTS]
    passes = prefill_passes(engine, monkeypatch)
    with engine._wake:  # all queued before the decoding thread looks: one prefill pass
        together = [Reply(engine, prompt) for prompt in PROMPTS]
    assert [reply.text for reply in together] == alone
    assert passes == [len(PROMPTS)]


@pytest.mark.model
def test_a_running_reply_streams_while_a_burst_is_prefilled_in_passes(engine, monkeypatch):
    longest = max(len(greedy(engine, prompt, 1).prompt_ids) for prompt in PROMPTS)
    alone = [Reply(engine, prompt).text for prompt in PROMPTS]
    monkeypatch.setattr(engine_module, "PREFILL_TOKENS", 2 * longest)  # two prompts a pass
    running = Reply(engine, "Write a long story about the sea.", max_tokens=200)
    while not running.pieces:
        assert not running.ended.wait(0.05)
    passes = prefill_passes(engine, monkeypatch)
    Reply.log = []
    with engine._wake:
        burst = [Reply(engine, prompt) for prompt in PROMPTS]
    texts = [reply.text for reply in burst]
    running.cancel.set()

    assert texts == alone
    assert len(passes) >= 3 and sum(passes) == len(PROMPTS)
    # the running reply had pieces between the first pass's start and the last one's
    starts = [i for i, (reply, item) in enumerate(Reply.log) if reply in burst and item is STARTED]
    between = Reply.log[starts[0] : starts[-1]]
    assert any(reply is running and isinstance(item, str) for reply, item in between)


@pytest.mark.model
def test_incremental_decoding_gives_the_text_of_a_whole_decode(base_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base_model)
    text = "Voilà: un café ☕ à 3 €, 🌊🌊 and 日本語 — done."
    tokens = tokenizer(text, add_special_tokens=False).input_ids
    detokenizer = Detokenizer(lambda ids: tokenizer.decode(ids, skip_special_tokens=True))
    for i, token in enumerate(tokens, start=1):
        assert detokenizer.add(token) == tokenizer.decode(tokens[:i], skip_special_tokens=True)
    assert detokenizer.committed == text


def test_threads_beyond_the_cores_less_one_are_cut(caplog):
    assert decoding_threads(None, 2) == 1
    assert decoding_threads(None, 16) == 4
    assert decoding_threads(3, 8) == 3
    assert decoding_threads(2, 2) == 1
    assert "--threads 2" in caplog.text
    assert decoding_threads(4, 1) == 1


def test_batch_threads_default_to_the_cores_and_never_exceed_them(caplog):
    assert batch_threads(None, 2) == 2
    assert batch_threads(None, 64) == 8
    assert batch_threads(1, 2) == 1
    assert batch_threads(4, 2) == 2
    assert "--batch-threads 4" in caplog.text


@pytest.mark.model
def test_passes_of_several_rows_run_on_the_batch_threads_and_one_request_on_its_own(
    engine, monkeypatch
):
    seen = []  # (what, rows, torch threads of the decoding thread), as each pass begins
    forward = engine._forward
    monkeypatch.setattr(engine, "batch_threads", engine.threads + 1)
    # as on a quiet machine: every core free (tests/agents/serving/test_cpu_share.py has the rest)
    monkeypatch.setattr(engine.cpu, "free", lambda: float(engine.batch_threads))

    def counted(input_ids, keys, **kwargs):
        what = "prefill" if input_ids.shape[1] > 1 else "step"  # a step is a token a row
        seen.append((what, input_ids.shape[0], torch.get_num_threads()))
        return forward(input_ids, keys, **kwargs)

    monkeypatch.setattr(engine, "_forward", counted)
    assert Reply(engine, PROMPTS[1], max_tokens=4).text
    with engine._wake:  # two at once: one prefill pass, then steps of two rows
        pair = [Reply(engine, prompt, max_tokens=4) for prompt in PROMPTS[:2]]
    assert all(reply.text is not None for reply in pair)

    by_rows = {(what, rows): threads for what, rows, threads in seen}
    assert by_rows[("prefill", 1)] == by_rows[("prefill", 2)] == engine.batch_threads
    assert by_rows[("step", 1)] == engine.threads
    assert by_rows[("step", 2)] == engine.batch_threads
    # each step of one row ran on `threads` (a prefill before it did not leave it on more)
    assert {t for what, rows, t in seen if (what, rows) == ("step", 1)} == {engine.threads}
    # the test's own thread keeps its count: the engine sets its decoding thread's alone
    assert torch.get_num_threads() == engine.threads


@pytest.mark.model
def test_a_burst_gets_its_cache_slots_in_one_allocation(base_model):
    """Slots are not held from the start (tests/agents/serving/test_engine_memory.py), but a
    burst of arrivals allocates all it needs at once, not by doubling pass after pass."""
    engine = Engine(base_model, max_batch=4, prefix_cache=0, idle_release=None)
    try:
        assert engine._cache.slots <= 1
        before = engine._cache.keys[0] if engine._cache.keys else None
        first_layers = []  # the first layer's keys after each reservation of the burst
        reserve = engine._cache.reserve

        def recorded(slots, columns):
            reserve(slots, columns)
            first_layers.append(engine._cache.keys[0])

        engine._cache.reserve = recorded
        with engine._wake:
            burst = [Reply(engine, PROMPTS[i], max_tokens=2) for i in range(engine.max_batch)]
        assert all(reply.text is not None for reply in burst)
        assert engine._cache.slots == engine.max_batch
        allocated = {id(keys) for keys in first_layers if keys is not before}
        assert len(allocated) == 1, f"{len(allocated)} allocations"
    finally:
        engine.close()
