"""CooperBench (cooperbench/CooperBench): the Domain, its task layout, the agents' workspace and
tools, and its scoring of two agents' merged patches. Training only: no study serves it."""

from agents.domains.cooperbench.domain import CooperBenchDomain, CooperBenchState
from agents.domains.cooperbench.scoring import (
    FeatureResult,
    PairScore,
    filter_test_files,
    score_pair,
)
from agents.domains.cooperbench.task import (
    Feature,
    Task,
    discover_tasks,
    feature_pairs,
    read_task,
)

__all__ = [
    "CooperBenchDomain",
    "CooperBenchState",
    "Feature",
    "FeatureResult",
    "PairScore",
    "Task",
    "discover_tasks",
    "feature_pairs",
    "filter_test_files",
    "read_task",
    "score_pair",
]
