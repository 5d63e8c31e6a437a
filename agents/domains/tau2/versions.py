"""The tau2-bench task versions parley scores: what each version's task files and scoring are.

Both versions share the retail DB, both policies and the task ids (retail 0-113, airline 0-49);
the splits (retail 74 train / 40 test, airline 30 / 20) come from v1.0.x's split_tasks.json and
apply to both, since the ids are the same. What v1.0.0 (tau2-bench tag v1.0.0, 2026-03-18)
changes, read from the two tags' data/tau2/domains/*/tasks.json:

- every task carries `evaluation_criteria.reward_basis` (v0.2.0's have none: tau2's default,
  DB x COMMUNICATE). Retail: 112 of 114 tasks are DB x NL_ASSERTION (40 of them with assertions
  to judge; an empty list is met, as in tau2), 2 are DB alone; airline stays DB x COMMUNICATE.
- gold actions change in 10 retail tasks and 12 airline tasks; NL assertions, communicate_info,
  some user scenarios and descriptions are rewritten.
- retail gains the read tool `get_item_details` (an item's variant by item id).

tau2 judges NL assertions with an LLM over the transcript (evaluator_nl_assertions.py; by
default gpt-4.1-2025-04-14 at temperature 0): parley does so with a configured judge
(judge.py), and never counts them without one (scoring.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TaskVersion:
    name: str
    # True: every task names its reward basis (v1.0.0); False: none does (v0.2.0, where the
    # basis is tau2's default, DB x COMMUNICATE). Task files of the other shape are refused.
    names_reward_basis: bool
    # read tools this version adds to a domain's toolkit, by domain
    added_tools: dict[str, tuple[str, ...]]
    summary: str


VERSIONS: dict[str, TaskVersion] = {
    "v0.2.0": TaskVersion(
        "v0.2.0",
        names_reward_basis=False,
        added_tools={},
        summary="tau2-bench v0.2.0 (2025-10-06; task files unchanged since 2025-06-10 until"
        " v1.0.0): DB x COMMUNICATE for every task, no judge needed",
    ),
    "v1.0.0": TaskVersion(
        "v1.0.0",
        names_reward_basis=True,
        added_tools={"retail": ("get_item_details",)},
        summary="tau2-bench v1.0.0 (2026-03-18; v1.0.1 has the same task files): each task's"
        " own reward basis, retail mostly DB x NL_ASSERTION (LLM-judged), 10 retail and 12"
        " airline tasks with new gold actions, retail's get_item_details",
    ),
}

# The domains whose official tasks of a version score NL assertions, so that a run config can be
# refused without reading the files (Tau2Domain.check_judge reads them where a run starts).
NL_JUDGED: dict[str, tuple[str, ...]] = {"v1.0.0": ("retail",)}

# Which version the paper's release scored is not known: its submodule pin cannot be read. Its
# tau2 environment imports tau2.gym (added to tau2-bench on 2025-11-10, after the v0.2.0 tag), so
# it ran a later commit; every commit until v1.0.0 (2026-03-18) serves v0.2.0's task files
# (unchanged since 2025-06-10), but its dated launcher folders run from 0206 to 0417, across
# v1.0.0's release, so either is possible. The default stays v0.2.0: the task files of every
# commit the release's code could have run before 2026-03-18, scored by rules (DB x COMMUNICATE)
# that need no judge, so a default run never depends on a hosted model (docs/training.md,
# "tau2 task versions").
DEFAULT_VERSION = "v0.2.0"


def task_version(name: str) -> TaskVersion:
    """The version called `name` ("" = the default); an unknown name is refused, naming both."""
    name = name or DEFAULT_VERSION
    if name not in VERSIONS:
        raise ValueError(
            f"unknown tau2 task version {name!r}: expected one of {', '.join(VERSIONS)}"
            " (tau2-bench v1.0.1's task files are v1.0.0's: name v1.0.0)"
        )
    return VERSIONS[name]


def version_problem(version: TaskVersion, tasks: list[dict[str, Any]], where: str) -> str | None:
    """Why these task files are not `version`'s (their shape says which version wrote them), or
    None. Scoring v1.0.0 tasks as v0.2.0's would silently change what their reward measures."""
    named = [t["id"] for t in tasks if "reward_basis" in (t.get("evaluation_criteria") or {})]
    if version.names_reward_basis and len(named) < len(tasks):
        missing = [t["id"] for t in tasks if t["id"] not in set(named)]
        return (
            f"{where} are not tau2 {version.name} tasks: {len(missing)} of {len(tasks)} name no"
            f" reward_basis (e.g. task {missing[0]!r}), as v0.2.0's do; set the tau2 version to"
            " v0.2.0 or point at v1.0.0's task files"
        )
    if not version.names_reward_basis and named:
        return (
            f"{where} are not tau2 {version.name} tasks: {len(named)} of {len(tasks)} name a"
            f" reward_basis (e.g. task {named[0]!r}), as v1.0.0's do; set the tau2 version to"
            " v1.0.0 or point at v0.2.0's task files"
        )
    return None


def reward_basis(task: dict[str, Any]) -> list[str]:
    """The task's reward basis: its own, else tau2's default (DB x COMMUNICATE)."""
    return (task.get("evaluation_criteria") or {}).get("reward_basis") or ["DB", "COMMUNICATE"]


def judged_tasks(tasks: list[dict[str, Any]]) -> list[str]:
    """Ids of the tasks whose reward needs the NL judge: NL_ASSERTION in the basis and at least
    one assertion (an empty list is met without a judge, as in tau2)."""
    return [
        t["id"]
        for t in tasks
        if "NL_ASSERTION" in reward_basis(t)
        and (t.get("evaluation_criteria") or {}).get("nl_assertions")
    ]
