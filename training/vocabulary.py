"""training's vocabularies, each declared once: the config's validation, the admin's choices and
filters, the CLI's help and the trainer all read them from here.

str-valued enums: a member equals its string, so TOML configs, stored TrainingRun rows and
manifests keep the plain names ("single", "plain") they always had.
"""

from __future__ import annotations

from enum import StrEnum

# declared with the simulator spec, below training (a regime names the kind it is made of)
from agents.simulators.spec import SimulatorKind


class Regime(StrEnum):
    """Where the agent's simulator comes from and whether it learns. Each member carries its
    label (the paper's name; its release keeps "cotrain" in its identifiers for Self-Play:
    CHATS-lab/scope_usim cmd/slime/README.md), whether it trains the simulator, and the simulator
    kind it is made of (None: the config's own). training/regimes/regime.py has one class per
    member, each naming its member."""

    label: str
    trains_simulator: bool
    simulator_kind: SimulatorKind | None

    SINGLE = "single", "RL single simulator"
    PERSONA = "persona", "Persona-Guided"
    ENSEMBLE = "ensemble", "Ensemble"
    VERBALIZED = "verbalized", "Verbalized Sampling", False, SimulatorKind.VERBALIZED
    COTRAIN = "cotrain", "Self-Play (co-training)", True
    POPULATION = "population", "Population Self-Play", True

    def __new__(
        cls,
        value: str,
        label: str,
        trains_simulator: bool = False,
        simulator_kind: SimulatorKind | None = None,
    ):
        member = str.__new__(cls, value)
        member._value_ = value
        member.label = label
        member.trains_simulator = trains_simulator
        member.simulator_kind = simulator_kind
        return member

    @classmethod
    def choices(cls) -> list[tuple[str, str]]:
        """(name, label) of every regime, in declaration order (Django choices, the CLI's help)."""
        return [(r.value, r.label) for r in cls]
