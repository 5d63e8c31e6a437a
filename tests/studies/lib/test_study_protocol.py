"""A study picks its Domain's protocol (Study.domain_protocol): blank keeps the default (P4G:
parley's honest persuader, made for people); P4G's "release" runs the paper's released task on
the scenarios imported under it, and a protocol the study's task lacks is refused."""

from pathlib import Path

import pytest
from django.core.exceptions import ValidationError

from studies.lib import domain_bridge
from studies.setup.scenario_pools import PoolError, import_pool
from tests.support.studies import make_study

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "p4g_release"


@pytest.mark.django_db
def test_a_study_runs_the_protocol_it_names():
    default = make_study(slug="p4g-default", domain="p4g")
    assert import_pool(default, "p4g", count=2) == (2, 0)
    domain, scenario = domain_bridge.domain_and_scenario(default, default.scenarios.first())
    assert domain.protocol == "parley" and domain.greeting(scenario)  # the fixed greeting

    released = make_study(slug="p4g-release", domain="p4g", domain_protocol="release")
    released.full_clean()
    with pytest.raises(PoolError, match="needs the official data"):  # never the bundled set
        import_pool(released, "p4g")
    assert import_pool(released, "p4g", source=str(FIXTURE), split="train") == (3, 0)
    row = released.scenarios.order_by("key").first()
    assert row.payload["source"] == "release" and row.payload["persuader"]
    domain, scenario = domain_bridge.domain_and_scenario(released, row)
    assert domain.protocol == "release" and domain.greeting(scenario) is None
    assert "bonus equal to whatever amount" in domain_bridge.system_prompt_of(
        domain, scenario, released.arms.first()
    )
    # the prompt says the study's own length (make_study: 5 exchanges a side)
    assert "for 5 chat turns" in domain.agent_system_prompt(scenario)


@pytest.mark.django_db
def test_a_protocol_the_task_lacks_is_refused():
    for fields in (
        {"domain": "p4g", "domain_protocol": "honest"},
        {"domain": "retail", "domain_protocol": "release"},
        {"domain": "chat", "domain_protocol": "release"},
    ):
        study = make_study(slug=f"s-{fields['domain']}", **fields)
        with pytest.raises(ValidationError) as refused:
            study.full_clean()
        assert "domain_protocol" in refused.value.message_dict
