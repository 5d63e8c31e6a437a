"""Behaviour profiles in a real (tiny) P4G training run: the space fit once on a corpus laid
out as the official one (a small constructed copy), the four measures written every step on
the fixed probe set and pooled, PSOD at the evaluation step for each named training simulator,
the plot and the run page; and probing changes none of the training's draws."""

import csv
import json

import openpyxl
import pytest
from django.urls import reverse

from training.config import parse_config
from training.models import TrainingRun
from training.trainer.loop import train

SAID = [
    "I am not sure about donating.",
    "What does Save the Children do?",
    "Sure, I can give.",
    "I need the money myself.",
    "How much have you given?",
    "Hello, how are you?",
    "That sounds like a good cause.",
    "No thanks.",
    "Maybe a little.",
    "Tell me more.",
]
ACTS = {
    "ask-org-info": ["What does the charity do?", "Where does the money go?"],
    "agree-donation": ["Yes I will donate.", "Okay, I'll give some."],
    "disagree-donation": ["No, I won't.", "I don't want to donate."],
}


@pytest.fixture
def corpus(tmp_path):
    """full_dialog.csv, full_info.csv and 300_dialog.xlsx with the official columns."""
    folder = tmp_path / "p4g"
    folder.mkdir()
    with open(folder / "full_dialog.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["", "Unit", "Turn", "B4", "B2"])
        for i, text in enumerate(SAID * 2):
            w.writerow([2 * i, "Would you donate?", i, 0, "d1"])
            w.writerow([2 * i + 1, text, i, 1, "d1"])
    with open(folder / "full_info.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["B2", "B3", "B4", "B6"])
        for i, amount in enumerate([0, 0, 0, 0.5, 1, 2, 5]):  # 5: an outlier, left out
            w.writerow([f"d{i}", f"u{i}", 1, amount])
    book = openpyxl.Workbook()
    sheet = book.active
    sheet.append([None, "B2", "B4", "Turn", "Unit", "er_label_1", "ee_label_1"])
    for act, texts in ACTS.items():
        for i, text in enumerate(texts * 3):
            sheet.append([i, "d1", 1, i, text, None, act])
    book.save(folder / "300_dialog.xlsx")
    return folder


def settings(tiny_model, corpus, out, regime="single", behaviour=True, steps=2):
    config = {
        "name": f"behaviour-{regime}",
        "domain": "p4g",
        "regime": regime,
        "base_model": str(tiny_model),
        "steps": steps,
        "group_size": 2,
        "batch_tasks": 1,
        "max_new_tokens": 6,
        "max_turns": 4,
        "micro_batch": 8,
        "threads": 1,
        "simulator": {"name": "tiny", "max_new_tokens": 6},
        "heldout": [{"name": "steady", "kind": "scripted", "script": "steady"}],
        "eval_every": 2,
        "eval_samples": 1,
        "tasks": {"max_eval": 1},
        "output_dir": str(out),
    }
    if behaviour:
        config["behaviour"] = {
            "reference": "p4g_corpus",
            "corpus": str(corpus),
            "clusters": 3,
            "probe_tasks": 1,
            "bootstrap": 20,
            "psod_base_tasks": 1,
        }
    return parse_config(config)


def rows(out):
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.django_db
def test_a_co_training_run_writes_the_four_measures_every_step(
    tiny_model, corpus, tmp_path, admin_client
):
    out = tmp_path / "measured"
    train(settings(tiny_model, corpus, out, "cotrain"), show_progress=False)
    first, second = rows(out)
    space = json.loads((out / "behaviour_space" / "space.json").read_text())
    assert space["clusters"] == 3 and space["reference_count"] == 20
    assert space["acts"]["labels"] == sorted(ACTS) and space["acts"]["count"] == 18
    for row in (first, second):
        for sim in ("base", "current"):  # the frozen base and the co-trained one, by name
            # the decision turn: exact, no interval
            assert 0 < row[f"behaviour/decision/probe/mci/{sim}"] <= 1
            assert f"behaviour/decision/probe/mci/{sim}/lo" not in row
            # free text: estimates with intervals, in the clusters and the dialogue acts
            for space_ in ("clusters", "acts"):
                key = f"behaviour/{space_}/probe/mci/{sim}"
                assert row[f"{key}/lo"] <= row[key] <= row[f"{key}/hi"]
        for space_ in ("decision", "clusters", "acts"):
            for form in ("probe", "pooled"):
                assert 0 <= row[f"behaviour/{space_}/{form}/scd"] <= 1
                assert 0 <= row[f"behaviour/{space_}/{form}/bdi"] <= 1
            # the base is measured beside the population, never counted in it
            assert f"behaviour/{space_}/probe/bdi/base" not in row
        assert "behaviour/decision/pooled/mci/base" not in row  # it played no rollout
        assert row["sim/decision_entropy_probe"] >= 0
    # the frozen base answers the same probes with the same seeds: the same every step
    base = [k for k in first if "/probe/" in k and ("/base" in k)]
    assert base and all(first[k] == second[k] for k in base)
    # PSOD at the evaluation step only, for each named training simulator
    assert not any(k.startswith("psod/") for k in first)
    for name in ("training", "current", "base"):
        assert -1 <= second[f"psod/{name}"] <= 1
    assert second["psod/training"] == pytest.approx(
        second["reward_mean"] - second["heldout/reward"]
    )
    assert (out / "behaviour.png").stat().st_size > 1000

    run = TrainingRun.objects.create(name="measured", domain="p4g", output_dir=str(out))
    page = admin_client.get(reverse("admin:training_trainingrun_change", args=[run.pk]))
    html = page.content.decode()
    assert 'id="behaviour-profile"' in html and "decision MCI current" in html
    assert "PSOD vs base" in html and "behaviour.png" in html


def test_probing_changes_none_of_the_training_draws(tiny_model, corpus, tmp_path):
    measured, plain = tmp_path / "measured", tmp_path / "plain"
    # one step: the probes are asked between the rollouts and the update
    train(settings(tiny_model, corpus, measured, steps=1), show_progress=False)
    train(settings(tiny_model, corpus, plain, behaviour=False, steps=1), show_progress=False)
    same = ("reward_mean", "sim/decision_entropy", "sim/distinct_1", "agent/distinct_1", "kl")
    for a, b in zip(rows(measured), rows(plain), strict=True):
        assert {k: a.get(k) for k in same} == {k: b.get(k) for k in same}
        assert any(k.startswith("behaviour/") for k in a)
        assert not any(k.startswith("behaviour/") for k in b)
    assert not (plain / "behaviour.png").exists()
