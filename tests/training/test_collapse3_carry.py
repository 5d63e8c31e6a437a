"""training/collapse3/carry.py: a finished run crosses to a new folder as finished, with its own
record; an unfinished one does not cross; the flat prior's record is kept beside, not in, its
folder (so the flat prior is made again)."""

import json

from training.collapse3 import carry
from training.trainer.checkpoint import list_checkpoints, read_manifest


def make_run(run, steps, reached, record=True):
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"steps": steps}))
    (run / "metrics.jsonl").write_text("".join(f'{{"step": {s}}}\n' for s in range(1, reached + 1)))
    if record:
        (run / "record.json").write_text(json.dumps({"p_exploit": 0.5, "reached": reached}))
    for step in range(2, reached + 1, 2):
        saved = run / "checkpoints" / f"step-{step:06d}"
        saved.mkdir(parents=True)
        (saved / "manifest.json").write_text(json.dumps({"step": step}))
        (saved / "trainer_state.pt").write_bytes(b"state")
        (saved / "adapter_model.safetensors").write_bytes(b"weights")


def test_finished_runs_cross_and_unfinished_ones_do_not(tmp_path):
    out, kept, again = tmp_path / "out", tmp_path / "kept", tmp_path / "again"
    make_run(out / "lr-pilot" / "lr0.001" / "runs" / "single-seed400", steps=4, reached=4)
    make_run(out / "runs" / "verbalized-seed300", steps=4, reached=2)  # stopped mid-run
    make_run(out / "runs" / "single-seed300", steps=4, reached=4, record=False)  # not measured
    (out / "gate").mkdir()
    (out / "gate" / "gate.json").write_text('{"go": true}')
    (out / "flat-prior").mkdir()
    (out / "flat-prior" / "flat_prior.json").write_text('{"steps": 20}')

    assert carry.export(out, kept) == ["lr-pilot/lr0.001/runs/single-seed400"]
    assert not list((kept).rglob("*.safetensors")) and not list(kept.rglob("trainer_state.pt"))
    assert carry.restore(kept, again) == ["lr-pilot/lr0.001/runs/single-seed400"]

    run = again / "lr-pilot" / "lr0.001" / "runs" / "single-seed400"
    saved = list_checkpoints(run)
    assert [read_manifest(p)["step"] for p in saved] == [4]  # finished, as the runner reads it
    assert json.loads((run / "record.json").read_text()) == {"p_exploit": 0.5, "reached": 4}
    assert (saved[-1] / "RESTORED.txt").is_file()
    assert not (again / "runs" / "verbalized-seed300").exists()
    assert not (again / "runs" / "single-seed300").exists()
    assert json.loads((again / "gate" / "gate.json").read_text()) == {"go": True}
    assert not (again / "flat-prior").exists()  # made again, compared with the kept record
    assert json.loads((again / "flat_prior.kept.json").read_text()) == {"steps": 20}
