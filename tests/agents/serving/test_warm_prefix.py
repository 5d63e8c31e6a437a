"""The opening prompts an engine serves are prefilled before it reports ready (Engine.warm) and
kept for good: the first conversation that begins with one prefills only its own part, whatever
other prompts came between, with the weights it was warmed with only, and the reply is the one
a whole prefill gives (issue 36, point 4: the first tau2 turn on a fresh engine waited 23.8 s)."""

import pytest

from agents.domains import get_domain
from agents.llm import LLMClient
from agents.serving.adapters import find_adapters
from agents.serving.embedded.engine import Engine, _common_length
from agents.serving.protocol import ChatCompletionRequest
from tests.agents.conftest import MANIFEST_NAME

pytestmark = pytest.mark.model

PARTICIPANT = "Hi! I'm not sure I want to give anything today, what is this about?"


@pytest.fixture(scope="module")
def engine(base_model, adapters_root):
    engine = Engine(base_model, adapters_root=adapters_root, max_batch=4, prefix_cache=2)
    yield engine
    engine.close()


def opening(model: str) -> list[dict]:
    """P4G's opening as a study sends it: the persuader's system prompt and its greeting."""
    p4g = get_domain("p4g")
    scenario = p4g.scenarios()[0]
    return [
        {"role": "system", "content": p4g.agent_system_prompt(scenario)},
        {"role": "assistant", "content": p4g.greeting(scenario)},
    ]


def request(model: str, messages: list[dict], max_tokens: int = 16) -> ChatCompletionRequest:
    body = LLMClient().request_body(model, messages, temperature=0, max_tokens=max_tokens)
    return ChatCompletionRequest.model_validate(body)


def first_turn(engine: Engine, model: str, max_tokens: int = 16):
    """The first conversation's first turn: (its job, after the reply, and the reply)."""
    turn = request(model, [*opening(model), {"role": "user", "content": PARTICIPANT}], max_tokens)
    job = engine.prepare(turn)
    reply = engine.generate(job, engine.resolve(model))
    return job, reply


def forget(engine: Engine):
    engine._warm.clear()
    engine._prefixes.clear()


def test_the_first_conversation_prefills_only_its_own_part_after_other_prompts(engine):
    forget(engine)
    warmed = engine.prepare(request(engine.name, opening(engine.name)))
    assert engine.warm([request(engine.name, opening(engine.name))]) == len(warmed.prompt_ids)
    for other in range(engine.prefix_cache + 1):  # more than the recent prompts' cache keeps
        engine.generate(
            engine.prepare(request(engine.name, [{"role": "user", "content": f"{other}?"}], 2))
        )

    job, _ = first_turn(engine, engine.name)
    shared = _common_length(warmed.prompt_ids, job.prompt_ids, len(job.prompt_ids) - 1)
    assert shared > 200 and shared >= len(warmed.prompt_ids) - 3  # all but the reply's header
    assert job.cached_tokens == shared  # prefilled: the participant's message and its framing
    assert len(job.prompt_ids) - job.cached_tokens < 40


def test_a_warmed_prefix_does_not_change_the_reply(engine):
    forget(engine)
    engine.warm([request(engine.name, opening(engine.name))])
    cached, cached_reply = first_turn(engine, engine.name, max_tokens=24)
    forget(engine)
    whole, whole_reply = first_turn(engine, engine.name, max_tokens=24)
    assert cached.cached_tokens > 200 and whole.cached_tokens == 0
    assert cached.completion_tokens == whole.completion_tokens == 24
    assert cached_reply == whole_reply


def test_a_prefix_is_reused_with_the_weights_it_was_warmed_with_only(engine):
    assert MANIFEST_NAME in find_adapters(engine.adapters_root)
    forget(engine)
    engine.warm([request(engine.name, opening(engine.name))])
    on_adapter, _ = first_turn(engine, MANIFEST_NAME, max_tokens=2)
    assert on_adapter.cached_tokens == 0  # the adapter's keys and values are its own

    forget(engine)
    engine.warm([request(MANIFEST_NAME, opening(MANIFEST_NAME))])
    on_adapter, _ = first_turn(engine, MANIFEST_NAME, max_tokens=2)
    on_base, _ = first_turn(engine, engine.name, max_tokens=2)
    assert on_adapter.cached_tokens > 200 and on_base.cached_tokens == 0


def test_warming_keeps_no_more_than_its_budget_and_skips_what_is_not_served(engine):
    forget(engine)
    budget, engine.warm_tokens = engine.warm_tokens, 100
    try:
        kept = engine.warm(
            [
                request("no-such-model", opening(engine.name)),
                request(engine.name, opening(engine.name)),
            ]
        )
    finally:
        engine.warm_tokens = budget
    assert kept == 0 and not engine._warm
