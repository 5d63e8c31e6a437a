"""Concurrent requests share the embedded engine's decoding steps: over HTTP they stream side
by side, each with its own adapter and sampling settings, and give what they give alone."""

import asyncio
import json
import shutil
import threading
import time

import httpx
import pytest

from agents.serving.embedded.engine import END, MIN_PREFIX, STARTED, Engine, Generation
from agents.serving.protocol import ChatCompletionRequest

pytestmark = pytest.mark.model

SECOND_NAME = "second-lora"  # different weights from tiny-lora (conftest)


@pytest.fixture(scope="module")
def second_adapter(adapters_root, base_model):
    """A second adapter with other random weights, served by its folder name while this module
    runs (the engine scans its adapters folder on each request)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_pretrained(base_model)
    config = LoraConfig(
        r=4, lora_alpha=32, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    folder = adapters_root / SECOND_NAME
    get_peft_model(model, config).save_pretrained(folder)
    yield SECOND_NAME
    shutil.rmtree(folder)


async def streamed(client: httpx.AsyncClient, url: str, body: dict, hang_up_after=None) -> dict:
    """One streamed completion: its text, finish reason, usage and when each piece arrived."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    pieces, arrivals, finish, usage = [], [], None, None
    async with client.stream("POST", f"{url}/chat/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk["choices"]:
                if choice["delta"].get("content"):
                    pieces.append(choice["delta"]["content"])
                    arrivals.append(time.monotonic())
                    if hang_up_after and len(pieces) >= hang_up_after:
                        return {"text": "".join(pieces), "arrivals": arrivals}
                finish = choice["finish_reason"] or finish
    return {"text": "".join(pieces), "finish": finish, "usage": usage, "arrivals": arrivals}


def body(model: str, content: str, **params) -> dict:
    return {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "temperature": 0,
        "max_tokens": 16,
        **params,
    }


async def alone_then_together(url: str, bodies: list[dict], hang_up: dict | None = None):
    """Each request on its own, then all at once (with `hang_up` joining and leaving early)."""
    async with httpx.AsyncClient(timeout=300) as client:
        alone = [await streamed(client, url, b) for b in bodies]
        extra = [streamed(client, url, hang_up, hang_up_after=2)] if hang_up else []
        together = await asyncio.gather(*(streamed(client, url, b) for b in bodies), *extra)
    return alone, together[: len(bodies)]


def assert_same_replies(alone: list[dict], together: list[dict]):
    for one, other in zip(alone, together, strict=True):
        assert other["text"] == one["text"]
        assert other["finish"] == one["finish"]
        assert other["usage"] == one["usage"]


def assert_streamed_side_by_side(together: list[dict]):
    """Every reply had its first piece before any other reply's last one: they were decoded
    together, not one after the other."""
    first = max(reply["arrivals"][0] for reply in together)
    last = min(reply["arrivals"][-1] for reply in together)
    assert first < last, "the replies were not decoded side by side"


async def test_concurrent_streams_match_their_replies_alone(served):
    """Greedy replies, a seeded sampled one and one cut by a stop sequence, decoded in one
    batch while another request joins and hangs up: each is what it is alone, usage exact."""
    bodies = [
        body(served.base, "Name three fruits."),
        body(served.base, "Why do cats purr?", max_tokens=12),
        body(served.base, "Tell me a short story about a lighthouse keeper.", max_tokens=20),
        body(served.base, "Write a word.", temperature=1.0, top_p=0.9, seed=7),
    ]
    async with httpx.AsyncClient(timeout=300) as client:
        probe = await streamed(client, served.url, bodies[2])
    stop = probe["text"][8:12]  # a sequence the model produces mid-reply
    bodies.append(body(served.base, bodies[2]["messages"][0]["content"], stop=[stop]))
    hang_up = body(served.base, "Write a long story about the sea.", max_tokens=300)

    alone, together = await alone_then_together(served.url, bodies, hang_up)

    assert_same_replies(alone, together)
    assert_streamed_side_by_side(together)
    assert together[1]["usage"]["completion_tokens"] == 12 and together[1]["finish"] == "length"
    assert together[4]["finish"] == "stop"
    assert together[4]["text"] == probe["text"][: probe["text"].index(stop)]
    for reply in together:
        usage = reply["usage"]
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


async def test_two_adapters_and_the_base_model_in_one_batch(served, second_adapter):
    question = "Name three fruits."
    bodies = [body(name, question) for name in (served.base, "tiny-lora", second_adapter)]
    alone, together = await alone_then_together(served.url, bodies)
    assert len({reply["text"] for reply in alone}) == 3, "the adapters do not change the reply"
    assert_same_replies(alone, together)
    assert_streamed_side_by_side(together)


@pytest.fixture(scope="module")
def engine(base_model):
    """The engine in this process, one request at a time, to watch its queue."""
    engine = Engine(base_model, max_batch=1)
    yield engine
    engine.close()


class Watched:
    """A submitted request and what it emitted."""

    def __init__(self, engine: Engine, content: str, max_tokens: int):
        request = ChatCompletionRequest(
            model=engine.name,
            messages=[{"role": "user", "content": content}],
            temperature=0,
            max_tokens=max_tokens,
        )
        self.job: Generation = engine.prepare(request)
        self.items: list = []
        self.first_piece, self.ended = threading.Event(), threading.Event()
        self.cancel = threading.Event()
        engine.submit(self.job, None, self.emit, self.cancel)

    def emit(self, item):
        self.items.append(item)
        if isinstance(item, str):
            self.first_piece.set()
        if item is END or isinstance(item, BaseException):
            self.ended.set()


def test_cancelling_frees_the_slot_and_the_place_in_line(engine):
    running = Watched(engine, "Write a long story about the sea.", max_tokens=300)
    assert running.first_piece.wait(60)
    waiting = Watched(engine, "Why do cats purr?", max_tokens=4)
    given_up = Watched(engine, "Name three fruits.", max_tokens=4)
    time.sleep(0.5)
    assert not waiting.items and not given_up.items  # the only slot is taken

    given_up.cancel.set()  # leaves the line without ever running
    assert given_up.ended.wait(30)
    assert given_up.items == [STARTED, END]
    assert (given_up.job.finish_reason, given_up.job.completion_tokens) == ("abort", 0)
    assert not running.ended.is_set() and not waiting.items

    running.cancel.set()  # leaves the batch: the waiting request takes its slot
    assert running.ended.wait(30) and waiting.ended.wait(60)
    assert running.job.finish_reason == "abort" and running.job.completion_tokens < 300
    assert waiting.items[0] is STARTED and waiting.items[-1] is END
    assert (waiting.job.finish_reason, waiting.job.completion_tokens) == ("length", 4)


def reply(engine: Engine, content: str) -> str:
    watched = Watched(engine, content, max_tokens=12)
    assert watched.ended.wait(60)
    return "".join(item for item in watched.items if isinstance(item, str))


def test_a_prompt_that_begins_like_a_recent_one_prefills_only_the_rest(engine, monkeypatch):
    reused = []  # tokens taken from the prefix cache, per prefill
    reuse = engine._reuse_prefix
    monkeypatch.setattr(
        engine, "_reuse_prefix", lambda *args: reused.append(reuse(*args)) or reused[-1]
    )
    reply(engine, "Name three fruits.")
    shared = reply(engine, "Name three colours.")  # the same system prompt and template start
    engine._prefixes.clear()
    whole = reply(engine, "Name three colours.")
    assert reused[1] >= MIN_PREFIX and reused[2] == 0
    assert shared == whole
