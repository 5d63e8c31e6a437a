"""The register of environment variables (agents/environment.py): each declared variable is
parsed as its kind, takes its default when unset or blank, and a bad value is refused with an
error that names the variable, what it must be and what it got."""

from pathlib import Path

import parley.settings  # noqa: F401  (declares the site's variables)
import pytest
from parley import audit

from agents import environment, paths
from agents.domains.cooperbench import domain as cooperbench
from agents.environment import REGISTER, InvalidSetting, Setting
from agents.serving import fleet
from training import __main__ as training_main
from training.rl import distributed


def declared(kind: str, default, **bounds) -> Setting:
    """A variable that is not in the register (the register is the product's own)."""
    return Setting("PARLEY_TEST_VARIABLE", kind, default, "a test's", __name__, **bounds)


@pytest.mark.parametrize(
    "kind, default, bounds, raw, value",
    [
        ("int", 1, {"least": 1}, "4", 4),
        ("float", 120.0, {"above": 0}, "2.5", 2.5),
        ("bool", True, {}, "off", False),
        ("bool", False, {}, "yes", True),
        ("str", "parley", {}, " keep spaces ", " keep spaces "),
        ("names", ("127.0.0.1",), {}, "10.0.0.1, ,10.0.0.2", ("10.0.0.1", "10.0.0.2")),
        ("path", None, {}, "/srv/parley", Path("/srv/parley")),
        ("url", "", {}, "redis://127.0.0.1:6379/12", "redis://127.0.0.1:6379/12"),
        ("choice", "refuse", {"choices": ("refuse", "warn")}, "warn", "warn"),
    ],
)
def test_a_set_variable_is_parsed_as_its_kind(monkeypatch, kind, default, bounds, raw, value):
    monkeypatch.setenv("PARLEY_TEST_VARIABLE", raw)
    assert declared(kind, default, **bounds).read() == value


@pytest.mark.parametrize("blank", [None, "", "  "])
def test_unset_or_blank_is_the_default_but_a_blank_list_is_empty(monkeypatch, blank):
    if blank is None:
        monkeypatch.delenv("PARLEY_TEST_VARIABLE", raising=False)
    else:
        monkeypatch.setenv("PARLEY_TEST_VARIABLE", blank)
    assert declared("float", 120.0, above=0).read() == 120.0
    assert declared("path", None).read(default=Path("data")) == Path("data")
    names = declared("names", ("127.0.0.1", "::1")).read()
    assert names == (("127.0.0.1", "::1") if blank is None else ())


@pytest.mark.parametrize(
    "name, raw, message",
    [
        ("PARLEY_LLM_TIMEOUT", "abc", "PARLEY_LLM_TIMEOUT must be a number above 0 (got 'abc')."),
        ("PARLEY_LLM_TIMEOUT", "0", "PARLEY_LLM_TIMEOUT must be a number above 0 (got '0')."),
        ("PROLIFIC_TIMEOUT", "-1", "PROLIFIC_TIMEOUT must be a number of 0 or more (got '-1')."),
        ("PARLEY_PORT", "80800", "PARLEY_PORT must be a whole number from 1 to 65535 (got '80800')."),
        ("PARLEY_LOGIN_WINDOW", "15m", "PARLEY_LOGIN_WINDOW must be a whole number of 1 or more (got '15m')."),
        ("PARLEY_AUDIT_STRICT", "sometimes", "PARLEY_AUDIT_STRICT must be a yes or no: 1/0, true/false, yes/no or on/off (got 'sometimes')."),
        ("PARLEY_SANDBOX", "podman", "PARLEY_SANDBOX must be one of local, docker (got 'podman')."),
        ("PARLEY_PUBLIC_URL", "study.example.org", "PARLEY_PUBLIC_URL must be a URL (scheme://...) (got 'study.example.org')."),
        ("WORLD_SIZE", "two", "WORLD_SIZE must be a whole number of 1 or more (got 'two')."),
        ("RANK", "-1", "RANK must be a whole number of 0 or more (got '-1')."),
    ],
)  # fmt: skip  # a table: one variable, bad value and message a line
def test_a_bad_value_names_the_variable_the_rule_and_the_value(monkeypatch, name, raw, message):
    monkeypatch.setenv(name, raw)
    with pytest.raises(InvalidSetting) as refused:
        REGISTER[name].read()
    assert str(refused.value) == message
    assert isinstance(refused.value, ValueError)  # where a ValueError was raised before


def test_defaults_are_todays(monkeypatch):
    """Unset, each variable read outside Django gives what the code gave before the register."""
    for name in ("PARLEY_DATA_DIR", "PARLEY_BASE_MODEL", "PARLEY_VLLM_PYTHON", "PARLEY_SANDBOX"):
        monkeypatch.delenv(name, raising=False)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "PARLEY_AUDIT_STRICT"):
        monkeypatch.delenv(name, raising=False)
    assert paths.data_dir() == paths.REPO_DIR / "data"
    assert paths.base_model_dir() == paths.REPO_DIR / "data" / "models" / paths.BASE_MODEL_NAME
    assert paths.vllm_python() == paths.REPO_DIR / ".venv-vllm" / "bin" / "python"
    assert cooperbench.PARLEY_SANDBOX.read() == "local"
    assert training_main.RANK.read() == 0
    assert distributed.WORLD_SIZE.read() == 1
    assert not distributed.LOCAL_RANK.is_set()
    assert audit.PARLEY_AUDIT_STRICT.read() is False


def test_set_values_reach_the_readers(monkeypatch, tmp_path):
    monkeypatch.setenv("PARLEY_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("PARLEY_BASE_MODEL", raising=False)
    assert paths.data_dir() == tmp_path
    assert paths.base_model_dir() == tmp_path / "models" / paths.BASE_MODEL_NAME
    monkeypatch.setenv("PARLEY_AUDIT_STRICT", "1")
    assert audit.PARLEY_AUDIT_STRICT.read() is True
    # Set at all, even blank, leaves vLLM's binding alone (as `in os.environ` did).
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "")
    assert fleet.cpu_binds(2) == [{}, {}]


def test_a_variable_is_declared_by_one_module():
    with pytest.raises(ValueError, match="PARLEY_LLM_TIMEOUT is declared twice"):
        environment.setting("PARLEY_LLM_TIMEOUT", "float", 1.0, help="a second reader's")


def test_a_kind_the_register_does_not_know_is_refused():
    with pytest.raises(ValueError, match="kind 'seconds' is not one of"):
        environment.setting("PARLEY_TEST_VARIABLE", "seconds", 1, help="a test's")
    assert "PARLEY_TEST_VARIABLE" not in REGISTER
