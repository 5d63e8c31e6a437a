"""A simulator fine-tuned on people's user turns (training/tools/imitate.py), and a held-out panel that
names it."""

import json

import pytest
import torch

from agents.domains.base import Scenario
from agents.simulators import OPENING
from training.config import parse_config
from training.config_keys import ConfigError
from training.measures.held_out import HeldOutPanel
from training.regimes.regime import ModelCache
from training.rl.policy import LocalModel
from training.tools.imitate import (
    ImitationError,
    ImitationSettings,
    RealConversation,
    imitate,
    mean_logprob,
    transcripts,
)

# What "people" wrote in the toy Domain: a style the tiny random model does not have.
PEOPLE = ["yes yes please more", "more words please yes", "please yes more", "yes more please"]
AGENT = "Here are words: tree, bee, green."


def conversation(i: int, turns: int = 2) -> RealConversation:
    scenario = Scenario(f"train-{i % 4}", "letters", {"split": "train", "topic": f"topic {i % 4}"})
    messages = []
    for k in range(turns):
        messages.append({"role": "user", "content": PEOPLE[(i + k) % len(PEOPLE)]})
        messages.append({"role": "assistant", "content": AGENT})
    return RealConversation("letters", scenario, messages)


def settings(tiny_model, **extra):
    values = dict(
        name="letters-humanlike",
        base_model=str(tiny_model),
        epochs=8,
        lr=5e-3,
        micro_batch=4,
        source={"study": "toy"},
    )
    return ImitationSettings(**{**values, **extra})


def test_only_the_people_s_turns_are_targets(tiny_model, letters):
    lm = LocalModel.load(tiny_model)
    (t,) = transcripts(lm, [conversation(0)])
    targets = [tok for tok, m in zip(t.ids, t.mask, strict=True) if m]
    # each person's message and the end-of-turn token that stops a reply: nothing else
    want = []
    for text in PEOPLE[:2]:
        want += lm.fmt.encode(text) + [lm.turn_stop]
    assert targets == want
    # the context is the plain simulator's: the Domain's simulator prompt, the opening cue
    first = t.mask.index(1)
    expected = (
        lm.fmt.opening(
            [
                {
                    "role": "system",
                    "content": letters.simulator_system_prompt(conversation(0).scenario),
                },
                {"role": "user", "content": OPENING},
            ]
        )
        + lm.fmt.generation_prompt
    )
    assert t.ids[:first] == expected


def test_fine_tuning_raises_the_people_s_turns_and_only_them(tiny_model, tmp_path):
    torch.manual_seed(0)
    conversations = [conversation(i) for i in range(4)]
    folder = imitate(conversations, settings(tiny_model), tmp_path / "sim")
    base = LocalModel.load(tiny_model)
    tuned = LocalModel.load(tiny_model, adapter=str(folder))
    rows = transcripts(base, conversations)
    context = [type(t)(t.ids, [0] + [1 - m for m in t.mask[1:]]) for t in rows]  # the rest
    people_gain = mean_logprob(tuned, rows) - mean_logprob(base, rows)
    context_gain = mean_logprob(tuned, context) - mean_logprob(base, context)
    assert people_gain > 2.0, (people_gain, context_gain)  # nats per token: the style was learnt
    # the agent's messages and the prompt were not targets: a removed or reversed mask would
    # raise them at least as much
    assert context_gain < people_gain / 3, (context_gain, people_gain)

    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["kind"] == "simulator" and manifest["name"] == "letters-humanlike"
    assert manifest["source"] == {
        "study": "toy",
        "conversations": 4,
        "user_turns": 8,
        "user_tokens": sum(sum(t.mask) for t in rows),
    }
    assert manifest["base_model"] == str(tiny_model) and manifest["regime"] == "imitation"
    assert manifest["metrics"]["user_logprob"] > manifest["metrics"]["user_logprob_base"]
    assert (folder / "adapter_config.json").is_file()


def test_bad_input_is_refused_and_nothing_is_overwritten(tiny_model, tmp_path):
    with pytest.raises(ImitationError, match="no conversations"):
        imitate([], settings(tiny_model), tmp_path / "a")
    silent = RealConversation(
        "letters", conversation(0).scenario, [{"role": "assistant", "content": AGENT}]
    )
    with pytest.raises(ImitationError, match="no message written by a person"):
        imitate([silent], settings(tiny_model), tmp_path / "b")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "keep").write_text("x")
    with pytest.raises(ImitationError, match="already exists"):
        imitate([conversation(0)], settings(tiny_model), tmp_path / "c")
    assert (tmp_path / "c" / "keep").read_text() == "x"
    with pytest.raises(ImitationError, match="epochs must be >= 1"):
        settings(tiny_model, epochs=0)


def panel_config(tiny_model, tmp_path, adapter):
    return parse_config(
        {
            "name": "t-panel",
            "domain": "letters",
            "base_model": str(tiny_model),
            "max_new_tokens": 4,
            "max_turns": 2,
            "simulator": {"max_new_tokens": 4},
            "heldout": [{"name": "human-like", "adapter": adapter, "max_new_tokens": 4}],
            "tasks": {"max_eval": 1},
            "output_dir": str(tmp_path / "run"),
        }
    )


def test_a_heldout_panel_names_the_registered_simulator(tiny_model, tmp_path, letters, monkeypatch):
    torch.manual_seed(0)
    folder = imitate([conversation(0, turns=1)], settings(tiny_model, epochs=1), tmp_path / "sim")
    # registered: linked by name where the embedded engine looks (agents.models.Checkpoint)
    monkeypatch.setenv("PARLEY_DATA_DIR", str(tmp_path / "data"))
    (tmp_path / "data" / "checkpoints").mkdir(parents=True)
    (tmp_path / "data" / "checkpoints" / "letters-humanlike").symlink_to(folder)

    cfg = panel_config(tiny_model, tmp_path, "letters-humanlike")
    assert cfg.heldout[0].adapter_path().resolve() == folder.resolve()
    # an adapter is other weights than the training simulator's (the base): not refused
    with pytest.raises(ConfigError, match="held-out user must share no weights"):
        panel_config(tiny_model, tmp_path, "")

    models = ModelCache(cfg)
    panel = HeldOutPanel(cfg, letters, letters.scenarios("test")[:1], models)
    user = panel.simulators["human-like"]
    base = LocalModel.load(tiny_model)
    name = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(
        dict(user.lm.model.named_parameters())[name], dict(base.model.named_parameters())[name]
    )  # the panel's user is the fine-tuned one
    row = panel.evaluate(base, step=1)
    assert set(row) >= {"heldout/human-like/success", "heldout/human-like/reward"}
    assert 0.0 <= row["heldout/human-like/reward"] <= 1.0
