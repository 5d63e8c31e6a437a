"""Every value the run config accepts for regime, simulator kind, draw mode and scripted type
builds the simulator the trainer would build, and that simulator plays a turn as its kind says.
A value the config accepts but the simulator code does not know fails here, not at start-up."""

import typing

import pytest
import torch

from agents.simulators import parse_verbalized
from agents.simulators.scripted import REMARKS
from agents.simulators.spec import SimulatorSpec
from training.config import RunConfig
from training.config_keys import ConfigError
from training.regimes.choose import make_regime
from training.regimes.regime import ModelCache, frozen_simulator
from training.rl.policy import LocalModel
from training.rollouts.rollout import Rollout


def accepted(table: type, field: str) -> tuple[str, ...]:
    """The names a declared field accepts ("" = unset is not a name)."""
    return tuple(v for v in typing.get_args(table.__pydantic_fields__[field].annotation) if v)


SPECS = [
    (kind, draw, script)
    for kind in accepted(SimulatorSpec, "kind")
    for draw in accepted(SimulatorSpec, "draw")
    for script in (accepted(SimulatorSpec, "script") if kind == "scripted" else ("",))
]


def spec(kind: str, draw: str, script: str, **extra) -> dict:
    # k = 2 short candidates: a random model under the schema constraint finishes the JSON
    data = {"name": f"{kind}-{draw}-{script}", "kind": kind, "draw": draw, "k": 2, "retries": 0,
            "max_new_tokens": 120 if kind == "verbalized" else 6, **extra}  # fmt: skip
    return data | ({"script": script} if script else {})


@pytest.fixture
def samples(monkeypatch):
    """Every text an in-process model sampled (the agent's and the simulators')."""
    texts: list[str] = []
    original = LocalModel.sample

    def recording(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        texts.extend(self.decode(ids) for ids in out)
        return out

    monkeypatch.setattr(LocalModel, "sample", recording)
    return texts


def said_as(kind: str, script: str, text: str, sampled: list[str]) -> bool:
    """Whether the user's message is what a simulator of this kind says."""
    if kind == "plain":  # the model's own reply
        return text.strip() in {s.strip() for s in sampled}
    if kind == "verbalized":  # one of the k candidates the model wrote
        return any(text == c.text for s in sampled for c in _candidates(s))
    if kind == "scripted":  # the persuadee type's remark (the toy task asks for no decision)
        return text == REMARKS[script]
    raise AssertionError(f"the config accepts simulator kind {kind!r}: say what it does here")


def _candidates(text: str) -> list:
    try:
        return parse_verbalized(text, 2)
    except ValueError:
        return []


def play_one_turn(user, letters, samples) -> list[Rollout]:
    samples.clear()
    rollouts = [Rollout.begin(letters, s) for s in letters.scenarios("train")]
    user.respond(letters, rollouts)
    return rollouts


def check_turn(rollouts, kind, script, sampled, where):
    spoke = [r for r in rollouts if not r.fallbacks]
    assert spoke, f"{where}: every reply fell back to raw text, so nothing was drawn"
    for r in spoke:
        assert said_as(kind, script, r.conversation[-1]["content"], sampled), where


def test_the_trainer_builds_every_simulator_and_regime_the_config_accepts(
    tiny_model, tmp_path, letters, samples
):
    torch.manual_seed(0)
    models = None
    built = set()
    for regime in accepted(RunConfig, "regime"):
        for kind, draw, script in SPECS:
            simulator = {"simulator": spec(kind, draw, script)}
            if regime == "persona":  # the toy Domain has no default guidelines
                simulator["simulator"]["guidelines"] = "Be brief."
            if regime == "ensemble":  # K = 2 members of this kind
                simulator = {"ensemble": [spec(kind, draw, script) | {"name": n} for n in "ab"]}
            try:
                config = RunConfig.from_dict({
                    "name": "vocab", "domain": "letters", "regime": regime,
                    "base_model": str(tiny_model), **simulator,
                })  # fmt: skip
            except ConfigError:
                continue  # a combination the config refuses (e.g. a scripted co-trainee)
            models = models or ModelCache(config)  # one copy of the tiny model for all
            trainer = make_regime(config, tmp_path / regime, models)
            with trainer.simulator(1) as user:
                rollouts = play_one_turn(user, letters, samples)
            check_turn(rollouts, kind, script, samples, f"{regime} x {kind} x {draw} {script}")
            built.add((regime, kind, draw, script))
    assert {r for r, *_ in built} == set(accepted(RunConfig, "regime"))
    assert {(k, d, s) for _, k, d, s in built} == set(SPECS)


def test_every_held_out_simulator_the_config_accepts_is_built(
    tiny_model, other_tiny_model, letters, samples
):
    torch.manual_seed(0)
    panel = [spec(k, d, s) | ({} if k == "scripted" else {"model": str(other_tiny_model)})
             for k, d, s in SPECS]  # fmt: skip
    config = RunConfig.from_dict(
        {"name": "vocab", "domain": "letters", "base_model": str(tiny_model), "heldout": panel}
    )
    models = ModelCache(config)
    for held_out, (kind, draw, script) in zip(config.heldout, SPECS, strict=True):
        user = frozen_simulator(held_out, models, config.seed)
        rollouts = play_one_turn(user, letters, samples)
        check_turn(rollouts, kind, script, samples, f"held-out {kind} x {draw} {script}")
