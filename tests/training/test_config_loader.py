"""The one loader: a TOML file, `--set` overrides and dicts all enter through parse_config, and
every refusal names the key, the value given and what is allowed."""

import dataclasses

import pydantic
import pytest

from agents.simulators.spec import SimulatorSpec
from training.__main__ import main
from training.config import load_config, parse_config
from training.config_keys import ConfigError, parse_assignment
from training.config_schema import RunConfig

BASE = {"name": "r", "domain": "p4g"}
SCRIPTED = {"name": "steady", "kind": "scripted", "script": "steady"}


@pytest.mark.parametrize(
    ("data", "key", "message"),
    [
        (
            {**BASE, "heldout": [SCRIPTED, {"name": "vs", "model": "/m", "draw": "random"}]},
            "heldout[1].draw",
            "heldout[1].draw must be one of probability, uniform (got 'random')",
        ),
        ({**BASE, "lora": {"r": 0}}, "lora.r", "lora.r must be >= 1 (got 0)"),
        ({**BASE, "domain": "p5g"}, "domain", "domain must be one of retail, airline, p4g"),
        ({**BASE, "steps": "1"}, "steps", "steps must be int (got '1')"),
        ({**BASE, "steps": True}, "steps", "steps must be int (got True)"),
        ({**BASE, "lr": True}, "lr", "lr must be float (got True)"),
        ({**BASE, "name": " "}, "name", "name must not be empty (got ' ')"),
        ({**BASE, "lora": {"targets": []}}, "lora.targets", "lora.targets must not be empty"),
        ({**BASE, "simulator": 3}, "simulator", "simulator must be a table (got 3)"),
        (
            {**BASE, "lora": {"rank": 4}},
            "lora.rank",
            "unknown key 'lora.rank' (got 4; known: alpha, dropout, lr_scale, r, targets)",
        ),
        (
            {**BASE, "heldout": [SCRIPTED, SCRIPTED]},
            "heldout",
            "heldout need distinct names (got ['steady', 'steady'])",
        ),
    ],
)
def test_a_refusal_names_key_value_and_what_is_allowed(data, key, message):
    with pytest.raises(ConfigError) as error:
        parse_config(data)
    assert isinstance(error.value, ValueError) and error.value.key == key
    assert message in str(error.value)


def test_an_int_is_a_float_where_a_float_is_declared():
    config = parse_config({**BASE, "lr": 1, "simulator": {"temperature": 1}})
    assert config.lr == 1.0 and isinstance(config.lr, float)
    assert isinstance(config.simulator.temperature, float)


def test_overrides_reach_into_tables_and_arrays_and_are_checked_with_the_file(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(
        'name = "r"\ndomain = "p4g"\n[[heldout]]\nname = "a"\nkind = "scripted"\n'
        'script = "steady"\n'
    )
    config = load_config(path, {"lora.r": 4, "heldout[0].script": "reactant", "steps": 3})
    assert (config.lora.r, config.heldout[0].script, config.steps) == (4, "reactant", 3)
    with pytest.raises(ConfigError, match=r"^heldout\[0\].script must be one of anchored"):
        load_config(path, {"heldout[0].script": "nobody"})  # no file prefix: the file is fine
    with pytest.raises(ConfigError, match="heldout\\[1\\] is not in this config"):
        load_config(path, {"heldout[1].draw": "uniform"})


def test_a_command_line_value_is_toml_or_a_bare_string():
    assert parse_assignment("steps=3") == ("steps", 3)
    assert parse_assignment("lr=1e-4") == ("lr", 1e-4)
    assert parse_assignment("simulator.draw=uniform") == ("simulator.draw", "uniform")
    assert parse_assignment('name="7"') == ("name", "7")
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_assignment("steps")


def test_cli_set_goes_through_the_loader(tmp_path, capsys):
    path = tmp_path / "run.toml"
    # were an override let through, training would stop at once on the missing model
    path.write_text(
        f'name = "r"\ndomain = "p4g"\nbase_model = "{tmp_path / "none"}"\n'
        f'output_dir = "{tmp_path / "out"}"\n'
    )
    assert main(["run", str(path), "--set", "simulator.draw=random"]) == 2
    assert "simulator.draw must be one of probability, uniform (got 'random')" in (
        capsys.readouterr().err
    )
    assert main(["run", str(path), "--set", "steps=true"]) == 2
    assert "steps must be int (got True)" in capsys.readouterr().err


def test_cli_help_lists_the_vocabularies(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert (
        "regimes: single (RL single simulator), persona (Persona-Guided), ensemble (Ensemble),"
        " verbalized (Verbalized Sampling), cotrain (Self-Play (co-training)), population"
        " (Population Self-Play)" in help_text
    )
    assert "domains: retail, airline, p4g, p4g-decision" in help_text
    assert "draw modes: probability, uniform" in help_text


def test_replace_checks_again():
    """dataclasses.replace (the experiment's per-regime configs) runs the same checks."""
    config = parse_config(BASE)
    assert dataclasses.replace(config, regime="cotrain").trains_simulator
    with pytest.raises(pydantic.ValidationError, match='must be "verbalized"'):
        dataclasses.replace(config, regime="verbalized")
    with pytest.raises(pydantic.ValidationError):
        SimulatorSpec(draw="random")


def test_every_field_has_its_help():
    for table in (
        RunConfig,
        SimulatorSpec,
        *(type(v) for v in vars(parse_config(BASE)).values() if dataclasses.is_dataclass(v)),
    ):
        for name, info in table.__pydantic_fields__.items():
            assert info.description, f"{table.__name__}.{name}"
