"""A P4G pool as a study imports it: its keys name the domain once, and what the participant
reads and what the persuader is told say the study's own length, not a fixed five messages."""

import pytest

from studies.lib.domain_bridge import system_prompt
from studies.models import Scenario
from studies.participation.arrive import arrive
from studies.participation.consent import give_consent
from studies.setup.scenario_pools import import_pool
from tests.support.studies import make_study, prolific

pytestmark = pytest.mark.django_db


def test_p4g_keys_name_the_domain_once_and_an_older_import_is_not_doubled():
    study = make_study(slug="give", domain="p4g", max_exchanges=8)
    assert import_pool(study, "p4g", 3) == (3, 0)
    keys = list(study.scenarios.values_list("key", flat=True))
    assert all(k.startswith("p4g-") and not k.startswith("p4g-p4g-") for k in keys), keys
    older = make_study(slug="older", domain="p4g")
    first = Scenario.objects.create(study=older, key=f"p4g-{keys[0]}", domain="p4g", payload={})
    assert import_pool(older, "p4g") == (29, 1)  # the persona imported before is not added again
    assert not older.scenarios.filter(key=keys[0]).exists() and first.pk


def test_the_briefing_and_the_persuaders_prompt_say_the_studys_length():
    study = make_study(slug="give", domain="p4g", max_exchanges=8, arms=("a",))
    import_pool(study, "p4g", 1)
    briefing = study.scenarios.get().instructions
    assert "up to 8 messages from each side" in briefing and "five" not in briefing
    participant, _ = arrive(study, prolific(pid="giver"))
    participant = give_consent(participant, True)
    prompt = system_prompt(participant)
    assert "up to 8 messages from each side" in prompt and "five" not in prompt
