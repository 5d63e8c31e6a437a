"""Loading a tau2 task set: the project's bundled data, or a folder in the official layout.

    <dir>/retail/{db.json, tasks.json, policy.md, split_tasks.json}
    <dir>/airline/{db.json | tau-bench-v1/{flights,users,reservations}.json, tasks.json, policy.md, split_tasks.json}

`data_dir` may be the folder holding retail/ and airline/ or the domain folder itself. The DB is
checked and put into canonical form once per process and then shared read-only (see store.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .airline import AIRLINE_DB
from .retail import RETAIL_DB

BUNDLED_DIR = Path(__file__).resolve().parent / "data"
DB_SHAPES = {"retail": RETAIL_DB, "airline": AIRLINE_DB}
TAU2_DOMAINS = tuple(DB_SHAPES)  # the tau2 Domains, one per database shape
V1_TABLES = ("flights", "users", "reservations")


@dataclass
class TaskSet:
    domain: str
    source: str  # "bundled", or the resolved folder it came from
    db: dict[str, dict[str, Any]]  # canonical, shared: never change it
    tasks: list[dict[str, Any]]
    policy: str
    splits: dict[str, list[str]]
    json_cache: dict = field(
        default_factory=dict
    )  # canonical JSON of shared records (Store.digest)


_loaded: dict[tuple[str, str], TaskSet] = {}


def domain_folder(domain: str, data_dir: str | Path | None) -> Path:
    if domain not in DB_SHAPES:
        raise ValueError(f"unknown tau2 domain {domain!r}: expected one of {', '.join(DB_SHAPES)}")
    base = Path(data_dir).expanduser().resolve() if data_dir is not None else BUNDLED_DIR
    for folder in (base / domain, base):
        if (folder / "tasks.json").is_file():
            return folder
    raise FileNotFoundError(
        f"no {domain} tasks.json under {base} (expected {base / domain / 'tasks.json'} or {base / 'tasks.json'})"
    )


def load_task_set(domain: str, data_dir: str | Path | None = None) -> TaskSet:
    """The task set of `domain` from `data_dir` (None: the bundled data), cached per folder."""
    folder = domain_folder(domain, data_dir)
    source = (
        "bundled" if data_dir is None or folder == (BUNDLED_DIR / domain).resolve() else str(folder)
    )
    key = (domain, str(folder))
    if key not in _loaded:
        tasks = read_tasks(folder / "tasks.json")
        policy = read_text(folder / "policy.md")
        splits = read_splits(folder / "split_tasks.json")
        db = read_db(domain, folder)
        _loaded[key] = TaskSet(domain, source, db, tasks, policy, splits)
    return _loaded[key]


def read_json(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        raise FileNotFoundError(f"missing {path}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from None


def read_text(path: Path) -> str:
    if not path.is_file():
        raise FileNotFoundError(f"missing {path}")
    return path.read_text(encoding="utf-8")


def read_db(domain: str, folder: Path) -> dict[str, dict[str, Any]]:
    if (folder / "db.json").is_file():
        raw, where = read_json(folder / "db.json"), folder / "db.json"
    elif domain == "airline" and (folder / "tau-bench-v1").is_dir():
        where = folder / "tau-bench-v1"
        raw = {table: read_json(where / f"{table}.json") for table in V1_TABLES}
        # tau-bench v1 keys users by id without repeating it; tau2's User has user_id first.
        raw["users"] = {uid: {"user_id": uid, **user} for uid, user in raw["users"].items()}
    else:
        raise FileNotFoundError(f"missing {folder / 'db.json'}")
    try:
        return DB_SHAPES[domain](raw)
    except ValueError as exc:
        raise ValueError(f"{where} does not fit the tau2 {domain} schema: {exc}") from None


def read_tasks(path: Path) -> list[dict[str, Any]]:
    tasks = read_json(path)
    if not isinstance(tasks, list):
        raise ValueError(f"{path} must hold a list of tasks")
    seen = set()
    for n, task in enumerate(tasks):
        problem = task_problem(task)
        if problem:
            raise ValueError(f"{path}: task #{n}: {problem}")
        if task["id"] in seen:
            raise ValueError(f"{path}: task id {task['id']!r} appears twice")
        seen.add(task["id"])
    return tasks


def task_problem(task: Any) -> str | None:
    """Why `task` is not a usable tau2 task, or None."""
    if not isinstance(task, dict) or not isinstance(task.get("id"), str):
        return "a task needs a string 'id'"
    scenario = task.get("user_scenario")
    if not isinstance(scenario, dict) or "instructions" not in scenario:
        return f"task {task['id']!r} has no user_scenario.instructions"
    criteria = task.get("evaluation_criteria")
    if criteria is not None and not isinstance(criteria, dict):
        return f"task {task['id']!r}: evaluation_criteria must be an object"
    for action in (criteria or {}).get("actions") or []:
        if not isinstance(action, dict) or not isinstance(action.get("name"), str):
            return f"task {task['id']!r}: every action needs a 'name'"
        if not isinstance(action.get("arguments", {}), dict):
            return f"task {task['id']!r}: action {action['name']!r} arguments must be an object"
    return None


def read_splits(path: Path) -> dict[str, list[str]]:
    if not path.is_file():
        return {}
    splits = read_json(path)
    if not isinstance(splits, dict) or not all(isinstance(v, list) for v in splits.values()):
        raise ValueError(f"{path} must map split names to lists of task ids")
    return {name: [str(i) for i in ids] for name, ids in splits.items()}
