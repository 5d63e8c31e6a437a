"""An idle embedded engine holds its weights and recent prompts, not what finished requests
needed (issue 36 point 7): KV cache slots are allocated as requests arrive and given back,
with the heap's freed pages, once the engine is idle; the loaded model file is let go."""

import threading
import time

import pytest

from agents.serving.embedded.engine import Engine, Generation


@pytest.fixture(scope="module")
def engine(base_model):
    engine = Engine(base_model, max_batch=16, idle_release=None)  # set by the test that needs it
    yield engine
    engine.close()


def rss_anon_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no RssAnon in /proc/self/status")


def wait_for(condition, timeout=10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def burst(engine: Engine, requests: int):
    prompt = engine.tokenizer("You are a patient guide. " * 40 + "Tell me about tides.").input_ids
    jobs = [
        Generation(prompt_ids=[*prompt, i], max_new_tokens=8, temperature=0.7, seed=i)
        for i in range(requests)
    ]
    runs = [threading.Thread(target=engine.generate, args=(job,)) for job in jobs]
    for run in runs:
        run.start()
    for run in runs:
        run.join(120)


def test_an_engine_starts_without_a_slot_for_every_request_it_could_batch(engine):
    assert engine._cache.slots <= 1  # its warm-up's


def test_the_loaded_model_file_is_not_kept_mapped(engine, base_model):
    with open("/proc/self/maps") as maps:
        mapped = [line for line in maps if str(base_model) in line]
    assert mapped == []


def test_an_idle_engine_gives_its_cache_slots_and_their_memory_back(engine):
    engine.idle_release = 0.5
    burst(engine, 16)
    held = engine._cache.nbytes / 2**20  # before the idle release (0.5 s after the last)
    busy = rss_anon_mb()
    assert held > 20, "the burst had no slots to give back"
    assert wait_for(lambda: engine._cache.nbytes == 0), engine._cache.slots
    time.sleep(0.2)
    assert busy - rss_anon_mb() > held / 2, (busy, rss_anon_mb(), held)
    # and the next request still runs, on a slot allocated for it
    reply = engine.generate(Generation(prompt_ids=[1, 2, 3], max_new_tokens=4, temperature=0))
    assert isinstance(reply, str)
