"""TrainingRun (the admin's run): its choices and filters read the vocabularies, and its preset
goes through the same loader as a TOML file on the command line."""

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from agents.domains import DOMAINS
from training.config import load_config
from training.models import CONFIGS_DIR, TrainingRun
from training.vocabulary import Regime


def test_choices_are_the_vocabularies():
    assert [v for v, _ in TrainingRun._meta.get_field("domain").choices] == list(DOMAINS)
    assert TrainingRun._meta.get_field("regime").choices == Regime.choices()


@pytest.mark.django_db
def test_admin_filters_offer_every_name(admin_client):
    page = admin_client.get(reverse("admin:training_trainingrun_changelist")).content.decode()
    for field, names in (
        ("domain", DOMAINS),
        ("regime", Regime),
        ("status", TrainingRun.Status.values),
    ):
        for name in names:
            assert f"?{field}__exact={name}" in page, (field, name)


def test_a_run_reads_its_preset_through_the_loader():
    run = TrainingRun(
        name="vs-run",
        preset="p4g-single-cpu",
        domain="p4g",
        regime="verbalized",
        steps=3,
        settings={"simulator.draw": "uniform", "seed": 7},
    )
    config = run.config()
    preset = load_config(CONFIGS_DIR / "p4g-single-cpu.toml")
    assert (config.name, config.regime, config.steps, config.seed) == ("vs-run", "verbalized", 3, 7)
    assert (config.simulator.kind, config.simulator.draw) == ("verbalized", "uniform")
    assert config.simulator.name == preset.simulator.name  # the rest of the table is the preset's
    assert config.heldout == preset.heldout and config.lora == preset.lora


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"steps": -1}, "steps", "steps must be >= 0 (got -1)"),
        ({"settings": {"lora": {"r": 0}}}, "settings", "lora.r must be >= 1 (got 0)"),
        (
            {"settings": {"simulator.draw": "random"}},
            "settings",
            "simulator.draw must be one of probability, uniform (got 'random')",
        ),
    ],
)
def test_a_bad_value_is_an_error_on_the_field_that_set_it(fields, field, message):
    run = TrainingRun(name="bad", preset="p4g-single-cpu", domain="p4g", regime="single", **fields)
    with pytest.raises(ValidationError) as error:
        run.clean()
    assert message in " ".join(error.value.message_dict[field])
