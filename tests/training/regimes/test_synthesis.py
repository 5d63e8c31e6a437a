"""COLLAPSE-AWARE's synthesis supplies (training/regimes/synthesis.py): which tasks they play,
that a share of 0 is today's run draw for draw, that each supply's turns land in the behaviour
space and move the measures the way it is meant to on a constructed case, and the interface the
breaker drives (regime.synthesis_share, rediversify, the checkpoint state)."""

import json
import re

import numpy as np
import pytest
import torch

from agents.behaviour.space import BehaviourSpace
from agents.domains.episode import USER
from agents.domains.p4g.decision import ASKS
from agents.domains.p4g.donation import DECISION_AMOUNTS, MAX_DONATION
from tests.support.scripted_server import ScriptedServer
from training.config import parse_config
from training.config_keys import ConfigError
from training.measures.diversity import Embedder
from training.measures.profiles import Profiles, Reply, ask, probe_set
from training.regimes import synthesis as syn
from training.regimes.choose import make_regime
from training.regimes.regime import ModelCache, frozen_simulator
from training.rollouts.rollout import Rollout
from training.trainer.loop import _play_task

ASK = ASKS[("evidence", 1.0)]


class AskingAgent:
    """The P4G decision episode's agent, always making one ask (this file is about the user)."""

    role = "agent"

    def respond(self, domain, rollouts):
        for r in rollouts:
            r.conversation.append({"role": "assistant", "content": ASK})


def decision_config(tiny_model, tmp_path, synthesis=None, **extra):
    return parse_config(
        {
            "name": "synth",
            "domain": "p4g-decision",
            "base_model": str(tiny_model),
            "group_size": 4,
            "batch_tasks": 2,
            "max_new_tokens": 6,
            "simulator": {"name": "tiny", "max_new_tokens": 6, "temperature": 1.0},
            "output_dir": str(tmp_path / "run"),
            **({"synthesis": synthesis} if synthesis else {}),
            **extra,
        }
    )


def play_step(cfg, regime, step, domain):
    """What the trainer does with the step's tasks: each task's group, seeded as it seeds them."""
    tasks = domain.scenarios("train")[: cfg.batch_tasks]
    with regime.simulator(step) as user:
        return [
            _play_task(cfg, domain, t, i, step, AskingAgent(), user) for i, t in enumerate(tasks)
        ]


def seen(groups):
    return [
        [(r.member, r.conversation[-1]["content"], r.decision(USER).probs) for r in g]
        for g in groups
    ]


def expected_reward(probs):
    return sum(p * min(a / MAX_DONATION, 1.0) for p, a in zip(probs, DECISION_AMOUNTS, strict=True))


# -- the config ---------------------------------------------------------------------------------


def test_synthesis_is_off_by_default_and_bad_settings_are_refused(tmp_path):
    base = {"name": "x", "domain": "p4g"}
    cfg = parse_config(base)
    assert not cfg.synthesis.enabled and cfg.synthesis.share == 0
    with pytest.raises(ConfigError, match="synthesis.share"):  # a share with nothing to play it
        parse_config(base | {"synthesis": {"share": 0.3}})
    with pytest.raises(ConfigError, match="synthesis.share"):
        parse_config(base | {"synthesis": {"share": 1.5, "adversarial": True}})
    with pytest.raises(ConfigError, match="needs \\[behaviour\\] reference"):
        parse_config(base | {"synthesis": {"verbalized_missing": True}})
    with pytest.raises(ConfigError, match="synthesis.to_top_p.*endpoint"):
        parse_config(base | {"synthesis": {"interpolate": True, "to_top_p": 0.9}})
    with pytest.raises(ConfigError, match="two sources that differ"):
        parse_config(base | {"synthesis": {"interpolate": True, "to_temperature": 0.3}})
    with pytest.raises(ConfigError, match="scripted"):
        parse_config(
            base
            | {
                "simulator": {"kind": "scripted", "script": "steady"},
                "synthesis": {"interpolate": True},
            }
        )
    with pytest.raises(ConfigError, match="one process"):
        parse_config(base | {"distributed": {"processes": 2}, "synthesis": {"adversarial": True}})


def test_the_synthesis_tasks_are_the_share_evenly_spaced_and_cycle_the_supplies():
    for share in (0.1, 0.25, 0.5, 1 / 3, 1.0):
        picked = [
            syn.synthesis_ordinal(share, step, 3, i) for step in range(1, 101) for i in range(3)
        ]
        ordinals = [o for o in picked if o is not None]
        assert len(ordinals) == round(300 * share)  # exactly the share over the run
        assert ordinals == list(range(len(ordinals)))  # each counted once, in order
    assert syn.synthesis_ordinal(0.0, 5, 2, 1) is None
    assert [syn.synthesis_ordinal(0.5, 1, 2, i) for i in (0, 1)] == [None, 0]


# -- share 0: today's draws -----------------------------------------------------------------------


def test_share_zero_is_todays_run_and_the_own_tasks_play_as_before(tiny_model, tmp_path):
    today = decision_config(tiny_model, tmp_path)
    domain = today.build_domain()
    plain = seen(play_step(today, make_regime(today, tmp_path / "a", ModelCache(today)), 1, domain))
    on = {"adversarial": True, "interpolate": True}
    zero = decision_config(tiny_model, tmp_path, on)
    regime = make_regime(zero, tmp_path / "b", ModelCache(zero))
    assert type(regime).__name__ == "SynthesizedSingle" and regime.synthesis_share == 0.0
    assert seen(play_step(zero, regime, 1, domain)) == plain
    # at share 0.5 the step's second task is a synthesis task; the first plays as it did
    half = decision_config(tiny_model, tmp_path, on | {"share": 0.5})
    regime = make_regime(half, tmp_path / "c", ModelCache(half))
    first, second = seen(play_step(half, regime, 1, domain))
    assert first == plain[0]
    assert {m for m, _, _ in second} == {syn.INTERPOLATE}  # the whole group meets one supply


# -- the breaker's interface ----------------------------------------------------------------------


def test_the_share_is_read_every_step_saved_and_rediversify_raises_it_for_a_while(
    tiny_model, tmp_path
):
    cfg = decision_config(tiny_model, tmp_path, {"adversarial": True, "rediversify_steps": 2})
    domain = cfg.build_domain()
    regime = make_regime(cfg, tmp_path / "r", ModelCache(cfg))
    assert [m for g in seen(play_step(cfg, regime, 1, domain)) for m, _, _ in g] == ["current"] * 8
    regime.synthesis_share = 1.0  # the breaker raises it while the run goes on
    assert {m for g in seen(play_step(cfg, regime, 2, domain)) for m, _, _ in g} == {
        syn.ADVERSARIAL
    }
    regime.synthesis_share = 0.25
    regime.rediversify()
    assert regime.synthesis_share == 1.0
    for step in (3, 4):  # rediversify_steps steps at share 1.0 ...
        members = {m for g in seen(play_step(cfg, regime, step, domain)) for m, _, _ in g}
        assert members == {syn.ADVERSARIAL}
    assert regime.synthesis_share == 0.25  # ... then back where it was
    regime.rediversify()
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    state = json.loads(json.dumps(regime.save(folder), default=lambda t: None))
    assert (folder / "synthesis_adversary").is_dir()
    again = make_regime(cfg, tmp_path / "r2", ModelCache(cfg))
    again.load(folder, regime.save(folder), 4)
    assert again.synthesis_share == 1.0 and again.synthesis.rediversifying == 2
    assert state["synthesis"]["synthesis_share"] == 1.0
    # without [synthesis] the base class carries the share too (nothing plays it)
    plain = make_regime(decision_config(tiny_model, tmp_path), tmp_path / "p", ModelCache(cfg))
    assert plain.synthesis_share == 0.0 and plain.synthesis is None
    plain.rediversify()
    assert plain.synthesis_share == 1.0


# -- interpolate ----------------------------------------------------------------------------------


def decision_mci(domain, probes, speakers):
    profiles = Profiles(None, 0.005, 0.01, 0, 0, True)
    replies = {n: ask(domain, probes, s, 2, "probe") for n, s in speakers.items()}
    row = profiles.row(1, replies, {}, list(replies))
    return {n: row[f"behaviour/decision/probe/mci/{n}"] for n in speakers}


def test_interpolating_a_collapsed_and_a_spread_simulator_lowers_the_collapsed_ones_mci(
    tiny_model, tmp_path
):
    cfg = decision_config(
        tiny_model,
        tmp_path,
        {"interpolate": True, "from_temperature": 0.05, "to_temperature": 4.0, "variants": 1},
    )
    domain = cfg.build_domain()
    models = ModelCache(cfg)
    ((lam, a, b),) = syn.interpolated_specs(cfg)
    assert lam == 0.5 and a.temperature == pytest.approx(2.025) and a == b  # no prompt variant
    supply = syn.Interpolated(cfg, models)
    base = cfg.synthesis_base()
    ends = {
        end: frozen_simulator(base.__class__(**{**base.__dict__, "temperature": t}), models, 0)
        for end, t in (("collapsed", 0.05), ("spread", 4.0))
    }
    # one prompt: over several, a mixture of peaked decisions on different amounts is spread
    probes = probe_set(domain, domain.scenarios("train"), 1)[:1]
    mci = decision_mci(domain, probes, ends | {"variant": next(supply.speakers())})
    # the decision is exact (its probabilities at the variant's temperature): between the two
    assert mci["collapsed"] > mci["variant"] > mci["spread"]


def test_a_prompt_variant_is_mixed_into_its_share_of_the_group(tiny_model, tmp_path):
    cfg = decision_config(
        tiny_model,
        tmp_path,
        {
            "interpolate": True,
            "variants": 3,
            "from_persona": "You are careful.",
            "to_persona": "You are generous.",
        },
    )
    domain = cfg.build_domain()
    supply = syn.Interpolated(cfg, ModelCache(cfg))
    cuts = []
    for ordinal in range(3):
        supply.choose(ordinal)
        lam, first, second = supply.variants[supply.variant]
        assert (
            first.spec.persona == "You are careful." and second.spec.persona == "You are generous."
        )
        cuts.append(round(lam * cfg.group_size))
    assert cuts == [1, 2, 3]  # lambda = 1/4, 1/2, 3/4 of G = 4 rollouts meet the second prompt
    supply.choose(0)  # lambda 1/4: rollout 0 meets "generous", 1 to 3 "careful"
    _, first, second = supply.variants[0]
    said = []
    first.respond = lambda d, rs: said.extend(("careful", r.index) for r in rs)
    second.respond = lambda d, rs: said.extend(("generous", r.index) for r in rs)
    group = [Rollout.begin(domain, domain.scenarios("train")[0]) for _ in range(4)]
    for i, r in enumerate(group):
        r.index = i
    supply.respond(domain, group)
    assert sorted(said) == [("careful", 1), ("careful", 2), ("careful", 3), ("generous", 0)]


# -- verbalized_missing ---------------------------------------------------------------------------

WORDS = {"yes": [1, 0, 0, 0], "no": [0, 1, 0, 0], "why": [0, 0, 1, 0], "ok": [0, 0, 0, 1]}


def embed(texts):
    """A constructed embedder: a text's first word picks its direction (its cluster)."""
    return [
        (np.array(WORDS[t.split()[0].lower().strip('?.!"')], float) * 10 + 0.01 * len(t)).tolist()
        for t in texts
    ]


class InstructedServer(ScriptedServer):
    """A Verbalized Sampling model that follows its prompt: its k candidates are the lines the
    system prompt quotes (the missing clusters' turns), else the one thing it always says."""

    def __init__(self, k):
        super().__init__([])
        self.k = k

    async def complete(self, request):
        system = (await request.json())["messages"][0]["content"]
        quoted = re.findall(r'^- "(.*)"$', system, re.M) or ["yes sure"]
        texts = [quoted[i % len(quoted)] for i in range(self.k)]
        reply = {"responses": [{"text": t, "probability": 1 / self.k} for t in texts]}
        self.replies.append({"content": json.dumps(reply)})
        return await super().complete(request)


def test_the_missing_clusters_are_the_peoples_least_covered_first():
    people = [0.4, 0.3, 0.2, 0.1, 0.0]
    population = [0.0, 0.3, 0.0, 0.5, 0.2]  # deficits 0.4, 0, 0.2, -0.4; cluster 4 not people's
    assert syn.missing_clusters(people, population, 1) == [0]
    assert syn.missing_clusters(people, population, 3) == [0, 2]  # only deficits above 0
    assert syn.missing_clusters(people, None, 3) == [0, 1, 2]  # before any step: the largest


def test_verbalized_sampling_told_the_missing_clusters_raises_the_populations_bdi(tmp_path):
    reference = [f"{w} {i}" for w in WORDS for i in range(4)]
    (tmp_path / "people.jsonl").write_text("\n".join(json.dumps(t) for t in reference))
    with InstructedServer(k=4) as server:
        cfg = parse_config(
            {
                "name": "vs",
                "domain": "p4g",
                "output_dir": str(tmp_path / "run"),
                "simulator": {"endpoint": server.url, "model": "m", "k": 4},
                "behaviour": {"reference": f"texts:{tmp_path / 'people.jsonl'}", "clusters": 4},
                "synthesis": {
                    "verbalized_missing": True,
                    "share": 1.0,
                    "missing_clusters": 3,
                    "exemplars": 1,
                },
            }
        )
        domain = cfg.build_domain()
        settings = cfg.behaviour.space_settings(0, "constructed")
        space = BehaviourSpace.fit(settings, reference, embed)
        profiles = Profiles(space, 0.01, 0.01, 0, 0, True)
        synthesis = syn.Synthesis(cfg, tmp_path, ModelCache(cfg))
        supply = synthesis.supplies[syn.MISSING]
        probes = [p for p in probe_set(domain, domain.scenarios("train"), 2) if not p.final]
        # a collapsed population: every reply is the "yes" cluster's
        collapsed = [Reply("yes indeed", None)] * (4 * len(probes))
        before = profiles.row(1, {"training": collapsed}, {}, ["training"])
        assert before["behaviour/clusters/probe/bdi"] == pytest.approx(0.25)
        synthesis.observe(profiles)
        yes = space.assign(["yes"])[0]
        assert sorted(supply.told) == sorted(set(range(4)) - {yes})  # the three missing
        told = ask(domain, probes, supply, 4, "p")
        assert all(space.assign([r.text]) for r in told)  # its turns land in the space
        replies = {"training": collapsed, syn.MISSING: told}
        after = profiles.row(2, replies, {}, list(replies))
        assert after["behaviour/clusters/probe/bdi"] > before["behaviour/clusters/probe/bdi"]
        assert after["behaviour/clusters/probe/scd"] < before["behaviour/clusters/probe/scd"]
        # told nothing, the same model says what it always says: no rise
        supply.tell([], synthesis.exemplars)
        untold = ask(domain, probes, supply, 4, "p")
        same = profiles.row(3, {"training": collapsed, syn.MISSING: untold}, {}, list(replies))
        assert same["behaviour/clusters/probe/bdi"] == pytest.approx(0.25)


# -- adversarial ----------------------------------------------------------------------------------


def test_the_adversary_is_rewarded_one_minus_r_and_its_update_lowers_the_agents_reward(
    tiny_model, tmp_path
):
    cfg = decision_config(
        tiny_model,
        tmp_path,
        {"adversarial": True, "share": 1.0},
        group_size=8,
        batch_tasks=1,
        simulator_lr=3e-2,
        simulator_beta=0.0,
    )
    domain = cfg.build_domain()
    regime = make_regime(cfg, tmp_path / "r", ModelCache(cfg))
    adversary = regime.synthesis.adversary
    assert adversary.reward_mode == "adversarial" and adversary.member == syn.ADVERSARIAL

    def reward_it_allows(step):
        torch.manual_seed(0)
        (group,) = play_step(cfg, regime, step, domain)
        return group, expected_reward(group[0].decision(USER).probs)

    group, before = reward_it_allows(1)
    assert {r.member for r in group} == {syn.ADVERSARIAL}
    stats = regime.learn(1, group)
    rewards = [r.reward for r in group]
    assert len(set(rewards)) > 1  # the group has a learning signal
    mean = sum(rewards) / len(rewards)
    assert stats[f"{syn.ADVERSARIAL}/reward_mean"] == pytest.approx(1 - mean)
    assert stats[f"{syn.ADVERSARIAL}/learned"] == 1.0 and stats["synthesis/share"] == 1.0
    for step in (2, 3):
        regime.learn(step, reward_it_allows(step)[0])
    _, after = reward_it_allows(4)
    # the same ask's exact decision now gives the agent less
    assert after < before


# -- every supply's turns land in the behaviour space ---------------------------------------------


def test_every_supplys_free_text_turns_land_in_the_behaviour_space(tiny_model, tmp_path):
    said = [
        "I am not sure about donating.",
        "What does Save the Children do?",
        "Sure, I can give.",
        "I need the money myself.",
        "Hello, how are you?",
        "No thanks.",
        "Tell me more.",
    ]
    (tmp_path / "people.jsonl").write_text("\n".join(json.dumps(t) for t in said))
    cfg = parse_config(
        {
            "name": "space",
            "domain": "p4g",
            "base_model": str(tiny_model),
            "simulator": {"max_new_tokens": 6},
            "output_dir": str(tmp_path / "run"),
            "behaviour": {"reference": f"texts:{tmp_path / 'people.jsonl'}", "clusters": 3},
            "synthesis": {
                "interpolate": True,
                "verbalized_missing": True,
                "adversarial": True,
                "variants": 1,
            },
        }
    )
    domain = cfg.build_domain()
    space = BehaviourSpace.fit(
        cfg.behaviour.space_settings(0, str(tiny_model)), said, Embedder(tiny_model)
    )
    synthesis = syn.Synthesis(cfg, tmp_path, ModelCache(cfg))
    synthesis.observe(Profiles(space, 0.01, 0.01, 0, 0, True))
    assert synthesis.supplies[syn.MISSING].told  # told before any step: the reference's largest
    probes = [p for p in probe_set(domain, domain.scenarios("train"), 1) if not p.final]
    names = set()
    for name, speaker in synthesis.probed():
        texts = [r.text for r in ask(domain, probes, speaker, 2, "p") if r.text]
        labels = space.assign(texts)
        assert texts and len(labels) == len(texts) and all(0 <= k < space.k for k in labels)
        names.add(name)
    assert names == {syn.INTERPOLATE, syn.MISSING, syn.ADVERSARIAL}


# -- a run ----------------------------------------------------------------------------------------


def test_a_run_with_synthesis_trains_checkpoints_and_resumes_with_the_share_it_had(
    tiny_model, tmp_path
):
    from training.trainer import checkpoint
    from training.trainer.loop import train

    def run(steps):
        cfg = decision_config(
            tiny_model,
            tmp_path,
            {"adversarial": True, "interpolate": True, "share": 0.5},
            steps=steps,
            save_every=1,
            threads=1,
            micro_batch=8,
        )
        train(cfg, show_progress=False)
        return [json.loads(x) for x in (cfg.run_dir() / "metrics.jsonl").read_text().splitlines()]

    first, second = run(2)
    # one of each step's two tasks; the synthesis tasks cycle through the supplies
    assert first["synthesis/share"] == second["synthesis/share"] == 0.5
    assert "synthesis/interpolate/reward" in first and "synthesis/adversarial/reward" in second
    assert second["synthesis/adversarial/learned"] == 1.0  # it learnt from its own group
    folder = checkpoint.checkpoint_dir(tmp_path / "run", 2)
    assert (folder / "synthesis_adversary").is_dir()
    # the breaker raised the share before this checkpoint was written: a resume keeps it
    state = torch.load(folder / checkpoint.STATE, weights_only=False)
    assert state["synthesis"]["synthesis_share"] == 0.5
    state["synthesis"]["synthesis_share"] = 1.0
    torch.save(state, folder / checkpoint.STATE)
    *_, third = run(3)
    assert third["step"] == 3 and third["synthesis/share"] == 1.0


def test_a_measured_run_tells_verbalized_sampling_the_missing_clusters_and_probes_it(
    tiny_model, tmp_path
):
    from training.trainer.loop import train

    said = [
        "I am not sure about donating.",
        "What does Save the Children do?",
        "Sure.",
        "I need the money myself.",
        "Hello, how are you?",
        "No thanks.",
    ]
    (tmp_path / "people.jsonl").write_text("\n".join(json.dumps(t) for t in said))
    cfg = decision_config(
        tiny_model,
        tmp_path,
        {"verbalized_missing": True, "share": 1.0, "missing_clusters": 2},
        steps=1,
        threads=1,
        micro_batch=8,
        behaviour={
            "reference": f"texts:{tmp_path / 'people.jsonl'}",
            "clusters": 3,
            "probe_tasks": 1,
            "bootstrap": 0,
        },
    )
    train(cfg, show_progress=False)
    (row,) = [json.loads(x) for x in (cfg.run_dir() / "metrics.jsonl").read_text().splitlines()]
    assert row["synthesis/share"] == 1.0 and "synthesis/verbalized_missing/reward" in row
    assert row["synthesis/verbalized_missing/told"] == 2.0  # told before the first step
    # played now, so probed and counted in the population (the tiny model's Verbalized Sampling
    # answers do not parse: their raw text is its turn, measured in the clusters)
    assert 0 < row["behaviour/clusters/probe/mci/synthesis/verbalized_missing"] <= 1
    assert row["behaviour/clusters/probe/bdi/synthesis/verbalized_missing"] >= 0


def test_under_co_training_each_simulator_learns_from_its_own_groups_alone(
    tiny_model, tmp_path, monkeypatch
):
    from training.regimes import regime as regimes

    shapes = []  # each simulator's reward rows: [groups, group size]

    def recorded(mode, rewards, *args):
        shapes.append(tuple(rewards.shape))
        return advantages(mode, rewards, *args)

    advantages = regimes.simulator_advantages
    monkeypatch.setattr(regimes, "simulator_advantages", recorded)
    cfg = decision_config(
        tiny_model,
        tmp_path,
        {"adversarial": True, "share": 0.5},
        regime="cotrain",
        simulator_lr=1e-2,
    )
    domain = cfg.build_domain()
    regime = make_regime(cfg, tmp_path / "r", ModelCache(cfg))
    assert type(regime).__name__ == "SynthesizedCoTrain"
    own, supplied = play_step(cfg, regime, 1, domain)  # the step's second task is synthesis
    assert {r.member for r in own} == {"current"} and {r.member for r in supplied} == {
        syn.ADVERSARIAL
    }
    stats = regime.learn(1, own + supplied)
    # the co-trained simulator's reward is over its own group (P4G's: 1 - r), the adversary's too
    assert stats["sim/reward_mean"] == pytest.approx(1 - sum(r.reward for r in own) / 4)
    assert stats[f"{syn.ADVERSARIAL}/reward_mean"] == pytest.approx(
        1 - sum(r.reward for r in supplied) / 4
    )
    assert stats["synthesis/share"] == 0.5
    assert shapes == [(1, 4), (1, 4)]  # one whole group each, never the two mixed or split
    # a step whose every task is a supply's leaves the co-trained simulator nothing to learn from
    regime.synthesis_share = 1.0
    groups = play_step(cfg, regime, 2, domain)
    stats = regime.learn(2, [r for g in groups for r in g])
    assert stats["sim/learned"] == 0.0 and stats["synthesis/share"] == 1.0
