"""The adapters root may hold checkpoints as symlinks (that is how training registers them)."""

import json

from agents.serving.adapters import find_adapters


def fake_adapter(folder, name=None):
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text("{}")
    if name:
        (folder / "manifest.json").write_text(json.dumps({"name": name}))
    return folder


def test_symlinked_checkpoints_are_found_by_manifest_name(tmp_path):
    run = fake_adapter(tmp_path / "runs" / "r1" / "checkpoints" / "step-3", name="r1-step3")
    plain = fake_adapter(tmp_path / "elsewhere" / "plain")
    root = tmp_path / "adapters"
    root.mkdir()
    (root / "r1-step3").symlink_to(run, target_is_directory=True)
    (root / "plain").symlink_to(plain, target_is_directory=True)
    found = find_adapters(root)
    assert set(found) == {"r1-step3", "plain"}
    assert found["r1-step3"].path.resolve() == run.resolve()


def test_a_checkpoint_still_being_written_is_not_served(tmp_path):
    root = tmp_path / "runs"
    fake_adapter(root / "r1" / "checkpoints" / "step-000001", name="r1-step1")
    fake_adapter(root / "r1" / "checkpoints" / "step-000002.partial", name="r1-step2")
    assert set(find_adapters(root)) == {"r1-step1"}
