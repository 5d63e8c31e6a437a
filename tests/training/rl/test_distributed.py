"""Data-parallel training launched for real (`accelerate launch`, gloo on CPU): 2 processes give
the adapter 1 process gives on the same global batch (the agent's, and under co-training the
simulator's too), and a rank that dies fails the run cleanly
and the run resumes from its last complete checkpoint (at another process count).

P4G's decision episode with the tiny model: the agent's ask is drawn from the policy's exact
distribution over the allowed asks and a scripted persuadee answers, so each step is cheap and
what is compared is the distributed update itself."""

import json
import os
import tomllib
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.support.dying_rank import DIE_AT, with_dying_rank
from tests.support.training import REPO, adapter, assert_same, launch, metrics, one_and_two
from training.config import load_config
from training.rl import distributed
from training.rl.distributed import launch_command, read_failures
from training.trainer import checkpoint
from training.trainer.loop import train

CONFIG = """
name = "ddp"
domain = "p4g-decision"
base_model = "{model}"
steps = 2
group_size = 4
batch_tasks = 2              # one task's group per rank
lr = 1e-2
temperature = 1.0
max_new_tokens = 8
max_turns = 2
micro_batch = 4
save_every = 1
threads = 1
heldout = []
[tasks]
max_train = 4
[simulator]
name = "steady"
kind = "scripted"
script = "steady"
"""


@pytest.fixture
def config_file(smooth_tiny_model, tmp_path):
    path = tmp_path / "ddp.toml"
    path.write_text(CONFIG.format(model=smooth_tiny_model))
    return path


COTRAIN = """
regime = "{regime}"
simulator_lr = 1e-2
pool_every = 1
pool_size = 1
{head}
[simulator]
name = "persuadee"
kind = "plain"
temperature = 1.0
max_new_tokens = 8
"""


@pytest.fixture(params=["cotrain", "population", "population-curriculum"])
def cotrain_file(request, smooth_tiny_model, tmp_path):
    """The same run with a co-trained simulator on the tiny model (the persuadee's decision is
    drawn from its exact distribution over the markers, so its tokens are trained on). With the
    curriculum reward, each rank scores the groups of its own tasks."""
    regime, _, reward = request.param.partition("-")
    head = CONFIG.format(model=smooth_tiny_model).split("[simulator]")[0]
    if reward:
        head = f'simulator_reward = "{reward}"\n' + head
    path = tmp_path / "cotrain.toml"
    path.write_text(COTRAIN.format(regime=regime, head=head))
    return path


def test_two_processes_train_the_adapter_one_process_does(config_file, tmp_path):
    one, two = one_and_two(config_file, tmp_path)

    assert_same(adapter(one, 2), adapter(two, 2))
    assert adapter(one, 2).keys() and any(  # the adapter did move (B starts at zero)
        float(t.abs().max()) > 0 for k, t in adapter(two, 2).items() if "lora_B" in k
    )
    rows, single = metrics(two), metrics(one)
    assert [r["step"] for r in rows] == [1, 2]  # rank 0 alone wrote: one row per step
    for row, ref in zip(rows, single, strict=True):  # metrics cover the whole global batch
        assert row["tokens"] == ref["tokens"] > 0
        assert row["trained_sequences"] == ref["trained_sequences"] > 0
        assert row["reward_mean"] == pytest.approx(ref["reward_mean"])
        assert row["loss"] == pytest.approx(ref["loss"], abs=1e-6)
    assert len((two / "samples.jsonl").read_text().splitlines()) == 4  # 2 tasks x 2 steps


def test_two_processes_average_per_sequence_as_one_process_does(config_file, tmp_path):
    """loss_reduction = "sample" (Slime's default): each rank's sequences weigh 1 / the GLOBAL
    sequence count, so 2 ranks take the 1-rank step; the conversations differ in length, so the
    token mean would take another."""
    text = config_file.read_text().replace(
        'name = "ddp"', 'name = "ddp"\nloss_reduction = "sample"'
    )
    config_file.write_text(text)
    one, two = one_and_two(config_file, tmp_path)

    assert_same(adapter(one, 2), adapter(two, 2))
    for row, ref in zip(metrics(two), metrics(one), strict=True):
        assert row["loss"] == pytest.approx(ref["loss"], abs=1e-6)
        assert row["trained_sequences"] == ref["trained_sequences"] > 0


def test_two_processes_cotrain_the_simulator_one_process_does(cotrain_file, tmp_path):
    one, two = one_and_two(cotrain_file, tmp_path)

    assert_same(simulator(one, 1), simulator(two, 1))  # the simulator's own update first
    assert_same(adapter(one, 2), adapter(two, 2))
    sim_one, sim_two = simulator(one, 2), simulator(two, 2)
    assert_same(sim_one, sim_two)
    assert any(float(t.abs().max()) > 0 for k, t in sim_two.items() if "lora_B" in k)
    rows, single = metrics(two), metrics(one)
    for row, ref in zip(rows, single, strict=True):  # the simulator's step covers both ranks
        assert row["sim/learned"] == ref["sim/learned"] == 1.0
        assert row["sim/tokens"] == ref["sim/tokens"] > 0
        assert row["sim/reward_mean"] == pytest.approx(ref["sim/reward_mean"])
        assert row["sim/loss"] == pytest.approx(ref["sim/loss"], abs=1e-6)
        if "curriculum" in cotrain_file.read_text():  # the mean over both ranks' groups
            assert row["sim/agent_variance"] == pytest.approx(ref["sim/agent_variance"])
    if "population" in cotrain_file.read_text():  # rank 0 wrote the pool: one snapshot, step 2
        manifest = json.loads((two / "pool" / "manifest.json").read_text())
        assert [e["step"] for e in manifest["entries"]] == [2]
        assert rows[1]["pool/size"] == 1.0 and rows[1]["pool/current_share"] < 1.0


def test_a_population_run_resumes_at_another_process_count(smooth_tiny_model, tmp_path):
    """Rank 1 dies at step 2 of a 2-process population run; one process resumes it from step 1
    (the pool trimmed back to it) and ends with the adapters and pool of an unbroken run."""
    head = CONFIG.format(model=smooth_tiny_model).split("[simulator]")[0]
    path = tmp_path / "population.toml"
    # a pool of 2: with 1, step 2's snapshot evicts step 1's before rank 1 dies, and a resume
    # from step 1 finds its pool gone (the pool is not part of a checkpoint)
    settings = COTRAIN.format(regime="population", head=head)
    path.write_text(settings.replace("pool_size = 1", "pool_size = 2"))
    out, reference = tmp_path / "run", tmp_path / "reference"
    failed = launch(path, out, die_at="1:2")
    assert failed.returncode != 0 and "rank 1 dies at step 2" in read_failures(out)
    assert [p.name for p in checkpoint.list_checkpoints(out)] == ["step-000001"]

    train(load_config(path, {"output_dir": str(out)}), show_progress=False)
    train(load_config(path, {"output_dir": str(reference)}), show_progress=False)
    assert_same(adapter(out, 2), adapter(reference, 2))
    assert_same(simulator(out, 2), simulator(reference, 2))
    manifest = json.loads((out / "pool" / "manifest.json").read_text())
    assert [e["step"] for e in manifest["entries"]] == [1, 2]


FSDP = '\n[distributed]\nstrategy = "fsdp"\n'


def uneven(settings):
    """3 tasks on 2 ranks: rank 0 has two micro-batches, rank 1 one, so under FSDP rank 1 pads
    with zero-weight passes (and its conversations end at other lengths)."""
    return settings.replace("batch_tasks = 2", "batch_tasks = 3")


def test_fsdp_two_processes_train_the_adapter_one_process_does(config_file, tmp_path):
    """FSDP, the model sharded over 2 ranks, on uneven shares; the KL term adds the reference
    pass with the adapter disabled."""
    config_file.write_text("beta = 0.05\n" + uneven(config_file.read_text()) + FSDP)
    one, two = one_and_two(config_file, tmp_path, timeout=240)

    rows, single = metrics(two), metrics(one)
    for row, ref in zip(rows, single, strict=True):
        assert row["trained_sequences"] == ref["trained_sequences"] > 0
        # the gradient itself, as one process has it (Adam would hide a constant factor)
        assert row["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-3)
    for step in (1, 2):
        assert_same(adapter(one, step), adapter(two, step))
    assert any(float(t.abs().max()) > 0 for k, t in adapter(two, 2).items() if "lora_B" in k)
    # the checkpoints are the plain ones (adapter and optimizer): each run's step 3 resumes the
    # other's checkpoint at the other process count
    train(load_config(config_file, {"output_dir": str(two), "steps": 3}), show_progress=False)
    resumed = launch(config_file, one, timeout=240, args=["--steps", "3"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same(adapter(one, 3), adapter(two, 3))


def test_fsdp_two_processes_cotrain_the_simulator_one_process_does(smooth_tiny_model, tmp_path):
    """Population under FSDP: the simulator sharded too, sampling on its gathered weights, pool
    snapshots swapped in (step 2) and written by rank 0 on weights every rank gathered."""
    head = uneven(CONFIG.format(model=smooth_tiny_model).split("[simulator]")[0])
    path = tmp_path / "population.toml"
    path.write_text(COTRAIN.format(regime="population", head=head) + FSDP)
    one, two = one_and_two(path, tmp_path, timeout=240)

    rows, single = metrics(two), metrics(one)
    for row, ref in zip(rows, single, strict=True):
        assert row["sim/learned"] == ref["sim/learned"] == 1.0
        assert row["sim/grad_norm"] == pytest.approx(ref["sim/grad_norm"], rel=1e-3)
    assert rows[1]["pool/size"] == 1.0 and rows[1]["pool/current_share"] < 1.0
    for step in (1, 2):
        assert_same(adapter(one, step), adapter(two, step))
        assert_same(simulator(one, step), simulator(two, step))
    [entry] = json.loads((two / "pool" / "manifest.json").read_text())["entries"]
    snapshot = load_file(two / "pool" / entry["path"] / "adapter_model.safetensors")
    assert entry["step"] == 2 and snapshot.keys() == simulator(two, 2).keys()
    assert_same(snapshot, simulator(two, 2))  # the simulator as step 2 left it


def model_weights(out, step, role=""):
    """A full fine-tuning checkpoint's weights (a Hugging Face model folder, maybe sharded)."""
    folder = checkpoint.checkpoint_dir(out, step) / role
    assert (folder / "config.json").is_file() and not (folder / "adapter_config.json").exists()
    state = {}
    for shard in sorted(folder.glob("*.safetensors")):
        state.update(load_file(shard))
    return state


def test_fsdp_two_processes_fine_tune_every_weight_one_process_does(
    smooth_tiny_model, config_file, tmp_path
):
    """Full fine-tuning under FSDP: every weight, its gradient and AdamW state sharded, the KL's
    frozen reference copy sharded too, on uneven shares; the checkpoints are whole Hugging Face
    model folders (the same files one process writes), and each run's step 3 resumes the other's
    checkpoint at the other process count."""
    settings = uneven(config_file.read_text()).replace("lr = 1e-2", "lr = 1e-3")
    config_file.write_text('finetune = "full"\nbeta = 0.05\n' + settings + FSDP)
    one, two = one_and_two(config_file, tmp_path, timeout=300)

    rows, single = metrics(two), metrics(one)
    for row, ref in zip(rows, single, strict=True):
        assert row["trained_sequences"] == ref["trained_sequences"] > 0
        assert row["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-3)
        assert row["kl"] == pytest.approx(ref["kl"], rel=1e-3, abs=1e-6)
    assert rows[1]["kl"] > 0  # the reference pass ran on the sharded copy
    base = {}
    for shard in Path(smooth_tiny_model).glob("*.safetensors"):
        base.update(load_file(shard))
    for step in (1, 2):
        saved = model_weights(two, step)
        assert saved.keys() == base.keys()  # every weight, the tied embedding once
        assert_same(model_weights(one, step), saved)
    moved = model_weights(two, 2)
    assert all(not torch.equal(moved[k], base[k]) for k in base if "layers.0." in k)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = checkpoint.checkpoint_dir(two, 2)
    AutoModelForCausalLM.from_pretrained(folder)  # servable as it is
    AutoTokenizer.from_pretrained(folder)

    train(load_config(config_file, {"output_dir": str(two), "steps": 3}), show_progress=False)
    resumed = launch(config_file, one, timeout=300, args=["--steps", "3"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same(model_weights(one, 3), model_weights(two, 3))


def test_fsdp_mixed_precision_two_processes_fine_tune_as_one_process_does(
    smooth_tiny_model, config_file, tmp_path
):
    """mixed_precision under FSDP (MixedPrecision: bf16 gathers and passes over float32 shards,
    gradients reduced in float32) against one process (autocast over float32 weights): the
    same update up to bf16 rounding, and float32 master weights in both checkpoints."""
    settings = config_file.read_text().replace("lr = 1e-2", "lr = 1e-3")
    extra = 'finetune = "full"\nbeta = 0.05\ndtype = "bfloat16"\nmixed_precision = true\n'
    config_file.write_text(extra + settings + FSDP)
    one, two = one_and_two(config_file, tmp_path, timeout=300)

    rows, single = metrics(two), metrics(one)
    for row, ref in zip(rows, single, strict=True):
        assert row["trained_sequences"] == ref["trained_sequences"] > 0
        assert row["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-2)
        assert row["kl"] == pytest.approx(ref["kl"], rel=1e-2, abs=1e-6)
    assert rows[1]["kl"] > 0  # the reference pass, on the sharded bf16 copy
    base = {}
    for shard in Path(smooth_tiny_model).glob("*.safetensors"):
        base.update(load_file(shard))
    a, b = model_weights(one, 2), model_weights(two, 2)
    assert {t.dtype for t in [*a.values(), *b.values()]} == {torch.float32}
    moved = torch.cat([(a[k] - base[k]).flatten() for k in base])
    apart = torch.cat([(a[k] - b[k]).flatten() for k in base])
    # Adam moves a weight by about lr a step (those the choice turns' logits reach); bf16
    # rounding flips only near-zero gradients, so the two runs stay 50x closer than they moved
    assert float((moved != 0).float().mean()) > 0.01
    assert float(apart.abs().mean()) < 0.02 * float(moved.abs().mean())


def test_fsdp_two_processes_fully_fine_tune_a_population_one_process_does(
    smooth_tiny_model, tmp_path
):
    """`finetune = "full"` applies to the co-trained simulator too: under FSDP both models are
    sharded (the simulator's KL reference copy as well), pool snapshots are whole model folders
    swapped into the sharded simulator's gathered weights, and both roles end where one
    process leaves them."""
    head = uneven(CONFIG.format(model=smooth_tiny_model).split("[simulator]")[0])
    head = head.replace("lr = 1e-2", "lr = 1e-3")
    settings = COTRAIN.format(regime="population", head=head).replace(
        "simulator_lr = 1e-2", "simulator_lr = 1e-3"
    )
    path = tmp_path / "population.toml"
    path.write_text('finetune = "full"\n' + settings + FSDP)
    one, two = one_and_two(path, tmp_path, timeout=300)

    rows, single = metrics(two), metrics(one)
    for row, ref in zip(rows, single, strict=True):
        assert row["sim/learned"] == ref["sim/learned"] == 1.0
        assert row["sim/grad_norm"] == pytest.approx(ref["sim/grad_norm"], rel=1e-3)
        assert row["sim/kl"] == pytest.approx(ref["sim/kl"], rel=1e-3, abs=1e-6)
    assert rows[1]["pool/size"] == 1.0 and rows[1]["pool/current_share"] < 1.0
    assert rows[1]["sim/kl"] > 0  # simulator_beta's reference pass, on the sharded copy
    for step in (1, 2):
        assert_same(model_weights(one, step), model_weights(two, step))
        assert_same(model_weights(one, step, "simulator"), model_weights(two, step, "simulator"))
    [entry] = json.loads((two / "pool" / "manifest.json").read_text())["entries"]
    snapshot = {}
    for shard in (two / "pool" / entry["path"]).glob("*.safetensors"):
        snapshot.update(load_file(shard))
    assert_same(snapshot, model_weights(two, 2, "simulator"))  # the simulator as step 2 left it


VERBALIZED = """
name = "fsdp-free-text"
domain = "p4g"
regime = "verbalized"
base_model = "{model}"
steps = 2
group_size = 2
batch_tasks = 3
max_turns = 4
max_new_tokens = 8
eval_every = 2
save_every = 2
threads = 1
[tasks]
max_train = 3
max_eval = 1
[simulator]
name = "vs"
kind = "verbalized"
max_new_tokens = 40
[[heldout]]
name = "steady"
kind = "scripted"
script = "steady"
"""


def test_fsdp_free_text_sampling_and_both_ranks_evaluating(smooth_tiny_model, tmp_path):
    """Under FSDP the agent generates free text on its gathered weights, to each rank's own
    lengths and number of turns, in the rollouts and in its share of the held-out panel:
    neither rank may wait on the other (transformers syncs generation across FSDP ranks unless
    told not to)."""
    path = tmp_path / "verbalized.toml"
    path.write_text(VERBALIZED.format(model=smooth_tiny_model) + FSDP)
    done = launch(path, tmp_path / "run", timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = metrics(tmp_path / "run")
    assert [row["step"] for row in rows] == [1, 2]
    assert "heldout/steady/success" in rows[1] and rows[1]["trained_sequences"] > 0
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path / "run")] == ["step-000002"]


def simulator(out, step):
    folder = checkpoint.checkpoint_dir(out, step) / "simulator"
    return load_file(folder / "adapter_model.safetensors")


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_dead_rank_fails_the_run_cleanly_and_it_resumes(config_file, tmp_path, strategy):
    if strategy == "fsdp":  # rank 0 then waits inside FSDP's own collective (the checkpoint's)
        config_file.write_text(config_file.read_text() + FSDP)
    out = tmp_path / "run"
    failed = launch(config_file, out, die_at="1:2")
    assert failed.returncode != 0

    error = read_failures(out)
    assert error.startswith("rank 1 failed:") and "rank 1 dies at step 2" in error
    assert "rank 0 failed" not in error  # rank 0 only lost its peer: a consequence
    assert [p.name for p in checkpoint.list_checkpoints(out)] == ["step-000001"]
    assert not checkpoint.checkpoint_dir(out, 2).exists()  # no step-2 checkpoint to register

    # the restart (here with one process) resumes at step 2 and ends where an unbroken run does
    train(load_config(config_file, {"output_dir": str(out)}), show_progress=False)
    assert [p.name for p in checkpoint.list_checkpoints(out)] == ["step-000001", "step-000002"]
    assert read_failures(out) == ""
    reference = tmp_path / "reference"
    train(load_config(config_file, {"output_dir": str(reference)}), show_progress=False)
    assert_same(adapter(out, 2), adapter(reference, 2))


@pytest.mark.django_db
def test_a_training_run_launches_its_processes_and_names_the_failed_rank(
    config_file, tmp_path, monkeypatch
):
    from training.models import TrainingRun
    from training.tasks import run_training

    settings = {**tomllib.loads(config_file.read_text()), "output_dir": str(tmp_path / "run")}
    run = TrainingRun.objects.create(
        name="ddp", domain="p4g-decision", settings=settings, processes=2
    )
    # the task's own launch, with rank 1 made to die from outside (tests/support/dying_rank.py)
    monkeypatch.setattr(
        distributed, "launch_command", lambda *a: with_dying_rank(launch_command(*a))
    )
    monkeypatch.setenv("PYTHONPATH", f"{REPO}:{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setenv(DIE_AT, "1:2")
    assert run_training(run.pk) == TrainingRun.Status.FAILED
    run.refresh_from_db()
    assert "rank 1 failed:" in run.error and "rank 1 dies at step 2" in run.error
    assert [c.name for c in run.checkpoints.all()] == ["ddp-step1"]  # only complete ones

    monkeypatch.delenv(DIE_AT)
    TrainingRun.objects.filter(pk=run.pk).update(status=TrainingRun.Status.QUEUED, error="")
    assert run_training(run.pk) == TrainingRun.Status.DONE  # resumes at step 2
    run.refresh_from_db()
    assert sorted(c.name for c in run.checkpoints.all()) == ["ddp-step1", "ddp-step2"]
    assert run.progress["step"] == 2, (run.progress, run.error, run.status)
