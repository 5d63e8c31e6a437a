"""The trainer end to end on the tiny model and the toy Domain."""

import json
import statistics

import pytest
import torch

from agents.serving.adapters import MANIFEST
from training.config import parse_config
from training.trainer import checkpoint
from training.trainer.loop import train


@pytest.fixture
def heldout(other_tiny_model):
    return [
        {"name": "hot", "model": str(other_tiny_model), "temperature": 1.5, "max_new_tokens": 4}
    ]


def run_config(tiny_model, tmp_path, **extra):
    data = {
        "name": "toy",
        "domain": "letters",
        "base_model": str(tiny_model),
        "steps": 3,
        "group_size": 4,
        "lr": 1e-2,
        "max_new_tokens": 6,
        "max_turns": 2,  # the user asks, the agent answers once
        "micro_batch": 8,
        "simulator": {"max_new_tokens": 4},
        "tasks": {"max_eval": 1},
        "output_dir": str(tmp_path / "run"),
        "threads": 1,
    }
    data.update(extra)
    return parse_config(data)


class Interrupt(Exception):
    pass


def stop_at(step):
    def callback(progress):
        if progress["step"] == step:
            raise Interrupt

    return callback


def test_short_run_raises_the_reward(tiny_model, tmp_path, letters):
    cfg = run_config(
        tiny_model,
        tmp_path,
        steps=8,
        group_size=8,
        lr=5e-2,
        finetune="full",
        max_new_tokens=8,
        heldout=[],
        save_every=0,
    )
    train(cfg, domain=letters, show_progress=False)
    rows = [json.loads(line) for line in (cfg.run_dir() / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 9))
    first = statistics.fmean(r["reward_mean"] for r in rows[:2])
    last = statistics.fmean(r["reward_mean"] for r in rows[-2:])
    assert last > first + 0.05, (first, last)
    assert rows[-1]["entropy"] < rows[0]["entropy"]  # the policy sharpened on what pays


def test_checkpoint_is_a_servable_adapter_with_manifest(tiny_model, tmp_path, letters, heldout):
    progress = []
    cfg = run_config(tiny_model, tmp_path, steps=2, eval_every=1, save_every=1, heldout=heldout)
    saved = train(cfg, progress.append, domain=letters, show_progress=False)
    assert [p.name for p in saved] == ["step-000001", "step-000002"]
    manifest = checkpoint.read_manifest(saved[-1])
    assert manifest["name"] == "toy-step2" and manifest["kind"] == "agent"
    assert manifest["base_model"] == str(tiny_model) and manifest["regime"] == "single"
    assert manifest["step"] == 2 and manifest["config"]["lr"] == cfg.lr
    assert "heldout/hot/success" in manifest["metrics"]

    # peft (the embedded engine) and vLLM --lora-modules read this layout
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    model = PeftModel.from_pretrained(base, saved[-1])
    adapter = json.loads((saved[-1] / "adapter_config.json").read_text())
    assert adapter["r"] == cfg.lora.r and set(adapter["target_modules"]) == set(cfg.lora.targets)
    assert any("lora_B" in n and p.abs().sum() > 0 for n, p in model.named_parameters())

    # the embedded engine serves every checkpoint under a runs folder by its manifest name
    from agents.serving.adapters import find_adapters

    served = find_adapters(tmp_path)
    assert served["toy-step2"].path == saved[-1] and "toy-step1" in served

    for name in ("train_reward.png", "heldout_success.png", "entropy.png"):
        assert (cfg.run_dir() / name).stat().st_size > 1000
    samples = [json.loads(x) for x in (cfg.run_dir() / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [1, 2]  # one conversation per task and step
    assert samples[0]["conversation"][0]["role"] == "user" and samples[0]["task"].startswith(
        "train-"
    )
    assert [p["step"] for p in progress] == [1, 2]
    assert progress[-1]["heldout_success"] == {"hot": manifest["metrics"]["heldout/hot/success"]}
    assert progress[-1]["eta_seconds"] == 0 and progress[-1]["checkpoint"] == str(saved[-1])


def test_resume_after_interruption_continues_from_the_saved_step(tiny_model, tmp_path, letters):
    cfg = run_config(tiny_model, tmp_path, steps=4, save_every=2, heldout=[])
    with pytest.raises(Interrupt):
        train(cfg, stop_at(3), domain=letters, show_progress=False)
    assert [p.name for p in checkpoint.list_checkpoints(cfg.run_dir())] == ["step-000002"]
    saved_adapter = (
        cfg.run_dir() / "checkpoints/step-000002/adapter_model.safetensors"
    ).read_bytes()

    resumed = []
    train(cfg, resumed.append, domain=letters, show_progress=False)
    assert [p["step"] for p in resumed] == [3, 4]
    rows = [json.loads(x) for x in (cfg.run_dir() / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]  # step 3 once, from the resumed run
    discarded = (cfg.run_dir() / "metrics.discarded.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in discarded] == [3]
    state = torch.load(
        cfg.run_dir() / "checkpoints/step-000004/trainer_state.pt", weights_only=False
    )
    assert state["step"] == 4 and state["optimizer"]["state"]  # Adam moments carried over
    assert (
        cfg.run_dir() / "checkpoints/step-000002/adapter_model.safetensors"
    ).read_bytes() == saved_adapter

    # a finished run run again has nothing left to do; extending it resumes at the end
    assert train(cfg, resumed.append, domain=letters, show_progress=False)[-1].name == "step-000004"
    assert len(resumed) == 2


def test_resume_refuses_a_different_run(tiny_model, tmp_path, letters):
    cfg = run_config(tiny_model, tmp_path, steps=1, heldout=[])
    train(cfg, domain=letters, show_progress=False)
    other = run_config(tiny_model, tmp_path, steps=2, heldout=[], group_size=2)
    with pytest.raises(checkpoint.ResumeError, match="group_size"):
        train(other, domain=letters, show_progress=False)


def test_population_pool_resumes_with_the_run(tiny_model, tmp_path, letters):
    cfg = run_config(
        tiny_model,
        tmp_path,
        regime="population",
        steps=4,
        save_every=2,
        pool_size=3,
        pool_every=1,
        heldout=[],
        max_turns=3,
        simulator_lr=1e-2,
    )
    with pytest.raises(Interrupt):
        train(cfg, stop_at(3), domain=letters, show_progress=False)
    pool = json.loads((cfg.run_dir() / "pool/manifest.json").read_text())
    assert [e["step"] for e in pool["entries"]] == [1, 2, 3]
    assert (cfg.run_dir() / "checkpoints/step-000002/simulator/adapter_model.safetensors").is_file()

    train(cfg, domain=letters, show_progress=False)
    pool = json.loads((cfg.run_dir() / "pool/manifest.json").read_text())
    assert [e["step"] for e in pool["entries"]] == [2, 3, 4]  # step 3 re-made, step 1 evicted
    rows = [json.loads(x) for x in (cfg.run_dir() / "metrics.jsonl").read_text().splitlines()]
    assert [r["pool/size"] for r in rows] == [1, 2, 3, 3]
    sim = checkpoint.read_manifest(cfg.run_dir() / "checkpoints/step-000004/simulator")
    assert sim["kind"] == "simulator" and sim["name"] == "toy-simulator-step4"


def test_rollouts_at_once_bounds_the_conversations_a_rank_holds_open(
    tiny_model, tmp_path, letters, monkeypatch
):
    """rollouts_at_once = 4 with G = 6: each task's group is played in parts of at most 4
    conversations (so at most 4 transcripts per speaker hold a KV cache at once), the parts
    numbered on from each other (an Ensemble's member is drawn from the group position), and
    the step still trains on the whole group."""
    from training.trainer import loop

    sizes, positions = [], []

    def counted(domain, scenarios, *args, **kwargs):
        sizes.append(len(scenarios))
        rollouts = play(domain, scenarios, *args, **kwargs)
        positions.append([r.index for r in rollouts])
        return rollouts

    play = loop.play
    monkeypatch.setattr(loop, "play", counted)
    cfg = run_config(
        tiny_model,
        tmp_path,
        steps=1,
        group_size=6,
        batch_tasks=2,
        rollouts_at_once=4,
        heldout=[],
        save_every=0,
    )
    train(cfg, domain=letters, show_progress=False)
    assert sizes == [4, 2, 4, 2]
    assert positions == [[0, 1, 2, 3], [4, 5]] * 2
    [row] = [
        json.loads(line) for line in (cfg.run_dir() / "metrics.jsonl").read_text().splitlines()
    ]
    assert row["trained_sequences"] == 12


def test_the_evaluation_schedule_can_be_the_releases():
    """eval_at_end = false: the panel runs after steps 16, 32, ... and not after the last, as
    Slime's --eval-interval 16 does over 40 rollouts; the default adds the last step. Without
    eval_every there would be no evaluation at all: refused."""
    from training.config_keys import ConfigError
    from training.trainer.writer import evaluation_due

    def schedule(**fields):
        panel = [{"name": "other", "kind": "scripted", "script": "steady"}]
        config = parse_config(
            {"name": "r", "domain": "p4g", "steps": 40, "heldout": panel, **fields}
        )
        return [step for step in range(1, 41) if evaluation_due(step, config)]

    assert schedule(eval_every=16, eval_at_end=False) == [16, 32]
    assert schedule(eval_every=16) == [16, 32, 40]
    assert schedule() == [40]
    with pytest.raises(ConfigError, match="eval_at_end .*never evaluated"):
        schedule(eval_at_end=False)


def test_checkpoint_retention_keeps_the_last_n_and_the_best(tmp_path):
    """keep_checkpoints = 2: of steps 8..40 (held-out success 0.2, 0.6, -, 0.4, 0.1; step 24 had
    no evaluation) the last two stay, and step 16, the best; the newest, which a resume loads,
    is always kept. 0 keeps every one (the release)."""
    success = {8: 0.2, 16: 0.6, 24: None, 32: 0.4, 40: 0.1}
    for step, figure in success.items():
        folder = checkpoint.checkpoint_dir(tmp_path, step)
        folder.mkdir(parents=True)
        metrics = {"reward_mean": 0.5} | ({"heldout/success": figure} if figure is not None else {})
        (folder / MANIFEST).write_text(json.dumps({"step": step, "metrics": metrics}))
        (folder / checkpoint.STATE).write_bytes(b"")
    partial = checkpoint.checkpoint_dir(tmp_path, 48).with_suffix(checkpoint.PARTIAL)
    partial.mkdir()

    def steps(folders):
        return [checkpoint.read_manifest(f)["step"] for f in folders]

    assert steps(checkpoint.prune(tmp_path, 0, "heldout/success")) == [8, 16, 24, 32, 40]
    kept = checkpoint.prune(tmp_path, 2, "heldout/success")
    assert steps(kept) == [16, 32, 40] == steps(checkpoint.list_checkpoints(tmp_path))
    assert partial.is_dir()  # not a complete checkpoint: never pruned here
    assert steps(checkpoint.prune(tmp_path, 1, "heldout/reward")) == [40]  # no reward figure


def test_a_run_keeping_one_checkpoint_resumes_from_it(tiny_model, tmp_path, letters):
    """keep_checkpoints = 1 in a run: each save leaves only the newest (no panel: no best), and
    an interrupted run resumes from it."""
    cfg = run_config(tiny_model, tmp_path, steps=3, save_every=1, heldout=[], keep_checkpoints=1)
    with pytest.raises(Interrupt):
        train(cfg, stop_at(2), domain=letters, show_progress=False)
    # step 2 saved (its progress call came after the save), step 1 then pruned
    assert [p.name for p in checkpoint.list_checkpoints(cfg.run_dir())] == ["step-000002"]
    resumed = []
    saved = train(cfg, resumed.append, domain=letters, show_progress=False)
    assert [p["step"] for p in resumed] == [3] and [p.name for p in saved] == ["step-000003"]
