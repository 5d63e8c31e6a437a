"""A conversation's tau2 state: its own DB (a Store) behind the domain's tools.

Between reconnects a study keeps only `dump()`: the task id, where the data came from, and the
write-tool calls made so far (failed ones too: an official tool may change the DB before it
fails). The tools are deterministic (fixed clock, fixed new ids), so replaying those calls on a
fresh copy rebuilds the DB exactly. That is a few hundred bytes instead of the 3 MB official DB.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from .store import Store
from .taskset import DB_SHAPES, TaskSet
from .toolkit import Toolkit


@dataclass
class Tau2State:
    task: dict[str, Any]  # the scenario's task: scoring needs its gold actions
    tools: Toolkit
    writes: list[dict[str, Any]] = field(default_factory=list)

    @property
    def task_id(self) -> str:
        return self.task["id"]

    @property
    def db(self) -> Store:
        return self.tools.db

    def run(self, name: str, arguments: Any) -> tuple[str, bool]:
        content, error = self.tools.run(name, arguments)
        if self.tools.is_write(name):
            self.writes.append({"name": name, "arguments": copy.deepcopy(arguments)})
        return content, error

    def dump(self, source: str) -> dict[str, Any]:
        return {"task_id": self.task_id, "data_source": source, "writes": list(self.writes)}


def fresh_tools(task_set: TaskSet, toolkit: type[Toolkit], task: dict[str, Any]) -> Toolkit:
    """The tools over a fresh copy of the DB with the task's initial_state applied."""
    tools = toolkit(Store(task_set.db))
    initial = task.get("initial_state") or {}
    data = (initial.get("initialization_data") or {}).get("agent_data")
    if data:
        merge_into(tools.db, data, task_set.domain)
    for call in initial.get("initialization_actions") or []:
        if call.get("env_type", "assistant") != "assistant":
            raise ValueError(
                f"task {task['id']!r}: only assistant-side initialization actions exist in {task_set.domain}"
            )
        content, error = tools.run(call.get("func_name", ""), call.get("arguments") or {})
        if error:
            raise ValueError(
                f"task {task['id']!r}: initialization action {call.get('func_name')!r} failed: {content}"
            )
    for message in initial.get("message_history") or []:
        for call in message.get("tool_calls") or []:  # tau2's ToolCall: {id, name, arguments}
            tools.run(call.get("name", ""), call.get("arguments") or {})
    return tools


def merge_into(store: Store, update: dict[str, Any], domain: str) -> None:
    """tau2's initialization_data: deep-merge into the DB, then re-check the touched records."""
    shapes = {name: shape.shape for name, shape, _ in DB_SHAPES[domain].fields}
    for table, rows in update.items():
        if table not in shapes or not isinstance(rows, dict):
            raise ValueError(f"initialization_data: {table!r} is not a table of the {domain} DB")
        for key, patch in rows.items():
            record = store.edit(table, key) if key in store.tables[table] else {}
            store.put(table, key, shapes[table](deep_merge(record, patch), f"{table}[{key!r}]"))


def deep_merge(into: Any, patch: Any) -> Any:
    if isinstance(into, dict) and isinstance(patch, dict):
        merged = dict(into)
        for key, value in patch.items():
            merged[key] = deep_merge(into.get(key), value)
        return merged
    return patch


def rebuild(
    task_set: TaskSet, toolkit: type[Toolkit], task: dict[str, Any], calls: list[tuple[str, Any]]
) -> Tau2State:
    """A fresh state with these (name, arguments) tool calls run on it."""
    state = Tau2State(task, fresh_tools(task_set, toolkit, task))
    for name, arguments in calls:
        state.run(name, arguments)
    return state
