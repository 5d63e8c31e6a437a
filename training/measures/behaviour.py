"""COLLAPSE-AWARE's measures of simulator behaviour (MCI, SCD, BDI, PSOD, ...): written once, in
agents/behaviour/measures.py, where the study half's sim-to-real report reaches them too
(studies may not import training). Re-exported here under the name training's modules use."""

from agents.behaviour.measures import (  # noqa: F401
    bdi,
    bootstrap,
    coverage_growth,
    covered,
    entropy,
    jensen_shannon,
    mci,
    mixture,
    psod,
    scd,
    shannon,
    shares,
    support,
)
