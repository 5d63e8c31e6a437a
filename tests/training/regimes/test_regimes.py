"""Regimes: who learns, the population pool, and the Verbalized Sampling fallback."""

import json

import pytest
import torch

from agents.simulators.spec import SimulatorSpec
from training.config import parse_config
from training.regimes.choose import make_regime
from training.regimes.pool import SimulatorPool
from training.regimes.regime import ModelCache
from training.rl.grpo import group_advantages, update
from training.rl.logprobs import TokenBatch
from training.rl.policy import LocalModel, Policy
from training.rollouts.agent import LocalAgent
from training.rollouts.rollout import Rollout, play
from training.rollouts.simulator import LocalUser


def config(tiny_model, tmp_path, regime, **extra):
    return parse_config(
        {
            "name": f"t-{regime}",
            "domain": "letters",
            "regime": regime,
            "base_model": str(tiny_model),
            "group_size": 4,
            "lr": 1e-2,
            "simulator_lr": 1e-2,
            "max_new_tokens": 6,
            "max_turns": 4,
            "simulator": {"max_new_tokens": 6},
            "output_dir": str(tmp_path / regime),
            **extra,
        }
    )


def one_step(cfg, regime, agent, domain, step=1):
    """What the trainer does in a step: rollouts, the agent's update, the regime's update."""
    scenarios = [domain.scenarios("train")[0]] * cfg.group_size
    with regime.simulator(step) as user:
        rollouts = play(
            domain, scenarios, LocalAgent(agent, 1.0, cfg.max_new_tokens), user, max_turns=4
        )
    rewards = torch.tensor([r.reward for r in rollouts]).view(1, -1)
    assert rewards.std() > 0  # the step has a learning signal
    batch = TokenBatch.from_lists(
        [r.agent.ids for r in rollouts], [r.agent.mask for r in rollouts], 2
    )
    update(
        agent.model,
        agent.optimizer,
        batch,
        group_advantages(rewards).flatten(),
        eps=0.2,
        eps_high=0.2,
        beta=0.0,
        micro_batch=4,
    )
    return regime.learn(step, rollouts), rollouts


def weights(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def changed(before, model):
    return [n for n, p in model.named_parameters() if not torch.equal(before[n], p.detach())]


def test_single_simulator_stays_frozen(tiny_model, tmp_path, letters):
    torch.manual_seed(0)
    cfg = config(tiny_model, tmp_path, "single")
    regime = make_regime(cfg, cfg.run_dir(), ModelCache(cfg))
    agent = Policy(tiny_model, lr=cfg.lr)
    sim_before, agent_before = weights(regime.user.lm.model), weights(agent.model)
    stats, rollouts = one_step(cfg, regime, agent, letters)
    assert stats == {}
    assert changed(sim_before, regime.user.lm.model) == []
    assert changed(agent_before, agent.model)  # the agent did learn
    assert all(sum(r.user.mask) == 0 for r in rollouts)  # a frozen simulator's tokens are not kept


def test_cotrain_simulator_learns_on_its_own_tokens(tiny_model, tmp_path, letters):
    torch.manual_seed(0)
    cfg = config(tiny_model, tmp_path, "cotrain", simulator_reward="adversarial")
    regime = make_regime(cfg, cfg.run_dir(), ModelCache(cfg))
    agent = Policy(tiny_model, lr=cfg.lr)
    before = weights(regime.policy.model)
    stats, rollouts = one_step(cfg, regime, agent, letters)
    moved = changed(before, regime.policy.model)
    assert moved and all("lora_" in n for n in moved)  # only its adapter, never the base
    assert stats["sim/learned"] == 1.0
    assert stats["sim/tokens"] == sum(sum(r.user.mask) for r in rollouts) > 0
    agent_rewards = torch.tensor([r.reward for r in rollouts])
    assert stats["sim/reward_mean"] == pytest.approx(float((1 - agent_rewards).mean()))


def test_pool_is_fifo_and_survives_restart(tmp_path):
    def save(folder):
        folder.mkdir(parents=True)
        (folder / "adapter_model.safetensors").write_text("x")

    pool = SimulatorPool(tmp_path / "pool", size=3)
    for step in (2, 4, 6, 8):
        pool.add(step, save)
    assert [e.step for e in pool.entries] == [4, 6, 8]
    assert not (tmp_path / "pool" / "sim-step-000002").exists()  # evicted first in, first out
    manifest = json.loads((tmp_path / "pool" / "manifest.json").read_text())
    assert [e["step"] for e in manifest["entries"]] == [4, 6, 8]

    reopened = SimulatorPool(tmp_path / "pool", size=3)
    assert [e.step for e in reopened.entries] == [4, 6, 8]
    reopened.drop_after(6)  # resuming from the step-6 checkpoint
    assert [e.step for e in SimulatorPool(tmp_path / "pool", size=3).entries] == [4, 6]
    assert [e.step for e in SimulatorPool(tmp_path / "pool", size=1).entries] == [6]


def test_verbalized_malformed_output_is_retried_then_falls_back(tiny_model, letters):
    """A random model's 8-token answers are never a whole k = 5 JSON object, even under the
    schema constraint: every reply is asked 1 + retries times, then the raw text is used."""
    torch.manual_seed(0)
    lm = LocalModel.load(tiny_model)
    calls = []
    original = lm.sample

    def counting(prompts, *args, **kwargs):
        calls.append(len(prompts))
        out = original(prompts, *args, **kwargs)
        calls.append([lm.decode(o) for o in out])
        return out

    lm.sample = counting
    spec = SimulatorSpec(kind="verbalized", max_new_tokens=8, retries=2)
    user = LocalUser(lm, spec)
    rollouts = play(
        letters,
        letters.scenarios("train")[:2],
        LocalAgent(LocalModel.load(tiny_model), 1.0, 4),
        user,
        max_turns=2,
    )
    assert calls[0::2] == [2, 2, 2]  # first try and two retries, for both conversations
    for r, raw in zip(rollouts, calls[-1], strict=True):
        assert r.fallbacks == 1
        assert r.conversation[0] == {"role": "user", "content": raw.strip()}
    # xgrammar constrains the output to the schema's JSON: every attempt starts the object
    assert all(text.lstrip().startswith("{") for batch in calls[1::2] for text in batch)


def test_heldout_simulator_on_an_endpoint(tiny_model, engine_url):
    """A frozen simulator served over the OpenAI API (the embedded engine here, vLLM or a hosted
    API in production) plays the user through agents.simulators and agents.llm."""
    import httpx

    from agents.domains import get_domain
    from training.rollouts.simulator import EndpointUser

    served = httpx.get(f"{engine_url}/models", timeout=30).json()["data"][0]["id"]
    spec = SimulatorSpec(
        name="engine",
        endpoint=engine_url,
        model=served,
        max_new_tokens=12,
        persona="You are in a hurry.",
    )
    p4g = get_domain("p4g")
    agent = LocalAgent(LocalModel.load(tiny_model), 1.0, 4)
    (rollout,) = play(p4g, p4g.scenarios("test")[:1], agent, EndpointUser(spec), max_turns=3)
    greeting, user, reply = rollout.conversation
    assert greeting["role"] == "assistant" and reply["role"] == "assistant"
    assert user["role"] == "user" and user["content"].strip()
    assert rollout.outcome is not None and rollout.end_reason == "max_turns"


def test_verbalized_candidates_are_parsed_and_one_is_drawn(tiny_model, letters):
    """Under the schema constraint (compact JSON, bounded texts, probabilities in [0, 1]) even a
    random model's output parses; the user's message is one of its k candidates."""
    from agents.simulators import parse_verbalized

    torch.manual_seed(0)
    lm = LocalModel.load(tiny_model)
    raws = []
    original = lm.sample

    def recording(prompts, *args, **kwargs):
        out = original(prompts, *args, **kwargs)
        raws.extend(lm.decode(o) for o in out)
        return out

    lm.sample = recording
    user = LocalUser(lm, SimulatorSpec(kind="verbalized", max_new_tokens=300, retries=1))
    rollouts = [Rollout.begin(letters, s) for s in letters.scenarios("train")]
    user.respond(letters, rollouts)
    parsed = [r for r in rollouts if not r.fallbacks]
    assert parsed, raws
    candidates = {c.text for raw in raws for c in _maybe_parse(parse_verbalized, raw)}
    assert all(r.conversation[-1]["content"] in candidates for r in parsed)


def _maybe_parse(parse, raw):
    try:
        return parse(raw, 5)
    except ValueError:
        return []
