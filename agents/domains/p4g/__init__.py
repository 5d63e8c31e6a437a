"""Persuasion for Good (Wang et al., 2019) as a parley Domain."""

from agents.domains.p4g.domain import (
    DONATION,
    INTENDED_DONATION,
    P4GDomain,
    donation_reward,
    human_outcome,
)
from agents.domains.p4g.donation import conversation_donation, parse_donation
from agents.domains.p4g.personas import load_bundled, load_full_info, persona_from_record

__all__ = [
    "DONATION",
    "INTENDED_DONATION",
    "P4GDomain",
    "conversation_donation",
    "donation_reward",
    "human_outcome",
    "load_bundled",
    "load_full_info",
    "parse_donation",
    "persona_from_record",
]
