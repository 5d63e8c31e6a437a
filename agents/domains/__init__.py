"""Task families served to simulated users and to people: `get_domain(name, data_dir=None)`.

The registry maps a name to "module:Class" and imports on first use, so importing
agents.domains stays cheap and each family lives in its own package.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from pathlib import Path

from .base import Domain, Message, Outcome, QuestionnaireInput, Scenario

DOMAINS: dict[str, str] = {
    "retail": "agents.domains.tau2:RetailDomain",
    "airline": "agents.domains.tau2:AirlineDomain",
    "p4g": "agents.domains.p4g:P4GDomain",
    "p4g-decision": "agents.domains.p4g.decision:P4GDecisionDomain",
    "cooperbench": "agents.domains.cooperbench:CooperBenchDomain",
}
# Domains people can take part in. The P4G decision episode is a training experiment: its agent
# must choose from fixed asks, which a served chat model does not do. CooperBench is training
# only: its partner is a coding agent, not a person chatting.
TRAINING_ONLY = ("p4g-decision", "cooperbench")
STUDY_DOMAINS = tuple(name for name in DOMAINS if name not in TRAINING_ONLY)


def domain_class(name: str) -> type[Domain]:
    if name not in DOMAINS:
        raise ValueError(f"unknown domain {name!r}: expected one of {', '.join(DOMAINS)}")
    module, _, cls_name = DOMAINS[name].partition(":")
    return getattr(importlib.import_module(module), cls_name)


def domain_choices(names: Iterable[str] | None = None) -> list[tuple[str, str]]:
    """(name, title) of each Domain (default: every registered one), for choices and help."""
    return [
        (name, domain_class(name).title or name) for name in (DOMAINS if names is None else names)
    ]


def input_choices(names: Iterable[str] | None = None) -> list[tuple[str, str]]:
    """(name, description) of every questionnaire input the Domains declare, for choices."""
    choices = {}
    for name in DOMAINS if names is None else names:
        cls = domain_class(name)
        for need in cls.questionnaire_inputs:
            choices.setdefault(need.name, f"{cls.title or name}: {need.describe()}")
    return list(choices.items())


def get_domain(name: str, data_dir: str | Path | None = None, protocol: str = "") -> Domain:
    """A fresh Domain; data_dir points at official data (None: the project's bundled data);
    protocol names one of the Domain's `protocols` ("": its default)."""
    cls = domain_class(name)
    kwargs: dict = {} if data_dir is None else {"data_dir": data_dir}
    if protocol:
        if protocol not in cls.protocols:
            known = ", ".join(cls.protocols) or "none: it has one protocol"
            raise ValueError(f"domain {name!r} has no protocol {protocol!r} (known: {known})")
        kwargs["protocol"] = protocol
    return cls(**kwargs)


__all__ = [
    "DOMAINS",
    "STUDY_DOMAINS",
    "Domain",
    "Message",
    "Outcome",
    "QuestionnaireInput",
    "Scenario",
    "domain_choices",
    "domain_class",
    "get_domain",
    "input_choices",
]
