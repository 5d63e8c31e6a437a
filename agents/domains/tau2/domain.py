"""The tau2 retail and airline Domains: tasks, prompts, tools, per-conversation state, scoring."""

from __future__ import annotations

import copy
import json
from collections import OrderedDict
from pathlib import Path
from typing import Any

from ..base import Domain, Message, Outcome, Scenario, message_text
from . import prompts
from .airline import AirlineTools
from .retail import RetailTools, RetailToolsV1
from .scoring import NLJudge, score
from .state import Tau2State, fresh_tools, rebuild
from .store import Store
from .taskset import TaskSet, load_task_set
from .toolkit import Toolkit
from .versions import TaskVersion, judged_tasks, task_version, version_problem


class Tau2Domain(Domain):
    toolkit: type[Toolkit] = Toolkit
    # the release's tau2 Self-Play default (training/regimes/sim_rewards.py)
    simulator_reward = "curriculum"
    agent_name, user_name = "agent", "customer"
    max_turns = 60  # user and agent messages; tau2 tasks often need 20 or more of each
    max_steps = 100  # every message, tool calls and results included (tau2's default)
    max_errors = 10  # tool errors (tau2's default)
    gold_cache_size = 256
    # the release runs Persona-Guided on retail; airline's customer simulator takes the same text
    simulator_guidelines = prompts.PERSONA_GUIDELINES

    # the toolkit of each task version that adds tools (versions.py); others use `toolkit`
    version_toolkits: dict[str, type[Toolkit]] = {}

    def __init__(
        self,
        data_dir: str | Path | None = None,
        nl_judge: NLJudge | None = None,
        version: str = "",
    ):
        """data_dir: a folder in the official layout (None: the bundled data, v0.2.0-shaped).
        nl_judge: scores NL assertions (judge.LLMJudge); without it an NL part of a task's
        reward basis is "unjudged": left out of the reward and never a success (scoring.py).
        version: the tau2-bench task version ("" = versions.DEFAULT_VERSION); task files of
        another version are refused when first read."""
        self.version: TaskVersion = task_version(version)
        self.toolkit = self.version_toolkits.get(self.version.name, type(self).toolkit)
        self.data_dir = data_dir
        self.nl_judge = nl_judge
        self._task_set: TaskSet | None = None
        self._gold: OrderedDict[str, Store] = OrderedDict()

    @property
    def task_set(self) -> TaskSet:
        if self._task_set is None:
            task_set = load_task_set(self.name, self.data_dir)
            where = f"the {self.name} tasks of {task_set.source}"
            problem = version_problem(self.version, task_set.tasks, where)
            if problem:
                raise ValueError(problem)
            self._task_set = task_set
        return self._task_set

    def check_judge(self) -> None:
        """Refuse a run whose tasks need the NL judge when none is configured: its rewards would
        leave those assertions out (scoring.py), training toward, and reporting, something
        other than the benchmark's score. Called where a run starts (RunConfig.build_domain)."""
        if self.nl_judge is not None:
            return
        needing = judged_tasks(self.task_set.tasks)
        if needing:
            raise ValueError(
                f"{len(needing)} of {len(self.task_set.tasks)} tau2 {self.version.name}"
                f" {self.name} tasks score NL assertions (NL_ASSERTION in their reward basis,"
                f" e.g. task {needing[0]!r}) and no NL judge is configured: set nl_judge.endpoint"
                " and nl_judge.model (a model behind an OpenAI-compatible server), or use"
                ' tau2_version = "v0.2.0"'
            )

    # -- scenarios ----------------------------------------------------------------------------

    def scenarios(self, split: str | None = None) -> list[Scenario]:
        tasks = self.task_set.tasks
        if split is not None:
            splits = self.task_set.splits
            if split not in splits:
                known = ", ".join(splits) or "none: there is no split_tasks.json"
                raise ValueError(f"{self.name} has no split {split!r} (splits: {known})")
            wanted = set(splits[split])
            tasks = [t for t in tasks if t["id"] in wanted]
        return [self.scenario(task) for task in tasks]

    def scenario(self, task: dict[str, Any]) -> Scenario:
        """A Scenario for one task; the payload is the task plus where its DB comes from."""
        instructions = (task.get("user_scenario") or {}).get("instructions")
        reason = (
            instructions.get("reason_for_call", "")
            if isinstance(instructions, dict)
            else str(instructions or "")
        )
        title = " ".join(reason.split())
        title = title if len(title) <= 80 else title[:77] + "..."
        payload = {
            **copy.deepcopy(task),
            "data_source": self.task_set.source,
            "tau2_version": self.version.name,
        }
        return Scenario(id=str(task["id"]), domain=self.name, payload=payload, title=title)

    def _task(self, scenario: Scenario) -> dict[str, Any]:
        source = scenario.payload.get("data_source", self.task_set.source)
        if source != self.task_set.source:
            raise ValueError(
                f"scenario {scenario.id!r} was made from {source} data but this {self.name} domain reads "
                f"{self.task_set.source}; create the domain with that data_dir"
            )
        # scenarios stored before versions existed were made under the default (v0.2.0)
        version = scenario.payload.get("tau2_version") or task_version("").name
        if version != self.version.name:
            raise ValueError(
                f"scenario {scenario.id!r} is a tau2 {version} task but this {self.name} domain"
                f" scores {self.version.name}; create the domain with version={version!r}"
            )
        return scenario.payload

    # -- prompts ------------------------------------------------------------------------------

    def agent_system_prompt(self, scenario: Scenario) -> str:
        return prompts.agent_prompt(self.task_set.policy)

    def greeting(self, scenario: Scenario) -> str | None:
        return prompts.GREETING

    def user_instructions(self, scenario: Scenario) -> str:
        return prompts.human_instructions(scenario.payload)

    def simulator_system_prompt(self, scenario: Scenario) -> str:
        return prompts.simulator_prompt(scenario.payload)

    # -- tools and state ----------------------------------------------------------------------

    def tools(self, scenario: Scenario) -> list[dict[str, Any]]:
        return self.toolkit.schemas()

    def new_state(self, scenario: Scenario) -> Tau2State:
        return rebuild(self.task_set, self.toolkit, self._task(scenario), [])

    def execute_tool(self, state: Tau2State, name: str, arguments: dict[str, Any] | str) -> str:
        return state.run(name, arguments)[0]

    def dump_state(self, state: Tau2State) -> dict[str, Any]:
        return state.dump(self.task_set.source)

    def load_state(self, scenario: Scenario, data: Any) -> Tau2State:
        if not isinstance(data, dict) or not isinstance(data.get("writes"), list):
            raise ValueError(f"not a dumped {self.name} state: {str(data)[:80]!r}")
        task = self._task(scenario)
        if data.get("task_id") != task["id"] or data.get("data_source") != self.task_set.source:
            raise ValueError(
                f"stored state belongs to task {data.get('task_id')!r} of {data.get('data_source')}, "
                f"not to task {task['id']!r} of {self.task_set.source}"
            )
        return rebuild(
            self.task_set, self.toolkit, task, [(w["name"], w["arguments"]) for w in data["writes"]]
        )

    # -- ending and scoring -------------------------------------------------------------------

    def is_done(self, conversation: list[Message]) -> str | None:
        last = conversation[-1] if conversation else {}
        if last.get("role") == "user":
            text = message_text(last)
            for marker, reason in (
                (prompts.STOP, "user_stop"),
                (prompts.TRANSFER, "user_transfer"),
                (prompts.OUT_OF_SCOPE, "user_out_of_scope"),
            ):
                if marker in text:
                    return reason
        if last.get("role") == "assistant" and message_text(last) and not last.get("tool_calls"):
            # After a transfer the agent says goodbye once; that message closes the chat.
            if any(
                m.get("role") == "tool" and m.get("name") == "transfer_to_human_agents"
                for m in conversation
            ):
                return "agent_transfer"
        errors = sum(
            1
            for m in conversation
            if m.get("role") == "tool" and message_text(m).startswith("Error:")
        )
        if errors >= self.max_errors:
            return "too_many_errors"
        if len(conversation) >= self.max_steps:
            return "max_steps"
        return super().is_done(conversation)

    def score(
        self, conversation: list[Message], state: Tau2State, end_reason: str | None = None
    ) -> Outcome:
        if not isinstance(state, Tau2State):
            raise TypeError(
                f"{self.name} scores a Tau2State (from new_state or load_state), not {type(state).__name__}"
            )
        return score(
            state.task,
            conversation,
            state.db,
            gold_db=lambda: self.gold_db(state.task),
            digest=lambda store: store.digest(self.task_set.json_cache),
            end_reason=end_reason,
            judge=self.nl_judge,
            initial_db=lambda: self.initial_db(state.task),
        )

    def initial_db(self, task: dict[str, Any]) -> Store:
        """The task's DB before any action (as the gold replay starts from it)."""
        return fresh_tools(self.task_set, self.toolkit, task).db

    def gold_db(self, task: dict[str, Any]) -> Store:
        """The DB the gold actions leave (tool errors ignored, as in tau2), cached per task."""
        criteria = task.get("evaluation_criteria") or {}
        key = json.dumps(
            [task["id"], task.get("initial_state"), criteria.get("actions")],
            sort_keys=True,
            default=str,
        )
        if key in self._gold:
            self._gold.move_to_end(key)
            return self._gold[key]
        tools = fresh_tools(self.task_set, self.toolkit, task)
        for action in criteria.get("actions") or []:
            tools.run(action["name"], action.get("arguments") or {})
        self._gold[key] = tools.db
        if len(self._gold) > self.gold_cache_size:
            self._gold.popitem(last=False)
        return tools.db


class RetailDomain(Tau2Domain):
    name = "retail"
    title = "tau2 retail"
    toolkit = RetailTools
    version_toolkits = {"v1.0.0": RetailToolsV1}


class AirlineDomain(Tau2Domain):
    name = "airline"
    title = "tau2 airline"
    toolkit = AirlineTools
