"""Every value the run config accepts for regime, simulator kind, draw mode and scripted type
builds the simulator the trainer would build, and that simulator plays a turn as its kind says.
A value the config accepts but the simulator code does not know fails here, not at start-up.
And each vocabulary is declared once: training's in training/vocabulary.py, the config's fields
take theirs from there, and a table keyed by one has exactly its names."""

import ast
import typing
from pathlib import Path

import pytest
import torch

from agents.domains.tau2.taskset import TAU2_DOMAINS
from agents.llm.native_tools import TRAINED_TOOL_FORMATS
from agents.serving.vllm import WEIGHT_TRANSFER_BACKENDS
from agents.simulators import parse_verbalized
from agents.simulators.scripted import REMARKS
from agents.simulators.scripted import TYPES as SCRIPTED_TYPES
from agents.simulators.spec import SIMULATOR_SAMPLINGS, SimulatorKind, SimulatorSpec
from agents.simulators.verbalized import MODES as DRAW_MODES
from training import vocabulary
from training.config import parse_config
from training.config_keys import ConfigError
from training.config_schema import DistributedSpec, RunConfig, ScenarioSpec
from training.measures import curation
from training.regimes.choose import make_regime
from training.regimes.regime import ModelCache, frozen_simulator
from training.rl import grpo, policy
from training.rl.policy import LocalModel
from training.rollouts.rollout import Rollout
from training.tools import dryrun
from training.vocabulary import Regime


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
    data = {
        "name": f"{kind}-{draw}-{script}",
        "kind": kind,
        "draw": draw,
        "k": 2,
        "retries": 0,
        "max_new_tokens": 120 if kind == "verbalized" else 6,
        **extra,
    }
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
                config = parse_config(
                    {
                        "name": "vocab",
                        "domain": "letters",
                        "regime": regime,
                        "base_model": str(tiny_model),
                        **simulator,
                    }
                )
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
    panel = [
        spec(k, d, s) | ({} if k == "scripted" else {"model": str(other_tiny_model)})
        for k, d, s in SPECS
    ]
    config = parse_config(
        {"name": "vocab", "domain": "letters", "base_model": str(tiny_model), "heldout": panel}
    )
    models = ModelCache(config)
    for held_out, (kind, draw, script) in zip(config.heldout, SPECS, strict=True):
        user = frozen_simulator(held_out, models, config.seed)
        rollouts = play_one_turn(user, letters, samples)
        check_turn(rollouts, kind, script, samples, f"held-out {kind} x {draw} {script}")


# -- each vocabulary declared once (cheap: the source is read, no model is built) -----------------

ROOT = Path(__file__).resolve().parents[2]
# hashed by a pre-registration (training/collapse3/, collapse2/flat_prior.py): never edited, so
# not held to this
HASHED = ("training/collapse3/", "training/collapse2/flat_prior.py")


def vocabularies_declared() -> dict[str, tuple[str, frozenset[str]]]:
    """name -> (where it is declared, the names it holds): training/vocabulary.py's and the
    agents vocabularies training validates with or reads."""
    found = {
        name: ("training/vocabulary.py", frozenset(map(str, value)))
        for name, value in vars(vocabulary).items()
        if name.isupper() and isinstance(value, tuple | dict)
    }
    found["Regime"] = ("training/vocabulary.py", frozenset(Regime))
    found["SimulatorKind"] = ("agents/simulators/spec.py", frozenset(SimulatorKind))
    found["TAU2_DOMAINS"] = ("agents/domains/tau2/taskset.py", frozenset(TAU2_DOMAINS))
    found["DRAW_MODES"] = ("agents/simulators/verbalized.py", frozenset(DRAW_MODES))
    found["SCRIPTED_TYPES"] = ("agents/simulators/scripted.py", frozenset(SCRIPTED_TYPES))
    found["SIMULATOR_SAMPLINGS"] = ("agents/simulators/spec.py", frozenset(SIMULATOR_SAMPLINGS))
    found["TRAINED_TOOL_FORMATS"] = ("agents/llm/native_tools.py", frozenset(TRAINED_TOOL_FORMATS))
    found["WEIGHT_TRANSFER_BACKENDS"] = (
        "agents/serving/vllm.py",
        frozenset(WEIGHT_TRANSFER_BACKENDS),
    )
    return found


def training_sources() -> list[tuple[str, ast.Module]]:
    files = sorted((ROOT / "training").rglob("*.py"))
    paths = [f.relative_to(ROOT).as_posix() for f in files]
    return [
        (p, ast.parse(f.read_text()))
        for p, f in zip(paths, files, strict=True)
        if not p.startswith(HASHED) and "/migrations/" not in p
    ]


def names_listed(tree: ast.Module):
    """Every tuple, list or set of two or more string constants, and every Literal[...] of them
    (its names, its line): the shapes a vocabulary is declared in. A dict's keys are not: a dict
    keyed by names is a table over a vocabulary (grpo.REDUCERS), held to it below."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and getattr(node.value, "id", "") == "Literal":
            items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        elif isinstance(node, ast.Tuple | ast.List | ast.Set):
            items = node.elts
        else:
            continue
        names = [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)]
        if len(names) >= 2 and len(names) == len(items):
            yield frozenset(names), node.lineno


def test_no_vocabulary_is_declared_twice_in_training():
    """A vocabulary's names listed again elsewhere in training (a tuple, a Literal), or one of
    training/vocabulary.py's names assigned again, is a second declaration that can drift."""
    declared = vocabularies_declared()
    by_names = {names: name for name, (_, names) in declared.items()}
    again = []
    for path, tree in training_sources():
        if path == "training/vocabulary.py":
            continue
        for names, line in names_listed(tree):
            if names in by_names:
                name = by_names[names]
                again.append(f"{path}:{line} lists {name}, declared in {declared[name][0]}")
        for node in tree.body:
            targets = (
                node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            )
            for t in targets:
                if (
                    isinstance(t, ast.Name)
                    and declared.get(t.id, ("",))[0] == "training/vocabulary.py"
                ):
                    again.append(f"{path}:{node.lineno} assigns {t.id} again")
    again = sorted(set(again))  # a Literal's names are its tuple's too
    assert not again, "declare each vocabulary once:\n" + "\n".join(again)


def test_the_finder_sees_a_second_declaration():
    """The check above finds the shapes a copy takes (so a pass means none is there)."""
    copy = ast.parse(
        'GATES = ("fallback", "empty", "cut", "parse")\nK = Literal["k1", "k2", "k3"]\n'
    )
    assert {n for n, _ in names_listed(copy)} == {
        frozenset(vocabulary.CURATION_GATES),
        frozenset(vocabulary.KL_ESTIMATOR_NAMES),
    }


def test_the_tables_over_a_vocabulary_have_its_names():
    """A table keyed by a vocabulary's names (the formulas, the torch dtypes, the dry run's bytes)
    has a row for each name and no other."""
    tables = {
        "grpo.KL_ESTIMATORS": (grpo.KL_ESTIMATORS, vocabulary.KL_ESTIMATOR_NAMES),
        "grpo.REDUCERS": (grpo.REDUCERS, vocabulary.LOSS_REDUCTIONS),
        "policy.TORCH_DTYPES": (policy.TORCH_DTYPES, vocabulary.DTYPES),
        "dryrun.BYTES": (dryrun.BYTES, vocabulary.DTYPES),
        "dryrun.EPSILON": (dryrun.EPSILON, vocabulary.DTYPES),
        "curation.GATES": (curation.GATES, vocabulary.CURATION_GATES),
    }
    for where, (table, names) in tables.items():
        assert tuple(table) == tuple(names), where


def test_the_config_accepts_each_vocabulary_as_declared():
    """RunConfig's fields take their names from the vocabularies, in their order."""
    fields = {
        "regime": tuple(Regime),
        "ensemble_draw": vocabulary.ENSEMBLE_DRAWS,
        "task_draw": vocabulary.TASK_DRAWS,
        "heldout_users": vocabulary.HELDOUT_USERS,
        "simulator_update": vocabulary.SIMULATOR_UPDATES,
        "loss_reduction": vocabulary.LOSS_REDUCTIONS,
        "kl_estimator": vocabulary.KL_ESTIMATOR_NAMES,
        "simulator_reward": vocabulary.SIMULATOR_REWARDS,
        "finetune": vocabulary.FINETUNE,
        "dtype": vocabulary.DTYPES,
        "weight_sync_backend": vocabulary.WEIGHT_SYNC_BACKENDS,
    }
    for field, names in fields.items():
        assert accepted(RunConfig, field) == tuple(names), field
    assert accepted(DistributedSpec, "strategy") == vocabulary.DISTRIBUTED_STRATEGIES
    assert accepted(ScenarioSpec, "eval_draw") == tuple(vocabulary.EVAL_DRAWS)
    assert set(vocabulary.WEIGHT_SYNC_BACKENDS) == {"auto", *WEIGHT_TRANSFER_BACKENDS}
