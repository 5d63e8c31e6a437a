"""The researcher's side: set up a study as data, watch it fill, read and export what it
gathered. One module per part; importing them registers their ModelAdmins."""

from studies.admin import (
    checkpoints,
    participants,
    payments,
    privacy,
    questionnaires,
    results,
    study,
)

__all__ = [
    "checkpoints",
    "participants",
    "payments",
    "privacy",
    "questionnaires",
    "results",
    "study",
]
