from pathlib import Path

import pytest

from training.__main__ import main
from training.config import load_config, parse_config
from training.config_keys import ConfigError

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "training" / "configs").glob("**/*.toml"))
MINIMAL = 'name = "r"\ndomain = "p4g"\n'


def write(tmp_path, text):
    path = tmp_path / "run.toml"
    path.write_text(text)
    return path


def test_every_shipped_config_loads():
    assert {c.stem for c in CONFIGS} >= {
        f"{d}-{r}-cpu"
        for d in ("p4g", "retail")
        for r in ("single", "verbalized", "cotrain", "population")
    } | {"p4g-ensemble-cpu", "retail-persona-cpu"}
    for path in CONFIGS:
        config = load_config(path)
        if path.parent.name == "paper":  # paper scale (test_paper.py): a hosted panel
            agent = "Qwen3.5-27B" if config.domain == "cooperbench" else "Qwen3-4B-Instruct-2507"
            assert Path(config.base_model).name == agent
            assert {s.api_key_env for s in config.heldout} <= {
                "OPENAI_API_KEY",
                "OPENROUTER_API_KEY",
            }, path.name
            continue
        assert config.base_model == ""  # the prepared SmolLM2 folder
        if config.domain.startswith("p4g"):  # held out: scripted types, never SmolLM2 itself
            assert {s.kind for s in config.heldout} == {"scripted"}, path.name
        else:  # no panel can be held out here; the config says why in its first lines
            assert not config.heldout and "No held-out panel" in path.read_text(), path.name


def test_minimal_config_gets_defaults(tmp_path):
    config = load_config(write(tmp_path, MINIMAL + "[simulator]\ntemperature = 1\n"))
    assert config.regime == "single" and config.group_size == 4
    assert config.simulator.temperature == 1.0 and isinstance(config.simulator.temperature, float)
    assert config.clip_high == config.eps  # eps_high 0 means symmetric
    assert config.run_dir().parts[-2:] == ("runs", "r")
    assert config.simulator_reward_mode == "adversarial"  # p4g: the persuadee resists


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (MINIMAL + "stepz = 3\n", "unknown key 'stepz'; did you mean 'steps'? (got 3;"),
        (MINIMAL + "[simulator]\ntemprature = 0.5\n", "unknown key 'simulator.temprature'"),
        (MINIMAL + 'steps = "ten"\n', "steps must be int (got 'ten')"),
        (MINIMAL + "scale_std = 1\n", "scale_std must be bool (got 1)"),
        (
            MINIMAL + 'regime = "duo"\n',
            "regime must be one of single, persona, ensemble, verbalized, cotrain, population (got"
            " 'duo')",
        ),
        (MINIMAL + "group_size = 1\n", "group_size must be >= 2 (got 1)"),
        (MINIMAL + "eps = 1.5\n", "eps must be > 0 and < 1 (got 1.5)"),
        ('domain = "p4g"\n', "missing required key(s): name"),
        (MINIMAL + "[[heldout]]\nname = 'same'\n", "runs on the training simulator's weights"),
        (
            MINIMAL + "[[heldout]]\nname = 'persona'\npersona = 'You are in a hurry.'\n",
            "runs on the training simulator's weights",
        ),
        (
            MINIMAL + "[[heldout]]\nname = 'x'\nkind = 'scripted'\nscript = 'nobody'\n",
            "heldout[0].script must be one of anchored, reactant",
        ),
        (MINIMAL + "simulator_beta = -1\n", "simulator_beta must be >= 0 (got -1)"),
        (
            MINIMAL + "[[heldout]]\nname = 'x'\nmodel = 'm'\napi_key_env = 'K'\n",
            "heldout[0].api_key_env is for an endpoint simulator (set `endpoint`) (got 'K')",
        ),
        (
            MINIMAL + 'regime = "verbalized"\n',
            'simulator.kind must be "verbalized" for regime = "verbalized" (got \'plain\')',
        ),
        (
            MINIMAL + 'regime = "cotrain"\n[simulator]\nendpoint = "http://x/v1"\n',
            "simulator.model must name the served",
        ),
        (
            MINIMAL + 'regime = "population"\n[simulator]\nendpoint = "http://x/v1"\nmodel = "m"\n'
            'adapter = "a"\n',
            'simulator.adapter must be empty: regime "population" trains its own adapter',
        ),
        (
            MINIMAL + 'regime = "cotrain"\n[simulator]\nendpoint = "http://x/v1/"\nmodel = "m"\n'
            '[[heldout]]\nname = "h"\nendpoint = "http://x/v1"\nmodel = "other"\n',
            "heldout[0].endpoint is the co-trained simulator's server",
        ),
        (
            MINIMAL + 'regime = "cotrain"\n[simulator]\nendpoint = "http://x/v1"\nmodel = "/m"\n'
            '[[heldout]]\nname = "h"\nmodel = "/m"\n',
            "heldout[0] runs on the training simulator's weights (/m)",
        ),
        (
            MINIMAL + 'regime = "cotrain"\n[simulator]\nkind = "verbalized"\n'
            'endpoint = "http://x/v1"\nmodel = "m"\n',
            'simulator.kind must be "plain": regime "cotrain" trains the simulator',
        ),
        (
            MINIMAL + "[simulator]\nendpoint = 'http://x/v1'\n",
            "simulator.model must name the served",
        ),
        (  # full fine-tuning pushes each role's weights into its server's one model
            MINIMAL + 'finetune = "full"\nregime = "cotrain"\nrollout_endpoint = "http://x/v1"\n'
            '[simulator]\nendpoint = "http://x/v1/"\nmodel = "m"\n',
            "simulator.endpoint is rollout_endpoint too: under full fine-tuning",
        ),
        (
            MINIMAL + 'finetune = "full"\nregime = "population"\n[simulator]\n'
            'endpoint = "http://x/v1"\nmodel = "m"\n',
            'simulator.endpoint must be empty with regime = "population" and finetune = "full"',
        ),
        (
            MINIMAL + 'finetune = "full"\nrollout_endpoint = "http://x/v1"\n'
            'weight_sync_backend = "gloo"\n',
            "weight_sync_backend",
        ),
        (MINIMAL + 'kl_estimator = "k4"\n', "kl_estimator must be one of k1, k2, k3 (got 'k4')"),
        (
            MINIMAL + "adam_betas = [0.9, 1.0]\n",
            "adam_betas must be two numbers [b1, b2], each in [0, 1) (got [0.9, 1.0])",
        ),
        (
            MINIMAL + "adam_betas = [0.9]\n",
            "adam_betas must be two numbers [b1, b2], each in [0, 1) (got [0.9])",
        ),
        (MINIMAL + "adam_betas = [0.9, 'x']\n", "adam_betas[1] must be float (got 'x')"),
        (MINIMAL + "adam_betas = 0.9\n", "adam_betas must be a list"),
        (MINIMAL + "[lora]\nlr_scale = 0.0\n", "lora.lr_scale must be > 0 and <= 1000 (got 0.0)"),
        (
            MINIMAL + "center_rewards = false\n",
            "scale_std must be false with center_rewards = false (raw rewards are not std-scaled) (got True)",
        ),
        (MINIMAL + "steps = [\n", "not valid TOML"),
    ],
)
def test_bad_config_is_a_clear_error(tmp_path, text, message):
    with pytest.raises(ConfigError) as error:
        load_config(write(tmp_path, text))
    assert message in str(error.value)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="no config file"):
        load_config(tmp_path / "nope.toml")


def test_cli_reports_config_errors(tmp_path, capsys):
    assert main(["run", str(write(tmp_path, MINIMAL + "lr = -1.0\n"))]) == 2
    assert "lr must be > 0 (got -1.0)" in capsys.readouterr().err


def test_round_trip_through_dict():
    config = load_config(CONFIGS[0])
    assert parse_config(config.to_dict()) == config


def test_the_paper_configs_hold_out_a_hosted_panel():
    """The paper-scale configs' panel is the release's 6 models on endpoints with keys from the
    environment; a member the run trains against is marked seen, the others share no model with
    a training simulator."""
    paper = [path for path in CONFIGS if path.parent.name == "paper"]
    coding = [path for path in paper if path.stem.startswith("cooperbench")]
    assert len(paper) == 31 + len(coding) and coding
    for path in coding:  # the release's CooperBench run has no evaluation, so no panel
        assert not load_config(path).heldout
    for path in set(paper) - set(coding):
        config = load_config(path)
        assert len(config.heldout) == 6 and all(s.api_key_env for s in config.heldout)
        trained = {s.model for s in config.training_simulators() if s.endpoint}
        assert {s.model for s in config.heldout if s.seen} == trained, path.name
        unseen = [s for s in config.heldout if not s.seen]
        models = {s.model for s in unseen} | {s.endpoint for s in unseen}
        assert config.simulator.model not in models
        assert not any("qwen3-4b" in m.lower() for m in models)  # the agent's own model


def test_every_role_on_its_endpoint(tmp_path):
    """Each role names its own server: the agent's sampler (rollout_endpoint), the co-trained
    simulator's vLLM (its `model` the local base folder the server serves), and held-out users
    on hosted APIs, each with the variable that holds its key."""
    config = load_config(
        write(
            tmp_path,
            MINIMAL + 'regime = "cotrain"\nrollout_endpoint = "http://agent:8000/v1"\n'
            '[simulator]\nendpoint = "http://sim:8001/v1"\nmodel = "/models/sim"\n'
            '[[heldout]]\nname = "hosted"\nendpoint = "https://api.example/v1"\n'
            'model = "m"\napi_key_env = "HOSTED_KEY"\n',
        )
    )
    from training.tools.dryrun import endpoints

    assert str(config.simulator_model_path()) == "/models/sim"
    assert endpoints(config) == [
        ("agent sampler", "http://agent:8000/v1", str(config.base_model_path()), ""),
        ("simulator sampler", "http://sim:8001/v1", "/models/sim", ""),
        ("held-out hosted", "https://api.example/v1", "m", "HOSTED_KEY"),
    ]


def test_a_missing_key_fails_when_the_simulator_is_made(monkeypatch):
    """A held-out user's key is read as the run starts, not at its first evaluation."""
    from agents.simulators.spec import SimulatorSpec
    from training.rollouts.simulator import EndpointUser

    monkeypatch.delenv("PARLEY_TEST_NO_KEY", raising=False)
    spec = SimulatorSpec(
        name="h", endpoint="http://x/v1", model="m", api_key_env="PARLEY_TEST_NO_KEY"
    )
    with pytest.raises(ConfigError, match="environment variable PARLEY_TEST_NO_KEY is not set"):
        EndpointUser(spec)
    monkeypatch.setenv("PARLEY_TEST_NO_KEY", "sk-test")
    EndpointUser(spec).close()
