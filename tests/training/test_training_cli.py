"""`python -m training run` on the real Domains (P4G; tau2 retail with its tools) and the tiny
model: it trains, writes metrics and a checkpoint, and resumes when extended."""

import json

import pytest

from training.__main__ import main

CONFIG = """
name = "cli-{domain}"
domain = "{domain}"
base_model = "{model}"
steps = 1
group_size = 2
max_new_tokens = 6
max_turns = 4
threads = 1
output_dir = "{out}"
[tasks]
max_train = 2
max_eval = 1
[simulator]
max_new_tokens = 6
[[heldout]]
name = "hot"
model = "{other}"
temperature = 1.3
max_new_tokens = 6
"""


@pytest.mark.parametrize("domain", ["p4g", "retail"])
def test_cli_trains_and_resumes_on_a_real_domain(
    tiny_model, other_tiny_model, tmp_path, capsys, domain
):
    path = tmp_path / "run.toml"
    out = tmp_path / "out"
    path.write_text(CONFIG.format(domain=domain, model=tiny_model, other=other_tiny_model, out=out))
    assert main(["run", str(path)]) == 0
    assert main(["run", str(path), "--steps", "2"]) == 0  # resumes at step 2
    printed = capsys.readouterr().out
    assert f"checkpoint: {out / 'checkpoints' / 'step-000002'}" in printed
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["tokens"] > 0 and "heldout/hot/success" in r for r in rows)
    manifest = json.loads((out / "checkpoints/step-000002/manifest.json").read_text())
    assert manifest["domain"] == domain and manifest["name"] == f"cli-{domain}-step2"


def test_cli_refuses_to_resume_another_run(tiny_model, other_tiny_model, tmp_path, capsys):
    path = tmp_path / "run.toml"
    path.write_text(
        CONFIG.format(domain="p4g", model=tiny_model, other=other_tiny_model, out=tmp_path / "out")
    )
    assert main(["run", str(path)]) == 0
    path.write_text(path.read_text().replace('domain = "p4g"', 'domain = "retail"'))
    assert main(["run", str(path), "--steps", "2"]) == 2
    assert "holds a run with different domain" in capsys.readouterr().err
    # the optimizer's parameter groups differ: a clear refusal, not torch's load error
    path.write_text(path.read_text().replace('domain = "retail"', 'domain = "p4g"'))
    path.write_text(
        path.read_text().replace("steps = 1\n", "steps = 1\nweight_decay_skip_1d = true\n")
    )
    assert main(["run", str(path), "--steps", "2"]) == 2
    assert "holds a run with different weight_decay_skip_1d" in capsys.readouterr().err
