"""Scenario pools from the Domains: bundled data or an official data folder."""

import random
from pathlib import Path

from django.db import transaction

from agents.domains import STUDY_DOMAINS
from studies.lib.domain_bridge import protocol_of, shared_domain
from studies.models import Scenario, Study


class PoolError(ValueError):
    pass


@transaction.atomic
def scenario_key(domain: str, scenario_id: str) -> str:
    """A scenario's key in a pool: its id, after the domain's name unless the id begins with it
    already (P4G's ids are "p4g-<persona>": once read "p4g-p4g-<persona>")."""
    return scenario_id if scenario_id.startswith(f"{domain}-") else f"{domain}-{scenario_id}"


def import_pool(
    study: Study,
    domain: str,
    count: int | None = None,
    split: str | None = None,
    source: str = "",
    seed: int = 0,
) -> tuple[int, int]:
    """Add `count` scenarios of `domain` (all if None) to the study; returns (added, already there).

    Scenarios already in the pool (same key) are left as they are: an import never loses data.
    """
    if domain not in STUDY_DOMAINS:
        raise PoolError(f"Unknown domain {domain!r}; choose one of {', '.join(STUDY_DOMAINS)}.")
    if source and not Path(source).exists():
        raise PoolError(f"No data folder at {source}.")
    if count is not None and count < 1:
        raise PoolError("The number of scenarios must be at least 1.")
    try:
        family = shared_domain(domain, source, protocol_of(study, domain))
        scenarios = family.scenarios(split or None)
    except (OSError, ValueError, KeyError) as error:
        raise PoolError(
            f"Could not load {domain} scenarios from {source or 'the bundled data'}: {error}"
        ) from error
    if not scenarios:
        raise PoolError(f"No {domain} scenarios in split {split!r}.")
    if count is not None and count < len(scenarios):
        scenarios = random.Random(seed).sample(scenarios, count)
    # the briefing says the study's own length (P4G's "up to N messages from each side")
    family = family.with_turn_limit(2 * study.max_exchanges)
    added = existing = 0
    for scenario in scenarios:
        key = scenario_key(domain, scenario.id)
        if study.scenarios.filter(key=f"{domain}-{scenario.id}").exists():  # an older import's key
            existing += 1
            continue
        _, created = Scenario.objects.get_or_create(
            study=study,
            key=key,
            defaults=dict(
                title=scenario.title or f"{domain} {scenario.id}",
                domain=domain,
                payload=scenario.payload,
                source=str(source),
                instructions=family.user_instructions(scenario),
            ),
        )
        added, existing = added + created, existing + (not created)
    return added, existing
