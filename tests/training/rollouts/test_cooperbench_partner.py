"""CooperBench's partner as each simulator supply: a frozen model on an endpoint (plain and
Verbalized Sampling) and a co-trained model in this process (plain and Verbalized). Whatever
plays it, the partner's tool calls run in its own sandbox, are recorded in the rollout as tau2's
user calls are (a user message with tool_calls, `tool` results with requestor "user"), and a
trained partner's transcript holds its sampled calls (trained on) and its results (not).

The model's output is scripted here (a scripted OpenAI-compatible server; a real tiny model
whose sampled ids are given), because what is tested is the code around it: which text the
partner's model writes cannot be controlled."""

import json

import pytest

from agents.domains.cooperbench import CooperBenchDomain
from agents.simulators.spec import SimulatorSpec
from tests.support.cooperbench import LIMITS, Scripted, apply_gold, call, needs_bwrap, scenario
from tests.support.scripted_server import ScriptedServer
from training.rl.policy import LocalModel
from training.rollouts.rollout import play
from training.rollouts.simulator import EndpointUser, LocalUser

PARTNER = [apply_gold(2), call("send_message", content="shout is in."), call("submit")]


class ForcedModel(LocalModel):
    """A real model and tokenizer whose samples are given texts (as if it had sampled them),
    each ended by its stop token; the prompts it was asked are kept."""

    frozen = False

    def __init__(self, base: LocalModel, texts: list[str]):
        super().__init__(base.model, base.tokenizer)
        self.texts, self.prompts = list(texts), []

    def sample(self, prompts, temperature, max_new_tokens, logits_processor=None, caches=None):
        self.prompts += prompts
        return [self.fmt.encode(self.texts.pop(0)) + [self.turn_stop] for _ in prompts]


def verbalized(text: str, k: int = 2) -> str:
    """A Verbalized Sampling reply whose k candidates are all `text` (the draw cannot differ)."""
    return json.dumps({"responses": [{"text": text, "probability": 1 / k}] * k})


@pytest.fixture
def domain(tmp_path):
    return CooperBenchDomain(cache_dir=tmp_path, limits=LIMITS)


def run(domain, partner):
    agent = Scripted("agent", [apply_gold(1), call("submit")])
    (r,) = play(domain, [scenario(domain, 1, 2)], agent, partner, max_turns=40)
    return r


def assert_partner_recorded(domain, r):
    assert r.reward == 1.0 and r.outcome.details["submitted"]["user"]
    steps = [m for m in r.conversation if m["role"] == "user"]
    names = [c["function"]["name"] for m in steps for c in m.get("tool_calls", [])]
    assert names == ["bash", "send_message", "submit"]
    results = [m for m in r.conversation if m.get("requestor") == "user"]
    assert [m["name"] for m in results] == names
    assert "[Message from agent2]: shout is in." in json.dumps(domain.agent_view(r.conversation))


@needs_bwrap
@pytest.mark.parametrize("kind", ["plain", "verbalized"])
def test_a_frozen_partner_on_an_endpoint_codes_in_its_sandbox(domain, kind):
    texts = PARTNER if kind == "plain" else [verbalized(t) for t in PARTNER]
    with ScriptedServer([{"content": t} for t in texts]) as server:
        spec = SimulatorSpec(name="partner", endpoint=server.url, model="m", kind=kind, k=2)
        partner = EndpointUser(spec)
        try:
            r = run(domain, partner)
        finally:
            partner.close()
    assert_partner_recorded(domain, r)
    first, second = server.requests[0]["messages"], server.requests[1]["messages"]
    assert "# Tools" in first[0]["content"] and '"name": "edit_file"' in first[0]["content"]
    # its next request holds its own step with the call written out, then the call's result
    assert second[-2]["role"] == "assistant" and "<tool_call>" in second[-2]["content"]
    assert second[-1]["content"].startswith("[Tool result: bash]")


@needs_bwrap
def test_a_co_trained_partner_in_process_trains_on_its_calls_not_their_results(domain, tiny_model):
    lm = ForcedModel(LocalModel.load(tiny_model), PARTNER)
    partner = LocalUser(lm, SimulatorSpec(), tracked=True)
    r = run(domain, partner)
    assert_partner_recorded(domain, r)
    mask = list(zip(r.user.ids, r.user.mask, strict=True))
    sampled = lm.tokenizer.decode([t for t, m in mask if m])
    context = lm.tokenizer.decode([t for t, m in mask if not m])
    assert sampled.count("<tool_call>") == 3  # its own three calls, trained on
    assert "[Tool result: bash]" in context and "[Tool result" not in sampled
    assert "# Tools" in context  # its system prompt describes its tools


@needs_bwrap
def test_a_frozen_verbalized_partner_in_process_reads_its_results(domain, tiny_model):
    lm = ForcedModel(LocalModel.load(tiny_model), [verbalized(t) for t in PARTNER])
    r = run(domain, LocalUser(lm, SimulatorSpec(kind="verbalized", k=2)))
    assert_partner_recorded(domain, r)
    assert r.fallbacks == 0  # each reply was read as its k candidates
    later = lm.tokenizer.decode(lm.prompts[1])
    assert "[Tool result: bash]" in later and "# Tools" in later
