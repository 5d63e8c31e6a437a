"""CooperBench (cooperbench/CooperBench): its task layout and its scoring of two agents' patches.

The Domain, the agents' tools and the partner come later (issue 28); this package reads tasks
and scores a pair of patches in an agents.sandbox.Sandbox.
"""

from agents.cooperbench.scoring import FeatureResult, PairScore, filter_test_files, score_pair
from agents.cooperbench.task import Feature, Task, discover_tasks, feature_pairs, read_task

__all__ = [
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
