"""The simulator supplies beside the learning regimes: Ensemble (K frozen simulators in the
release's rotation) and Persona-Guided (behavioural guidelines before the simulator's prompt)."""

import json
import random

import pytest
import torch

from agents.domains import get_domain
from agents.domains.tau2.prompts import PERSONA_GUIDELINES
from agents.simulators.scripted import REMARKS
from tests.support.scripted_server import ScriptedServer
from tests.support.training import adapter, assert_same, metrics, one_and_two
from training.config import parse_config
from training.config_keys import ConfigError
from training.config_schema import RunConfig
from training.measures.collapse import mixture_exploit
from training.regimes.choose import make_regime
from training.regimes.regime import ModelCache
from training.rl.policy import LocalModel
from training.rollouts.rollout import Rollout
from training.trainer.loop import _play_task, train
from training.vocabulary import Regime

# three scripted members: each says its own remark, so a conversation shows who played the user
MEMBERS = {"a": "anchored", "b": "reactant", "c": "analytical"}
ENSEMBLE = [{"name": n, "kind": "scripted", "script": s} for n, s in MEMBERS.items()]
BY_REMARK = {REMARKS[s]: n for n, s in MEMBERS.items()}
# what the stub agent answers each member: its reward (the share of "e") is then known
ANSWER = {"a": "eee", "b": "abc", "c": "ee aa"}
REWARD = {"a": 1.0, "b": 0.0, "c": 0.5}


def config(**extra) -> RunConfig:
    return parse_config({"name": "supply", "domain": "letters", **extra})


class StubAgent:
    """An agent whose answer names the member it met (this file is about the user's side)."""

    role = "agent"

    def respond(self, domain, rollouts):
        for r in rollouts:
            member = BY_REMARK[r.conversation[-1]["content"]]
            r.conversation.append({"role": "assistant", "content": ANSWER[member]})


def play_step(cfg, regime, step, indices, letters):
    """What the trainer does for `indices` of the step's tasks (one rank's share)."""
    task = letters.scenarios("train")[0]
    out = {}
    with regime.simulator(step) as user:
        for index in indices:
            out[index] = _play_task(cfg, letters, task, index, step, StubAgent(), user)
    return out


def who(rollouts):
    """Which member spoke in each rollout, read from what it said."""
    return [BY_REMARK[r.conversation[0]["content"]] for r in rollouts]


# -- Ensemble: the rotation ---------------------------------------------------------------------


def test_ensemble_draws_per_rollout_round_robin_over_the_run_as_the_releases_p4g(tmp_path, letters):
    # the release's P4G (and its tau2 data source as written): member = sample.index % K,
    # samples numbered across the run, a task's G together. Its tau2 runs as they ran drew per
    # task: task_draw = "release" (tests/training/trainer/test_task_draw.py)
    cfg = config(regime="ensemble", ensemble=ENSEMBLE, group_size=4, batch_tasks=2, max_turns=2)
    assert cfg.ensemble_draw == "rollout"  # the default
    regime = make_regime(cfg, tmp_path, ModelCache(cfg))
    step1 = play_step(cfg, regime, 1, [0, 1], letters)
    step2 = play_step(cfg, regime, 2, [0, 1], letters)
    assert who(step1[0]) == ["a", "b", "c", "a"]  # positions 0..3
    assert who(step1[1]) == ["b", "c", "a", "b"]  # 4..7
    assert who(step2[0]) == ["c", "a", "b", "c"]  # 8..11
    assert who(step2[1]) == ["a", "b", "c", "a"]  # 12..15
    # each rollout records the member that played it
    assert [r.member for r in step2[1]] == who(step2[1])
    # a rank that plays only the step's second task draws the same members for it
    alone = play_step(cfg, regime, 1, [1], letters)
    assert who(alone[1]) == who(step1[1])


def test_ensemble_draws_per_task_give_a_whole_group_one_member(tmp_path, letters):
    cfg = config(
        regime="ensemble",
        ensemble=ENSEMBLE,
        ensemble_draw="task",
        group_size=3,
        batch_tasks=2,
        max_turns=2,
    )
    regime = make_regime(cfg, tmp_path, ModelCache(cfg))
    step1 = play_step(cfg, regime, 1, [0, 1], letters)
    step2 = play_step(cfg, regime, 2, [0, 1], letters)
    assert [who(step1[0]), who(step1[1])] == [["a"] * 3, ["b"] * 3]
    assert [who(step2[0]), who(step2[1])] == [["c"] * 3, ["a"] * 3]  # tasks 2 and 3 of the run
    assert who(play_step(cfg, regime, 2, [1], letters)[1]) == ["a"] * 3


def test_ensemble_metrics_are_per_member(tmp_path, letters):
    cfg = config(regime="ensemble", ensemble=ENSEMBLE, group_size=4, batch_tasks=2, max_turns=2)
    regime = make_regime(cfg, tmp_path, ModelCache(cfg))
    played = play_step(cfg, regime, 1, [0, 1], letters)
    rollouts = played[0] + played[1]  # the step's, in task order, as the trainer gathers them
    row = regime.metrics(1, rollouts)
    counts = {"a": 3, "b": 3, "c": 2}  # a b c a | b c a b
    for name, n in counts.items():
        assert row[f"ensemble/{name}/share"] == n / 8
        assert row[f"ensemble/{name}/reward"] == pytest.approx(REWARD[name])
        assert row[f"ensemble/{name}/success"] == (REWARD[name] > 0.2)
    # with more members than a step's rollouts, one that played none has a share and no reward
    small = config(
        regime="ensemble", ensemble=ENSEMBLE, ensemble_draw="task", group_size=2, max_turns=2
    )
    regime = make_regime(small, tmp_path, ModelCache(small))
    row = regime.metrics(1, play_step(small, regime, 1, [0], letters)[0])
    assert row["ensemble/a/share"] == 1.0 and row["ensemble/b/share"] == 0.0
    assert "ensemble/b/reward" not in row


def test_in_process_members_reseed_per_task_so_a_task_plays_the_same_on_any_rank(
    tiny_model, tmp_path, letters
):
    members = [
        {"name": "cold", "temperature": 0.7, "max_new_tokens": 4},
        {"name": "hot", "temperature": 1.5, "max_new_tokens": 4},
    ]
    cfg = config(
        regime="ensemble",
        ensemble=members,
        base_model=str(tiny_model),
        group_size=2,
        batch_tasks=2,
        max_turns=1,
    )
    regime = make_regime(cfg, tmp_path, ModelCache(cfg))

    def user_turns(indices):
        task = letters.scenarios("train")[0]
        with regime.simulator(1) as user:
            out = {i: _play_task(cfg, letters, task, i, 1, StubAgent(), user) for i in indices}
        return {i: [(r.member, r.conversation[0]["content"]) for r in rs] for i, rs in out.items()}

    both = user_turns([0, 1])
    assert [m for m, _ in both[1]] == ["cold", "hot"]
    assert user_turns([1]) == {1: both[1]}  # as a second rank would play it alone
    # each member's own generator (its choice draws, a Verbalized draw) was seeded for the task
    # the trainer began, by name: the same on any rank, and independent of the other member's
    for name, member in regime.members.items():
        wanted = random.Random(f"{cfg.seed}-1-1-user-{name}")
        assert member.rng.getstate() == wanted.getstate(), name


def test_an_ensembles_exploit_is_that_of_the_even_mixture():
    found = [
        {"tasks": ["t"], "expected_reward": {"ask $2": 1.0, "ask $1": 0.4}},
        {"tasks": ["t"], "expected_reward": {"ask $2": 0.0, "ask $1": 0.5}},
    ]
    mixed = mixture_exploit(found)
    assert mixed["expected_reward"] == {"ask $2": 0.5, "ask $1": 0.45}
    assert mixed["exploit"] == ["ask $2"]
    assert mixture_exploit([found[0], None]) is None  # a member with nothing exact to say


# -- Ensemble and Persona-Guided: what the config refuses ---------------------------------------


@pytest.mark.parametrize(
    ("extra", "key", "message"),
    [
        ({"regime": "ensemble"}, "ensemble", "needs K >= 2"),
        ({"regime": "ensemble", "ensemble": ENSEMBLE[:1]}, "ensemble", "needs K >= 2"),
        (
            {"regime": "ensemble", "ensemble": [ENSEMBLE[0], {**ENSEMBLE[1], "name": "a"}]},
            "ensemble",
            "need distinct names",
        ),
        (
            {
                "regime": "ensemble",
                "ensemble": [ENSEMBLE[0], {"name": "gpt", "endpoint": "http://h/v1", "model": "m"}],
                "heldout": [{"name": "same", "endpoint": "http://h/v1/", "model": "m"}],
            },
            "heldout[0]",
            "must share no weights with a simulator the agent trains against",
        ),
        (
            {
                "regime": "ensemble",
                "ensemble": [ENSEMBLE[0], {"name": "local", "model": "/models/x"}],
                "heldout": [{"name": "same", "model": "/models/x"}],
            },
            "heldout[0]",
            "must share no weights",
        ),
        ({"ensemble": ENSEMBLE}, "ensemble", 'is read only with regime = "ensemble"'),
        (
            {"regime": "ensemble", "ensemble": ENSEMBLE, "simulator": {"name": "gpt"}},
            "simulator",
            "must be left unset",
        ),
        ({"simulator": {"guidelines": "Be rude."}}, "simulator.guidelines", "is read only"),
        (
            {"regime": "persona", "heldout": [{"name": "h", "model": "/m", "guidelines": "x"}]},
            "heldout[0].guidelines",
            "is read only",
        ),
        ({"regime": "persona", "domain": "p4g"}, "simulator.guidelines", "must be set"),
        (
            {
                "regime": "persona",
                "simulator": {"kind": "scripted", "script": "steady", "guidelines": "x"},
            },
            "simulator.kind",
            'must be "plain" or "verbalized"',
        ),
    ],
)
def test_bad_supplies_are_refused_naming_the_key(extra, key, message):
    with pytest.raises(ConfigError, match=message) as error:
        config(**extra)
    assert error.value.key == key


def test_a_held_out_user_on_the_base_model_is_fine_when_no_member_runs_on_it():
    # the unused default `simulator` (the base model) is not a simulator the agent meets
    cfg = config(regime="ensemble", ensemble=ENSEMBLE, heldout=[{"name": "base"}])
    assert [s.name for s in cfg.training_simulators()] == ["a", "b", "c"]


# -- Persona-Guided: the prefix reaches the prompt ----------------------------------------------


def test_the_release_guidelines_are_the_tau2_default():
    cfg = parse_config({"name": "p", "domain": "retail", "regime": "persona"})
    (spec,) = cfg.training_simulators()
    assert spec.guidelines == PERSONA_GUIDELINES
    assert PERSONA_GUIDELINES.startswith("IMPORTANT behavioral guidelines for this conversation:")
    assert "Sometimes refuse to follow the agent's instructions" in PERSONA_GUIDELINES
    # airline's customer simulator gets the same text; a run may give its own
    assert parse_config({"name": "p", "domain": "airline", "regime": "persona"})
    own = parse_config(
        {"name": "p", "domain": "p4g", "regime": "persona", "simulator": {"guidelines": "Doubt."}}
    )
    assert own.training_simulators()[0].guidelines == "Doubt."


@pytest.fixture
def prompts(monkeypatch):
    """The decoded prompt of every sequence an in-process model sampled from."""
    seen: list[str] = []
    original = LocalModel.sample

    def recording(self, prompts, *args, **kwargs):
        seen.extend(self.tokenizer.decode(p) for p in prompts)
        return original(self, prompts, *args, **kwargs)

    monkeypatch.setattr(LocalModel, "sample", recording)
    return seen


def test_persona_guidelines_open_the_in_process_simulators_system_prompt(
    tiny_model, tmp_path, letters, prompts
):
    cfg = config(
        regime="persona",
        base_model=str(tiny_model),
        simulator={
            "guidelines": "Be curt. Change your mind.",
            "persona": "You are 70.",
            "max_new_tokens": 4,
        },
    )
    regime = make_regime(cfg, tmp_path, ModelCache(cfg))
    scenario = letters.scenarios("train")[0]
    with regime.simulator(1) as user:
        user.respond(letters, [Rollout.begin(letters, scenario)])
    (prompt,) = prompts
    system = "Be curt. Change your mind.\n\nYou want words about topic 0.\n\nYou are 70."
    assert f"<|im_start|>system\n{system}<|im_end|>" in prompt


def test_persona_guidelines_open_the_endpoint_simulators_system_prompt(tmp_path):
    retail = get_domain("retail")
    scenario = retail.scenarios("train")[0]
    with ScriptedServer([{"content": "I need to return a lamp."}]) as chat:
        cfg = parse_config(
            {
                "name": "p",
                "domain": "retail",
                "regime": "persona",
                "simulator": {"endpoint": chat.url, "model": "gpt-5-mini"},
            }
        )
        regime = make_regime(cfg, tmp_path, ModelCache(cfg))
        rollout = Rollout.begin(retail, scenario)
        with regime.simulator(1) as user:
            user.respond(retail, [rollout])
        user.close()
    system = chat.requests[0]["messages"][0]
    assert system["role"] == "system"
    assert system["content"] == (
        PERSONA_GUIDELINES + "\n\n" + retail.simulator_system_prompt(scenario)
    )
    assert rollout.conversation[-1] == {"role": "user", "content": "I need to return a lamp."}


# -- one short run of each supply, end to end -----------------------------------------------------


def rows(cfg):
    return [json.loads(x) for x in (cfg.run_dir() / "metrics.jsonl").read_text().splitlines()]


def short_run(tiny_model, tmp_path, **extra):
    return parse_config(
        {
            "name": "supply-run",
            "domain": "letters",
            "base_model": str(tiny_model),
            "steps": 2,
            "group_size": 4,
            "lr": 1e-2,
            "max_new_tokens": 6,
            "max_turns": 2,
            "micro_batch": 8,
            "tasks": {"max_eval": 1},
            "output_dir": str(tmp_path / "run"),
            "threads": 1,
            "heldout": [{"name": "steady", "kind": "scripted", "script": "steady"}],
            **extra,
        }
    )


def test_an_ensemble_run_trains_end_to_end(tiny_model, tmp_path, letters):
    torch.manual_seed(0)
    members = [{"name": "tiny", "max_new_tokens": 4}, ENSEMBLE[0]]
    cfg = short_run(tiny_model, tmp_path, regime="ensemble", ensemble=members)
    saved = train(cfg, domain=letters, show_progress=False)
    logged = rows(cfg)
    assert [r["step"] for r in logged] == [1, 2] and saved
    for row in logged:
        # G = 4 over K = 2 in rotation: each member plays half of every group
        assert row["ensemble/tiny/share"] == row["ensemble/a/share"] == 0.5
        assert {"ensemble/tiny/reward", "ensemble/a/reward"} <= set(row)
        mean = (row["ensemble/tiny/reward"] + row["ensemble/a/reward"]) / 2
        assert mean == pytest.approx(row["reward_mean"])
    assert logged[-1]["optimizer_steps"] >= 1
    assert "heldout/steady/reward" in logged[-1]  # the panel is as before
    samples = [json.loads(x) for x in (cfg.run_dir() / "samples.jsonl").read_text().splitlines()]
    # position 0 (the first logged sample) meets the first member, the tiny model
    assert samples[0]["conversation"][0]["content"] != REMARKS["anchored"]


def test_a_persona_guided_run_trains_end_to_end(tiny_model, tmp_path, letters, prompts):
    torch.manual_seed(0)
    cfg = short_run(
        tiny_model,
        tmp_path,
        regime="persona",
        simulator={"guidelines": "Be curt.", "max_new_tokens": 4},
    )
    train(cfg, domain=letters, show_progress=False)
    assert [r["step"] for r in rows(cfg)] == [1, 2]
    assert rows(cfg)[-1]["optimizer_steps"] >= 1
    simulator = [p for p in prompts if "You want words about" in p]
    assert simulator and all("<|im_start|>system\nBe curt.\n\nYou want" in p for p in simulator)
    agent = [p for p in prompts if "Write words about" in p]
    assert agent and not any("Be curt." in p for p in agent)  # only the simulator's prompt


# -- names: declared once, the paper's words ------------------------------------------------------


def test_the_regimes_carry_the_papers_names():
    assert dict(Regime.choices()) == {
        "single": "RL single simulator",
        "persona": "Persona-Guided",
        "ensemble": "Ensemble",
        "verbalized": "Verbalized Sampling",
        "cotrain": "Self-Play (co-training)",
        "population": "Population Self-Play",
    }
    from training.regimes.regime import CLASSES

    assert list(CLASSES) == list(Regime)  # a class per declared regime, each naming its member
    assert [r for r in Regime if r.trains_simulator] == [Regime.COTRAIN, Regime.POPULATION]


def test_the_registry_decides_a_regimes_simulator_kind_for_the_config_and_the_admin():
    """Verbalized Sampling's regime is made of a verbalized simulator: the admin fills it in and
    the config refuses any other, both from Regime.simulator_kind."""
    from training.models import TrainingRun

    assert {r: r.simulator_kind for r in Regime if r.simulator_kind} == {
        Regime.VERBALIZED: "verbalized"
    }
    run = TrainingRun(name="vs", domain="p4g", regime="verbalized", settings={})
    assert run.overrides()["simulator.kind"] == "verbalized"
    with pytest.raises(ConfigError, match='must be "verbalized" for regime = "verbalized"'):
        parse_config({"name": "vs", "domain": "p4g", "regime": "verbalized"})


@pytest.mark.django_db
def test_the_admin_offers_every_regime_with_the_papers_label(admin_client):
    from django.urls import reverse

    from training.models import TrainingRun

    assert TrainingRun._meta.get_field("regime").choices == Regime.choices()
    page = admin_client.get(reverse("admin:training_trainingrun_add")).content.decode()
    for name, label in Regime.choices():  # the default, single, is the selected one
        selected = " selected" if name == "single" else ""
        assert f'<option value="{name}"{selected}>{label}</option>' in page


@pytest.mark.django_db
def test_an_admin_ensemble_run_from_a_preset_clears_the_presets_simulator():
    from training.models import TrainingRun

    run = TrainingRun(
        name="ens",
        preset="p4g-single-cpu",
        regime="ensemble",
        settings={"ensemble": ENSEMBLE, "ensemble_draw": "task"},
    )
    cfg = run.config()
    assert [s.name for s in cfg.training_simulators()] == ["a", "b", "c"]
    assert cfg.ensemble_draw == "task"
    persona = TrainingRun(name="pg", preset="retail-single-cpu", domain="retail", regime="persona")
    persona = persona.config()
    assert persona.training_simulators()[0].guidelines == PERSONA_GUIDELINES


# -- what else reads the training simulator ------------------------------------------------------


def test_an_ensembles_exploit_file_is_the_mixture_of_its_members(tiny_model, tmp_path):
    """On the P4G decision episode the exploit is exact: the run's exploit.json averages each
    ask's expected reward over the members (scripted types here, whose answers are known)."""
    from training.measures.collapse import simulator_exploit
    from training.regimes.regime import frozen_simulator

    decision = get_domain("p4g-decision")
    members = [{"name": s, "kind": "scripted", "script": s} for s in ("anchored", "reactant")]
    cfg = parse_config(
        {
            "name": "decide",
            "domain": "p4g-decision",
            "regime": "ensemble",
            "ensemble": members,
            "base_model": str(tiny_model),
            "steps": 1,
            "group_size": 2,
            "max_turns": 2,
            "micro_batch": 4,
            "tasks": {"max_train": 2, "max_eval": 1},
            "output_dir": str(tmp_path / "run"),
            "threads": 1,
        }
    )
    train(cfg, show_progress=False)
    found = json.loads((cfg.run_dir() / "exploit.json").read_text())
    tasks = decision.scenarios("train")[:2]
    each = [
        simulator_exploit(decision, tasks, frozen_simulator(s, None, 0))["expected_reward"]
        for s in cfg.ensemble
    ]
    assert found["members"] == each
    for ask, value in found["expected_reward"].items():
        assert value == pytest.approx((each[0][ask] + each[1][ask]) / 2)
    row = rows(cfg)[0]
    assert row["ensemble/anchored/share"] == row["ensemble/reactant/share"] == 0.5


def test_the_dry_run_checks_every_ensemble_member():
    from training.tools.dryrun import endpoints, sequence_length

    hosted = [
        {"name": "gpt", "endpoint": "http://a/v1", "model": "gpt-5-mini", "max_new_tokens": 64},
        {
            "name": "haiku",
            "endpoint": "http://b/v1",
            "model": "claude",
            "api_key_env": "KEY",
            "max_new_tokens": 200,
        },
    ]
    cfg = config(regime="ensemble", ensemble=hosted)
    assert endpoints(cfg) == [
        ("ensemble gpt", "http://a/v1", "gpt-5-mini", ""),
        ("ensemble haiku", "http://b/v1", "claude", "KEY"),
    ]
    short = config(regime="ensemble", ensemble=[hosted[0], {**hosted[1], "max_new_tokens": 64}])
    assert sequence_length(cfg) > sequence_length(short)  # the longest member's replies count


ENSEMBLE_RUN = """
name = "ddp-ensemble"
domain = "p4g-decision"
regime = "ensemble"
base_model = "{model}"
steps = 2
group_size = 4
batch_tasks = 2              # one task's group per rank
lr = 1e-2
temperature = 1.0
max_new_tokens = 8
max_turns = 2
micro_batch = 4
save_every = 2
threads = 1
[tasks]
max_train = 4
[[ensemble]]
name = "anchored"
kind = "scripted"
script = "anchored"
[[ensemble]]
name = "reactant"
kind = "scripted"
script = "reactant"
[[ensemble]]
name = "steady"
kind = "scripted"
script = "steady"
"""


def test_an_ensemble_run_gives_the_same_result_on_two_processes(
    smooth_tiny_model,  # noqa: F811 (the fixture imported above)
    tmp_path,
):
    """The members' draws (each persuadee's donation is drawn from its own generator) and the
    rotation are per (step, task, rollout): rank 1 playing the step's second task alone draws
    what one process does, so the per-member metrics and the adapter are the same."""
    path = tmp_path / "ensemble.toml"
    path.write_text(ENSEMBLE_RUN.format(model=smooth_tiny_model))
    one, two = one_and_two(path, tmp_path)
    assert_same(adapter(one, 2), adapter(two, 2))
    for row, ref in zip(metrics(two), metrics(one), strict=True):
        per_member = {k: v for k, v in ref.items() if k.startswith("ensemble/")}
        assert len(per_member) == 9  # share, reward and success of each of the 3 members
        assert {k: row[k] for k in per_member} == pytest.approx(per_member)
        assert sum(v for k, v in per_member.items() if k.endswith("/share")) == pytest.approx(1)
