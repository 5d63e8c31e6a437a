"""The CooperBench Domain: two coding agents, one feature each, one repository; their merged
patches scored by both features' hidden tests.

The two speakers are the agent (the one trained, the benchmark's agent1, the lower-numbered
feature) and the user, here the partner (agent2, the other feature), played by any simulator
supply. Both have the same tools (workspace.py), each in a sandbox of its own.

Turns: the benchmark runs the two agents at once and each step is one model call; here they
take steps in turn, one each, a speaker who has submitted or used its steps being skipped, so
the rollout stays a lockstep batch. A message sent with send_message reaches the other before
its next step, as the benchmark delivers it ("[Message from agent1]: ..."); a speaker's own
reasoning and tool traffic stay its own (agent_view, user_view).

Reward (the release's coop launcher, CHATS-lab/scope_usim cmd/slime/cooperbench/
train_qwen3_5_27b.sh with --cooperbench-partial-reward, and usim/cooperbench/reward.py): 1 when
both features pass on the merged tree, 0.5 when only the agent's own feature passes, else 0.
"""

from __future__ import annotations

import json
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.environment import setting
from agents.llm.tool_format import render_tool_calls
from agents.messages import OPENING, Message, message_text
from agents.sandbox import DockerSandbox, Limits, LocalSandbox, Sandbox
from agents.sandbox.docker import build_image

from ..base import Domain, Outcome, Scenario
from . import prompts
from .scoring import score_pair
from .task import Task, discover_tasks, feature_pairs, read_task
from .workspace import STOP_SIGNAL, TOOLS, Workspace, default_limits, prepare_checkout

BUNDLED = Path(__file__).resolve().parent / "data"
AGENT, USER = "agent", "user"
NAMES = {AGENT: "agent1", USER: "agent2"}  # the benchmark's names, which the prompts use
BACKENDS = ("local", "docker")
PARLEY_SANDBOX = setting(
    "PARLEY_SANDBOX",
    "choice",
    "local",
    choices=BACKENDS,
    help="where CooperBench runs its commands when not told: `local` (bubblewrap) or `docker` "
    "(each task's own image)",
)
# "all": every pair of every task (the benchmark itself has no split). "train" / "test": the
# pairs the release lists in data/cooperbench/train_pairs.json (587) and test_pairs.json (65)
# (CHATS-lab/scope_usim @a4086fae / @6218b975): a JSON list of {"id": "{repo}_task/task{N}/
# f{a}_f{b}", ...}, read from the dataset folder or the folder above it.
PAIR_FILES = {"train": "train_pairs.json", "test": "test_pairs.json"}
SPLITS = ("all", *PAIR_FILES)


@dataclass
class CooperBenchState:
    task: str  # the task's folder
    features: tuple[int, int]  # (the agent's, the partner's)
    workspaces: dict[str, Workspace] = field(default_factory=dict)
    outcome: Outcome | None = None


class CooperBenchDomain(Domain):
    name = "cooperbench"
    title = "CooperBench: two coding agents, one repository"
    first_speaker = "agent"
    agent_name, user_name = "agent", "partner"
    simulator_reward = "cooperative"  # the partner's score is the team's
    limits_tool_rounds = False  # every step calls tools; max_steps bounds an episode
    max_steps = 50  # each speaker's: the release's --cooperbench-max-steps 50
    max_turns = 2 * max_steps  # the two speakers' steps together
    partial_reward = True  # the release's coop launcher passes --cooperbench-partial-reward

    def __init__(
        self,
        data_dir: str | Path | None = None,
        *,
        repos_dir: str | Path | None = None,
        backend: str | None = None,
        cache_dir: str | Path | None = None,
        limits: Limits | None = None,
    ):
        """data_dir: a folder of `{repo}_task/task{id}` folders in the benchmark's layout (None:
        the bundled task). repos_dir: where the local backend finds each task's repository
        (default data_dir/repos). backend: "local" (bubblewrap) or "docker" (each task's own
        image), default PARLEY_SANDBOX or "local". limits: each command's."""
        self.data_dir = Path(data_dir) if data_dir is not None else BUNDLED
        if not self.data_dir.is_dir():
            raise FileNotFoundError(f"no CooperBench dataset folder at {self.data_dir}")
        self.repos_dir = Path(repos_dir) if repos_dir else self.data_dir / "repos"
        self.backend = backend or PARLEY_SANDBOX.read()
        if self.backend not in BACKENDS:
            raise ValueError(f"sandbox backend {self.backend!r}: expected one of {BACKENDS}")
        self.cache_dir = Path(cache_dir or Path(tempfile.gettempdir()) / "parley-cooperbench")
        self.limits = limits or default_limits()
        self._tasks: list[Task] | None = None
        self._images: dict[str, str] = {}
        self._lock = threading.Lock()

    # -- scenarios --------------------------------------------------------------------------

    @property
    def tasks(self) -> list[Task]:
        if self._tasks is None:
            self._tasks = discover_tasks(self.data_dir)
            if not self._tasks:
                raise ValueError(f"no CooperBench task (a task<id> folder) in {self.data_dir}")
        return self._tasks

    def scenarios(self, split: str | None = None) -> list[Scenario]:
        if split is not None and split not in SPLITS:
            raise ValueError(
                f"cooperbench has no split {split!r} (splits: {', '.join(SPLITS)}: all pairs, or"
                " the release's train_pairs.json / test_pairs.json; or choose pairs with"
                " tasks.train_ids)"
            )
        every = self._every_pair()
        if split not in PAIR_FILES:
            return every
        listed = self._listed_pairs(split)
        by_id = {s.id: s for s in every}
        missing = [i for i in listed if i not in by_id]
        if missing:
            raise ValueError(
                f"{len(missing)} pair(s) of {PAIR_FILES[split]} are not in {self.data_dir}"
                f" (first: {missing[0]}): the pair list and the dataset do not match"
            )
        return [by_id[i] for i in listed]

    def _listed_pairs(self, split: str) -> list[str]:
        """The pair ids the release's list for `split` names, in its order."""
        name = PAIR_FILES[split]
        for folder in (self.data_dir, self.data_dir.parent):
            if (folder / name).is_file():
                return [pair["id"] for pair in json.loads((folder / name).read_text())]
        raise ValueError(
            f"cooperbench split {split!r} reads {name} (the release's data/cooperbench/{name}),"
            f" in {self.data_dir} or {self.data_dir.parent}: not found"
        )

    def _every_pair(self) -> list[Scenario]:
        out = []
        for task in self.tasks:
            for first, second in feature_pairs(task):
                out.append(
                    Scenario(
                        id=f"{task.repo_name}/task{task.task_id}/f{first}_f{second}",
                        domain=self.name,
                        payload={"task": str(task.folder), "features": [first, second]},
                        title=f"{task.repo_name} task {task.task_id}: features {first} and {second}",
                    )
                )
        return out

    def _task(self, scenario: Scenario) -> Task:
        return read_task(scenario.payload["task"])

    # -- prompts ----------------------------------------------------------------------------

    def _request(self, scenario: Scenario, role: str) -> str:
        feature = scenario.payload["features"][0 if role == AGENT else 1]
        return self._task(scenario).features[feature].request

    def agent_system_prompt(self, scenario: Scenario) -> str:
        return prompts.instructions(NAMES[AGENT], NAMES[USER], self._request(scenario, AGENT))

    def simulator_system_prompt(self, scenario: Scenario) -> str:
        text = prompts.instructions(NAMES[USER], NAMES[AGENT], self._request(scenario, USER))
        return f"{text}\n\n{prompts.partner_tools_block()}"

    def user_instructions(self, scenario: Scenario) -> str:
        return self.simulator_system_prompt(scenario)

    def tools(self, scenario: Scenario) -> list[dict[str, Any]]:
        return TOOLS

    def user_tools(self, scenario: Scenario) -> list[dict[str, Any]]:
        return TOOLS

    # -- state and tools --------------------------------------------------------------------

    def new_state(self, scenario: Scenario) -> CooperBenchState:
        task = self._task(scenario)
        first, second = scenario.payload["features"]
        state = CooperBenchState(task=str(task.folder), features=(first, second))
        for role in (AGENT, USER):
            state.workspaces[role] = Workspace(lambda task=task: self._sandbox(task))
        return state

    def _sandbox(self, task: Task) -> Sandbox:
        """A fresh throwaway copy of the task's repository at its base commit."""
        if self.backend == "docker":
            with self._lock:  # the image is built once per task
                if str(task.folder) not in self._images:
                    tag = f"parley-cooperbench-{task.repo_name}-{task.task_id}".lower()
                    self._images[str(task.folder)] = build_image(task.folder, tag)
            return DockerSandbox(self._images[str(task.folder)], self.limits)
        checkout = prepare_checkout(task, self.repos_dir, self.cache_dir / "checkouts")
        scratch = self.cache_dir / "episodes"
        scratch.mkdir(parents=True, exist_ok=True)
        return LocalSandbox(checkout, self.limits, scratch=scratch)

    def execute_tool(self, state: CooperBenchState, name: str, arguments: Any) -> str:
        return state.workspaces[AGENT].call(name, arguments)

    def execute_user_tool(self, state: CooperBenchState, name: str, arguments: Any) -> str:
        return state.workspaces[USER].call(name, arguments)

    def dump_state(self, state: CooperBenchState) -> dict[str, Any]:
        return {
            "task": state.task,
            "features": list(state.features),
            **{
                role: {"submitted": w.submitted, "patch": w.patch, "commands": w.commands}
                for role, w in state.workspaces.items()
            },
        }

    # -- turns ------------------------------------------------------------------------------

    def next_speaker(self, conversation: list[Message], agent_first: bool) -> str:
        """One step each in turn; a speaker who is done (submitted, or out of steps) is skipped."""
        steps = _steps(conversation)
        if not steps:
            return AGENT if agent_first else USER
        other = USER if steps[-1][0] == AGENT else AGENT
        return steps[-1][0] if self._finished(steps, other) else other

    def turn_count(self, conversation: list[Message]) -> int:
        """Steps, with text or not: a run's max_turns bounds both speakers' steps together."""
        return len(_steps(conversation))

    def is_done(self, conversation: list[Message]) -> str | None:
        steps = _steps(conversation)
        if all(self._finished(steps, role) for role in (AGENT, USER)):
            submitted = all(any(s for r, s in steps if r == role) for role in (AGENT, USER))
            return "submitted" if submitted else "max_steps"
        return None

    def _finished(self, steps: list[tuple[str, bool]], role: str) -> bool:
        mine = [submitted for who, submitted in steps if who == role]
        return any(mine) or len(mine) >= self.max_steps

    def agent_view(self, messages: list[Message]) -> list[Message]:
        """The agent's own steps and results; of the partner, only what it sent to the agent."""
        out: list[Message] = []
        for m in messages:
            if m["role"] == "user":
                out += [{"role": "user", "content": text} for text in _sent(m, NAMES[USER])]
            elif not (m["role"] == "tool" and m.get("requestor") == "user"):
                out.append(m)
        return out

    def user_view(self, messages: list[Message]) -> list[Message]:
        """The partner's side, as text any chat model takes: its steps as its own (assistant)
        messages with their calls written out, its results and the agent's messages to it as
        user messages; the agent's own work is not shown."""
        out: list[Message] = []

        def add(role: str, text: str) -> None:
            if out and out[-1]["role"] == role:
                out[-1] = {"role": role, "content": out[-1]["content"] + "\n\n" + text}
            else:
                out.append({"role": role, "content": text})

        for m in messages:
            if m["role"] == "user":
                calls = render_tool_calls(m.get("tool_calls") or [])
                add("assistant", "\n".join(t for t in (message_text(m), calls) if t))
            elif m["role"] == "tool" and m.get("requestor") == "user":
                add(
                    "user", prompts.TOOL_RESULT.format(name=m.get("name", ""), content=m["content"])
                )
            elif m["role"] == "assistant":
                for text in _sent(m, NAMES[AGENT]):
                    add("user", text)
        return out or [{"role": "user", "content": OPENING}]

    # -- scoring ----------------------------------------------------------------------------

    def score(
        self, conversation: list[Message], state: CooperBenchState, end_reason: str | None = None
    ) -> Outcome:
        """Both patches (submitted, or what each copy holds when the episode ended) merged and
        tested by the benchmark's rule (scoring.py); every sandbox is closed after."""
        if state.outcome is not None:
            return state.outcome
        task = read_task(state.task)
        first, second = state.features
        try:
            patches = {}
            for role, workspace in state.workspaces.items():
                patches[role] = (
                    workspace.patch if workspace.submitted else workspace.current_patch()
                )
            judge = self._sandbox(task)
            try:
                result = score_pair(task, first, second, patches[AGENT], patches[USER], judge)
            finally:
                judge.close()
        finally:
            for workspace in state.workspaces.values():
                workspace.close()
        own = bool(result.feature1 and result.feature1.passed)
        theirs = bool(result.feature2 and result.feature2.passed)
        reward = 1.0 if result.both_passed else 0.5 if (self.partial_reward and own) else 0.0
        state.outcome = Outcome(
            reward=reward,
            success=result.both_passed,
            components={
                "both_passed": result.both_passed,
                f"feature{first}_passed": own,
                f"feature{second}_passed": theirs,
                "merge_status": result.merge_status,
            },
            details={
                "merge_strategy": result.merge_strategy,
                "apply_status": result.apply_status,
                "error": result.error,
                "agent_patch": patches[AGENT],
                "partner_patch": patches[USER],
                "submitted": {r: w.submitted for r, w in state.workspaces.items()},
                "tests": {
                    f.feature: {
                        "passed": f.tests_passed,
                        "failed": f.tests_failed,
                        "killed": f.killed,
                    }
                    for f in (result.feature1, result.feature2)
                    if f is not None
                },
            },
        )
        return state.outcome


def _steps(conversation: list[Message]) -> list[tuple[str, bool]]:
    """(who, whether this step submitted) for every step: each message of the two speakers."""
    return [
        (AGENT if m["role"] == "assistant" else USER, _submits(m))
        for m in conversation
        if m["role"] in ("assistant", "user")
    ]


def _submits(message: Message) -> bool:
    for call in message.get("tool_calls") or []:
        function = call.get("function", {})
        if function.get("name") == "submit":
            return True
        if function.get("name") == "bash":
            try:
                command = json.loads(function.get("arguments") or "{}").get("command", "")
            except (json.JSONDecodeError, AttributeError):
                continue
            if isinstance(command, str) and command.strip() == f"echo {STOP_SIGNAL}":
                return True
    return False


def _sent(message: Message, sender: str) -> list[str]:
    """The messages a step sent with send_message, as the other reads them."""
    out = []
    for call in message.get("tool_calls") or []:
        function = call.get("function", {})
        if function.get("name") != "send_message":
            continue
        try:
            content = json.loads(function.get("arguments") or "{}").get("content")
        except (json.JSONDecodeError, AttributeError):
            continue
        if isinstance(content, str) and content.strip():
            out.append(prompts.MESSAGE_FROM.format(name=sender, content=content))
    return out
