"""CooperBench's task layout, read from a folder.

Ported from the benchmark's own repository (cooperbench/CooperBench at 44b4a7a):
dataset/README.md (the layout) and src/cooperbench/runner/tasks.py (discovery: a task is a
`task{id}` folder in a `{repo}_task` folder with at least two `feature{n}` folders).

    {repo}_task/task{id}/
        Dockerfile      the image: the repository at its pinned commit, its environment, runner.sh
        setup.sh        sets BASE_COMMIT
        runner.sh       `runner.sh TESTS_PATCH [FEATURE_PATCH]`: applies both, runs the tests
        feature{n}/feature.md     the request an agent is given
        feature{n}/feature.patch  the gold implementation
        feature{n}/tests.patch    the hidden tests
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path


@dataclass(frozen=True)
class Feature:
    number: int
    request: str  # feature.md
    gold_patch: str  # feature.patch
    tests_patch: str  # tests.patch, never shown to the agents


@dataclass(frozen=True)
class Task:
    repo_name: str  # the `{repo}_task` folder's name
    task_id: int
    folder: Path
    features: dict[int, Feature]
    base_commit: str | None  # setup.sh's BASE_COMMIT
    repository: str | None = None  # setup.sh's REPO_NAME: the checkout's folder name

    @property
    def runner(self) -> Path:
        return self.folder / "runner.sh"

    @property
    def dockerfile(self) -> Path:
        return self.folder / "Dockerfile"


def read_task(folder: str | Path) -> Task:
    folder = Path(folder)
    match = re.fullmatch(r"task(\d+)", folder.name)
    if match is None:
        raise ValueError(f"{folder} is not a CooperBench task folder (task<id>)")
    features = {}
    for feature_dir in sorted(folder.glob("feature*")):
        number = re.fullmatch(r"feature(\d+)", feature_dir.name)
        if number is None or not feature_dir.is_dir():
            continue
        tests = feature_dir / "tests.patch"
        if not tests.is_file():
            raise ValueError(f"{feature_dir} has no tests.patch")
        features[int(number.group(1))] = Feature(
            number=int(number.group(1)),
            request=_read(feature_dir / "feature.md"),
            gold_patch=_read(feature_dir / "feature.patch"),
            tests_patch=tests.read_text(),
        )
    if not (folder / "runner.sh").is_file():
        raise ValueError(f"{folder} has no runner.sh")
    setup = _read(folder / "setup.sh")
    base = re.search(r'^BASE_COMMIT="?([^"\n]+)"?', setup, re.MULTILINE)
    repository = re.search(r'^REPO_NAME="?([^"\n]+)"?', setup, re.MULTILINE)
    return Task(
        repo_name=folder.parent.name,
        task_id=int(match.group(1)),
        folder=folder,
        features=features,
        base_commit=base.group(1) if base else None,
        repository=repository.group(1) if repository else None,
    )


def discover_tasks(dataset_dir: str | Path) -> list[Task]:
    """Every task with at least two features, in the benchmark's order (sorted folder names)."""
    tasks = []
    for repo_dir in sorted(Path(dataset_dir).iterdir()):
        if not repo_dir.is_dir():
            continue
        for task_dir in sorted(repo_dir.iterdir()):
            if task_dir.is_dir() and re.fullmatch(r"task\d+", task_dir.name):
                task = read_task(task_dir)
                if len(task.features) >= 2:
                    tasks.append(task)
    return tasks


def feature_pairs(task: Task) -> list[tuple[int, int]]:
    """The cooperative setting's pairs: every two features of a task, lower number first."""
    return list(combinations(sorted(task.features), 2))


def _read(path: Path) -> str:
    return path.read_text() if path.is_file() else ""
