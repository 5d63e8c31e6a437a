"""The science of the collapse experiment: exact choice turns, the simulator's direction, a panel
that is held out, Verbalized Sampling's draw, the population's draw, and learning in which the
simulator decides what the agent learns."""

import dataclasses
import json
import random
import statistics
from collections import Counter

import pytest
import torch

from agents.domains import get_domain
from agents.domains.episode import USER
from agents.domains.p4g.decision import ASKS
from agents.simulators.scripted import ScriptedPersuadee
from agents.simulators.spec import SimulatorSpec
from training.config import parse_config
from training.config_schema import RunConfig
from training.measures.collapse import variance_split
from training.measures.held_out import HeldOutPanel
from training.regimes.choose import make_regime
from training.regimes.regime import ModelCache
from training.rl.logprobs import TokenBatch, token_logprobs
from training.rl.policy import LocalModel, Policy
from training.rollouts.agent import LocalAgent
from training.rollouts.rollout import Rollout, play
from training.rollouts.simulator import LocalUser, user_messages
from training.trainer.loop import train

PANEL = [{"name": t, "kind": "scripted", "script": t} for t in ("anchored", "reactant", "steady")]


@pytest.fixture(scope="module")
def decision():
    return get_domain("p4g-decision")


def decision_config(model, tmp_path, **extra):
    data = {
        "name": "decide",
        "domain": "p4g-decision",
        "base_model": str(model),
        "steps": 1,
        "group_size": 8,
        "lr": 1e-2,
        "simulator_lr": 1e-2,
        "temperature": 1.0,
        "max_turns": 2,
        "micro_batch": 8,
        "simulator": {"temperature": 1.0, "max_new_tokens": 150},
        "tasks": {"max_train": 2, "max_eval": 1},
        "output_dir": str(tmp_path / "run"),
        "threads": 1,
    }
    data.update(extra)
    return parse_config(data)


def asked(decision, task, text):
    rollout = Rollout.begin(decision, task)
    rollout.conversation.append({"role": "assistant", "content": text})
    rollout.max_turns = decision.max_turns
    return rollout


def naive_choice_logprob(lm, prompt, choices, n, temperature):
    """Token by token, restricted to the trie at each position: what constrained sampling does."""
    seq = choices.ids[n]
    with torch.no_grad():
        logits = lm.model(input_ids=torch.tensor([prompt + seq])).logits[0].float() / temperature
    total = 0.0
    for j, (token, allowed) in enumerate(zip(seq, choices.allowed(n), strict=True)):
        if len(allowed) > 1:
            row = logits[len(prompt) + j - 1]
            total += float(row[token] - torch.logsumexp(row[allowed], 0))
    return total


def test_choice_distribution_is_the_constrained_sampling_distribution(tiny_model, decision):
    lm = LocalModel.load(tiny_model)
    task = decision.scenarios("train")[0]
    user = LocalUser(lm, SimulatorSpec())
    rollouts = [asked(decision, task, text) for text in list(ASKS.values())[:3]]
    prompts = [
        r.user.prompt(lm.fmt, user_messages(decision, user.system_prompt(decision, task), r))
        for r in rollouts
    ]
    options = decision.user_choices(task, rollouts[0].conversation, True)
    choices, dists = lm.choice_probs(prompts, options, 0.7)
    for prompt, dist in zip(prompts, dists, strict=True):
        naive = [naive_choice_logprob(lm, prompt, choices, n, 0.7) for n in range(len(options))]
        assert dist == pytest.approx(torch.tensor(naive).exp().tolist(), abs=1e-5)
        assert sum(dist) == pytest.approx(1.0, abs=1e-5)
    # forced positions (one allowed token) carry no choice: the markers share "[DONATE $"
    assert [len(a) for a in choices.allowed(0)][:5] == [1, 1, 1, 1, 1]


def test_training_log_probs_of_a_choice_are_the_sampled_ones(tiny_model, decision):
    """The loss sees the distribution that was sampled: restricted, at the temperature, and the
    shared prompt run once gives the same numbers and gradients as separate rows."""
    policy = Policy(tiny_model, lr=1e-3)
    task = decision.scenarios("train")[0]
    agent = LocalAgent(policy, 0.7, 8)
    rollouts = [Rollout.begin(decision, task) for _ in range(6)]
    for r in rollouts:
        r.max_turns = 2
    agent.respond(decision, rollouts)
    batch = TokenBatch.from_lists(
        [r.agent.ids for r in rollouts],
        [r.agent.mask for r in rollouts],
        policy.pad_id,
        [r.agent.allowed for r in rollouts],
    )
    logp, _ = token_logprobs(policy.model, batch, temperature=0.7)
    for row, r in zip(logp.sum(-1).tolist(), rollouts, strict=True):
        d = r.decisions[0]
        assert row == pytest.approx(float(torch.tensor(d.probs[d.index]).log()), abs=1e-4)
    assert all(
        sum(r.agent.mask) < len(r.decisions[0].texts[r.decisions[0].index]) for r in rollouts
    )

    # shared prefix (one pass) against each row alone: values and gradients
    params = [p for p in policy.model.parameters() if p.requires_grad]
    together = token_logprobs(policy.model, batch, temperature=0.7)[0].sum()
    grads = torch.autograd.grad(together, params)
    alone = sum(
        token_logprobs(policy.model, batch.rows(i, i + 1), temperature=0.7)[0].sum()
        for i in range(len(batch))
    )
    grads_alone = torch.autograd.grad(alone, params)
    assert float(together) == pytest.approx(float(alone), abs=1e-4)
    for g, h in zip(grads, grads_alone, strict=True):
        assert torch.allclose(g, h, atol=1e-5)


def expected_donation(lm, decision, prompts, options):
    _, dists = lm.choice_probs(prompts, options, 1.0)
    amounts = [0, 0.5, 1, 1.5, 2]
    return statistics.fmean(sum(p * a for p, a in zip(d, amounts, strict=True)) for d in dists)


@pytest.mark.parametrize(("reward", "direction"), [("auto", -1), ("cooperative", 1)])
def test_cotrained_simulator_learns_in_its_own_direction(
    tiny_model, tmp_path, decision, reward, direction
):
    """P4G's persuadee keeps its money: with reward 1 - r it learns to give less to the asks it
    met; a cooperative simulator (reward r) would learn to give more."""
    torch.manual_seed(0)
    cfg = decision_config(
        tiny_model,
        tmp_path,
        regime="cotrain",
        simulator_reward=reward,
        simulator_beta=0.0,
        group_size=8,
    )
    regime = make_regime(cfg, cfg.run_dir(), ModelCache(cfg))
    agent = LocalAgent(LocalModel.load(tiny_model), 1.0, 8)
    task = decision.scenarios("train")[0]
    probe = [asked(decision, task, text) for text in ASKS.values()]
    prompts = [
        r.user.prompt(
            regime.policy.fmt, user_messages(decision, regime.user.system_prompt(decision, task), r)
        )
        for r in probe
    ]
    options = decision.user_choices(task, probe[0].conversation, True)
    before = expected_donation(regime.policy, decision, prompts, options)
    for step in range(1, 6):
        with regime.simulator(step) as user:
            rollouts = play(decision, [task] * cfg.group_size, agent, user, max_turns=2)
        stats = regime.learn(step, rollouts)
        assert stats["sim/learned"] in (0.0, 1.0)
    after = expected_donation(regime.policy, decision, prompts, options)
    assert direction * (after - before) > 0.02, (before, after)


def test_heldout_panel_is_the_scripted_types_not_the_training_simulator(
    tiny_model, tmp_path, decision
):
    """Each held-out type's reward is its own written-down rule applied to the agent's asks."""
    torch.manual_seed(0)
    cfg = decision_config(tiny_model, tmp_path, heldout=PANEL, eval_samples=300)
    task = decision.scenarios("test")[0]
    panel = HeldOutPanel(cfg, decision, [task], ModelCache(cfg))
    agent = LocalModel.load(tiny_model)
    row = panel.evaluate(agent, 1)
    # the agent's exact distribution over its asks
    opening = Rollout.begin(decision, task)
    prompt = opening.agent.prompt(
        agent.fmt, [{"role": "system", "content": decision.agent_system_prompt(task)}]
    )
    texts = decision.agent_choices(task, [])
    _, (dist,) = agent.choice_probs([prompt], texts, cfg.temperature)
    for spec in PANEL:
        persuadee = ScriptedPersuadee(spec["script"])
        exact = sum(
            p * persuadee.expected_reward([{"role": "assistant", "content": t}])
            for p, t in zip(dist, texts, strict=True)
        )
        assert row[f"heldout/{spec['name']}/reward"] == pytest.approx(exact, abs=0.08), spec
    assert row["heldout/worst_reward"] == min(row[f"heldout/{s['name']}/reward"] for s in PANEL)


def test_a_panel_on_the_training_simulators_weights_is_refused(tiny_model, tmp_path):
    from training.config_keys import ConfigError

    for spec in (
        {"name": "same"},
        {"name": "persona", "persona": "You are busy."},
        {"name": "path", "model": str(tiny_model)},
    ):
        with pytest.raises(ConfigError, match="training simulator's weights"):
            decision_config(tiny_model, tmp_path, heldout=[spec])


def test_a_seen_panel_member_runs_on_the_training_simulator_and_stays_out_of_unseen_means(
    tiny_model, tmp_path, decision
):
    """The release's panel keeps each run's training simulator: `seen = true` allows it, the
    panel-wide means include it as the release's do, the unseen means leave it out."""
    from training.config_keys import ConfigError

    seen = {"name": "trained-on", "seen": True}
    cfg = decision_config(tiny_model, tmp_path, heldout=[seen, *PANEL], eval_samples=8)
    panel = HeldOutPanel(cfg, decision, decision.scenarios("test")[:1], ModelCache(cfg))
    row = panel.evaluate(LocalModel.load(tiny_model), 1)
    names = ["trained-on", *(s["name"] for s in PANEL)]
    unseen = names[1:]
    assert row["heldout/reward"] == pytest.approx(
        statistics.fmean(row[f"heldout/{n}/reward"] for n in names)
    )
    assert row["heldout/unseen_reward"] == pytest.approx(
        statistics.fmean(row[f"heldout/{n}/reward"] for n in unseen)
    )
    assert row["heldout/unseen_success"] == pytest.approx(
        statistics.fmean(row[f"heldout/{n}/success"] for n in unseen)
    )
    assert row["heldout/unseen_worst_reward"] == min(row[f"heldout/{n}/reward"] for n in unseen)
    # a panel without a seen member writes no unseen means (they would equal the others)
    plain = decision_config(tiny_model, tmp_path, heldout=PANEL, eval_samples=1)
    assert "heldout/unseen_reward" not in HeldOutPanel(
        plain, decision, decision.scenarios("test")[:1], ModelCache(plain)
    ).evaluate(LocalModel.load(tiny_model), 1)
    # `seen` must be true to the config: not on a member that is not a training simulator, nor
    # on the training simulator itself
    with pytest.raises(ConfigError, match=r"heldout\[0\]\.seen marks a panel member"):
        decision_config(tiny_model, tmp_path, heldout=[{**PANEL[0], "seen": True}])
    with pytest.raises(ConfigError, match=r"simulator\.seen is for \[\[heldout\]\] members"):
        decision_config(
            tiny_model,
            tmp_path,
            heldout=PANEL,
            simulator={"temperature": 1.0, "max_new_tokens": 150, "seen": True},
        )


def test_an_endpoint_simulator_decides_with_its_key_from_the_environment(decision, monkeypatch):
    """A hosted held-out user: the key comes from the variable the config names, the choice turn
    asks for one of the markers by JSON schema, and a missing key is a clear error."""
    from tests.support.scripted_server import ScriptedServer
    from training.config_keys import ConfigError
    from training.rollouts.simulator import EndpointUser

    def hosted(url: str) -> SimulatorSpec:
        return SimulatorSpec(name="hosted", endpoint=url, model="m", api_key_env="PARLEY_TEST_KEY")

    task = decision.scenarios("test")[0]
    monkeypatch.setenv("PARLEY_TEST_KEY", "s3cret")
    with ScriptedServer([{"content": '{"reply": "[DONATE $1.50]"}'}]) as server:
        user = EndpointUser(hosted(server.url))
        rollout = asked(decision, task, next(iter(ASKS.values())))
        user.respond(decision, [rollout])
    assert rollout.conversation[-1] == {"role": "user", "content": "[DONATE $1.50]"}
    assert server.headers[0]["authorization"] == "Bearer s3cret"
    schema = server.requests[0]["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["reply"]["enum"] == decision.user_choices(task, [], True)
    monkeypatch.delenv("PARLEY_TEST_KEY")
    with pytest.raises(ConfigError, match="PARLEY_TEST_KEY is not set"):
        EndpointUser(hosted(server.url)).respond(decision, [rollout])


class WrittenList(LocalModel):
    """A 'model' that always writes the same k = 5 verbalized candidates (probabilities given)."""

    def __init__(self, model_dir, texts, probs):
        base = LocalModel.load(model_dir)
        super().__init__(base.model, base.tokenizer)
        self.json = json.dumps(
            {
                "responses": [
                    {"text": t, "probability": p} for t, p in zip(texts, probs, strict=True)
                ]
            }
        )

    def sample(self, prompts, temperature, max_new_tokens, logits_processor=None, caches=None):
        return [self.fmt.encode(self.json) + [self.turn_stop] for _ in prompts]


@pytest.mark.parametrize("mode", ["probability", "uniform"])
def test_verbalized_sampling_draws_by_the_written_probabilities(tiny_model, decision, mode):
    task = decision.scenarios("train")[0]
    options = decision.user_choices(task, [], True)
    probs = [0.05, 0.1, 0.15, 0.3, 0.4]
    lm = WrittenList(tiny_model, options, probs)
    user = LocalUser(lm, SimulatorSpec(kind="verbalized", draw=mode), rng=random.Random(0))
    rollouts = [asked(decision, task, next(iter(ASKS.values()))) for _ in range(1000)]
    user.respond(decision, rollouts)
    counts = Counter(r.conversation[-1]["content"] for r in rollouts)
    expected = probs if mode == "probability" else [0.2] * 5
    for text, p in zip(options, expected, strict=True):
        assert counts[text] / len(rollouts) == pytest.approx(p, abs=0.05), (text, counts)
    assert rollouts[0].decision(USER).probs == pytest.approx(expected)


def test_population_half_meets_the_current_simulator_which_learns_every_step(
    tiny_model, tmp_path, decision
):
    torch.manual_seed(0)
    cfg = decision_config(
        tiny_model,
        tmp_path,
        regime="population",
        pool_size=2,
        pool_every=1,
        group_size=4,
        batch_tasks=2,
        simulator_beta=0.0,
    )
    regime = make_regime(cfg, cfg.run_dir(), ModelCache(cfg))
    agent = LocalAgent(LocalModel.load(tiny_model), 1.0, 8)
    tasks = decision.scenarios("train")[:2]
    for step in (1, 2, 3):
        current = regime.policy.adapter_state()
        with regime.simulator(step) as user:
            rollouts = play(
                decision, [t for t in tasks for _ in range(4)], agent, user, max_turns=2
            )
        members = [r.member for r in rollouts]
        if step == 1:  # empty pool: everyone meets the current simulator
            assert members == ["current"] * 8
        else:  # each group: its first half the current one, the rest pool snapshots
            assert members[0:2] == members[4:6] == ["current"] * 2
            assert all(m.startswith("sim-step-") for m in members[2:4] + members[6:8])
        after = regime.policy.adapter_state()
        assert all(torch.equal(current[k], after[k]) for k in current)  # snapshots swapped back
        stats = regime.learn(step, rollouts)
        own = [r for r in rollouts if r.member == "current"]
        assert stats["sim/tokens"] == sum(sum(r.user.mask) for r in own) > 0
    assert [e.step for e in regime.pool.entries] == [2, 3]


def test_variance_split():
    same = [(0.5, 0.5), (1.0, 1.0), (0.0, 0.0)]  # the simulator adds nothing
    split = variance_split(same)
    assert split["reward_var/simulator"] == 0 and split["reward_var/agent"] == pytest.approx(
        split["reward_var/total"]
    )
    rng = random.Random(0)
    coin = [(float(rng.random() < 0.5), float(rng.random() < 0.5)) for _ in range(4000)]
    split = variance_split(coin)  # one message, a fair coin: all of it is the simulator's
    assert split["reward_var/simulator"] == pytest.approx(0.25, abs=0.02)
    assert abs(split["reward_var/agent"]) < 0.02


def metrics(cfg):
    return [json.loads(x) for x in (cfg.run_dir() / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.model
def test_the_simulator_decides_what_the_agent_learns(base_model, tmp_path):
    """SmolLM2 agent, a few GRPO steps on the decision episode. Against the frozen SmolLM2
    persuadee (anchored: it gives what is asked) the agent's probability of that simulator's
    exploit (ask $2, either appeal) rises; against a scripted analytical persuadee (moved by
    evidence, not by the amount) the exploit is the evidence appeal, and that is what rises."""
    common = dict(steps=4, lr=5e-4, simulator={"temperature": 0.7}, tasks={"max_train": 2})
    frozen = decision_config(base_model, tmp_path / "frozen", **common)
    train(frozen, show_progress=False)
    analytical = decision_config(
        base_model,
        tmp_path / "analytical",
        **{
            **common,
            "simulator": {"name": "analytical", "kind": "scripted", "script": "analytical"},
        },
    )
    train(analytical, show_progress=False)

    exploits = {}
    for cfg in (frozen, analytical):
        rows = metrics(cfg)
        exploit = json.loads((cfg.run_dir() / "exploit.json").read_text())["exploit"]
        exploits[cfg.simulator.name] = exploit
        assert rows[-1]["agent/p_exploit"] > rows[0]["agent/p_exploit"] + 0.05, (exploit, rows)
        assert all(r["optimizer_step"] == 1.0 for r in rows[:2])
    assert sorted(exploits[frozen.simulator.name]) == sorted(
        text for (_, amount), text in ASKS.items() if amount == 2
    )
    assert sorted(exploits["analytical"]) == sorted(
        text for (appeal, _), text in ASKS.items() if appeal == "evidence"
    )


def test_the_experiment_writes_its_results(tiny_model, other_tiny_model, tmp_path):
    """`python -m training experiment collapse` end to end at the smallest size (tiny models)."""
    from training.__main__ import main

    cfg = decision_config(
        tiny_model,
        tmp_path,
        steps=2,
        group_size=2,
        eval_every=2,
        save_every=1,
        pool_every=1,
        heldout=PANEL,
        eval_samples=2,
        simulator={"temperature": 1.0, "max_new_tokens": 150},
    )
    path = tmp_path / "base.toml"
    path.write_text(_toml(cfg))
    out = tmp_path / "exp"
    args = ["experiment", "collapse", "--seeds", "1", "--out", str(out), "--config", str(path)]
    assert main(args) == 0
    results = json.loads((out / "results.json").read_text())
    assert set(results["regimes"]) == {"single", "verbalized", "cotrain", "population"}
    for r in results["regimes"].values():
        assert r["seeds"] == [0]
        assert len(r["train_reward"][0]) == len(r["agent_entropy"][0]) == 2
        assert set(r["heldout_reward"]["per_type"]) == {"anchored", "reactant", "steady"}
        assert len(r["heldout_success"]["final"]) == 1 and len(r["optimizer_steps"]) == 1
    for regime, r in results["regimes"].items():
        (per_ask,) = r["final_simulator_reward_per_ask"]
        if regime == "verbalized":  # what it writes is sampled: nothing exact to report
            assert per_ask is None
        else:
            assert set(per_ask) == set(ASKS.values())
    assert results["steps"] == 2 and results["group_size"] == 2 and results["runtime_s"] > 0
    assert results["command"].startswith("python -m training experiment collapse")
    assert (out / "results.md").is_file() and (out / "collapse.png").is_file()
    # run again: every run is finished, so it only reads them
    assert main(args) == 0
    assert (
        json.loads((out / "results.json").read_text())["regimes"]["single"]["train_reward"]
        == results["regimes"]["single"]["train_reward"]
    )


def _toml(cfg: RunConfig) -> str:
    """A RunConfig as TOML (enough for these flat values, tables and arrays of tables)."""

    def value(v):
        return json.dumps(v)

    data = dataclasses.asdict(cfg)
    lines = [f"{k} = {value(v)}" for k, v in data.items() if not isinstance(v, dict | list)]
    for table in ("tasks", "simulator", "lora"):
        lines.append(f"[{table}]")
        lines += [f"{k} = {value(v)}" for k, v in data[table].items()]
    for spec in data["heldout"]:
        lines.append("[[heldout]]")
        lines += [f"{k} = {value(v)}" for k, v in spec.items()]
    return "\n".join(lines) + "\n"
