"""User simulators: the plain single-reply simulator and Verbalized Sampling."""

from agents.messages import OPENING, user_view
from agents.simulators.base import Candidate, Simulator, UserTurn
from agents.simulators.plain import PlainSimulator
from agents.simulators.verbalized import (
    VerbalizedSampling,
    VerbalizedSimulator,
    draw,
    parse_verbalized,
    response_format,
    verbalized_schema,
)

__all__ = [
    "OPENING",
    "Candidate",
    "PlainSimulator",
    "Simulator",
    "UserTurn",
    "VerbalizedSampling",
    "VerbalizedSimulator",
    "draw",
    "parse_verbalized",
    "response_format",
    "user_view",
    "verbalized_schema",
]
