"""PARLEY_ENGINE_PACKED_WEIGHTS reaches the engine the server starts: the way out if a torch
upgrade changes the private oneDNN ops embedded/weights.py packs with (docs/development.md,
Framework internals). What packing does, and that unpacked weights decode the same, is tested in
test_weights.py."""

import pytest

from agents.environment import InvalidSetting
from agents.serving.embedded import server


@pytest.fixture
def started(monkeypatch, base_model):
    """The keywords main() builds its Engine with; nothing is loaded or served."""
    seen = {}

    class Recorder:
        def __init__(self, model_dir, **kwargs):
            seen.update(kwargs)

    monkeypatch.setattr(server, "Engine", Recorder)
    monkeypatch.setattr(server, "create_app", lambda engine: None)
    monkeypatch.setattr(server, "serve", lambda *args: 0)

    def start():
        assert server.main(["--model", str(base_model)]) == 0
        return seen

    return start


def test_weights_are_packed_by_default(started, monkeypatch):
    monkeypatch.delenv("PARLEY_ENGINE_PACKED_WEIGHTS", raising=False)
    assert started()["pack_weights"] is True


def test_the_setting_turns_packing_off(started, monkeypatch):
    monkeypatch.setenv("PARLEY_ENGINE_PACKED_WEIGHTS", "0")
    assert started()["pack_weights"] is False


def test_a_bad_value_names_the_setting(started, monkeypatch):
    monkeypatch.setenv("PARLEY_ENGINE_PACKED_WEIGHTS", "maybe")
    with pytest.raises(InvalidSetting, match="PARLEY_ENGINE_PACKED_WEIGHTS"):
        started()
