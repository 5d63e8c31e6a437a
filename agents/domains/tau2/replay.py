"""Replay each task's gold actions through the tools as if an agent made them, and score the result.

A check of the tools, the data and the scorer together: on faithful tools every task scores 1.0,
including tasks whose gold actions fail on the official tools too. The conversation is the
greeting, one agent tool call per gold action with its result, an agent message stating each
communicate_info string, and the user's ###STOP###.

    python manage.py domain_replay --domain retail --data-dir ../shared/reference/tau2
    python -m agents.domains.tau2.replay --domain airline      # the same without Django
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

from ..base import Message, Scenario
from . import prompts
from .domain import AirlineDomain, RetailDomain, Tau2Domain

DOMAINS: dict[str, type[Tau2Domain]] = {"retail": RetailDomain, "airline": AirlineDomain}


@dataclass
class TaskReplay:
    task_id: str
    reward: float
    gold_actions: int
    tool_errors: int  # gold actions that returned an error
    end_reason: str | None
    components: dict[str, Any]

    @property
    def passed(self) -> bool:
        return self.reward == 1.0


def gold_conversation(domain: Tau2Domain, scenario: Scenario, state) -> tuple[list[Message], int]:
    """The conversation an agent following the gold actions would have; (messages, tool errors)."""
    conversation: list[Message] = [{"role": "assistant", "content": domain.greeting(scenario)}]
    criteria = scenario.payload.get("evaluation_criteria") or {}
    errors = 0
    for n, action in enumerate(criteria.get("actions") or []):
        call_id = f"call_{n}"
        arguments = json.dumps(action.get("arguments") or {})
        conversation.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": action["name"], "arguments": arguments},
                    }
                ],
            }
        )
        result = domain.execute_tool(state, action["name"], arguments)
        errors += result.startswith("Error:")
        conversation.append(
            {"role": "tool", "tool_call_id": call_id, "name": action["name"], "content": result}
        )
    infos = criteria.get("communicate_info") or []
    closing = (
        "Here is what you asked about: " + "; ".join(infos) + "."
        if infos
        else "Is there anything else?"
    )
    conversation.append({"role": "assistant", "content": closing})
    conversation.append({"role": "user", "content": prompts.STOP})
    return conversation, errors


def replay_task(domain: Tau2Domain, scenario: Scenario, dump_dir: Path | None = None) -> TaskReplay:
    state = domain.new_state(scenario)
    conversation, errors = gold_conversation(domain, scenario, state)
    end_reason = domain.is_done(conversation)
    outcome = domain.score(conversation, state, end_reason)
    if dump_dir is not None:
        name = scenario.id.replace("/", "_").replace("\\", "_")
        with open(dump_dir / f"{name}.json", "w", encoding="utf-8") as handle:
            json.dump(state.db.tables, handle, indent=4)
    actions = (scenario.payload.get("evaluation_criteria") or {}).get("actions") or []
    return TaskReplay(
        scenario.id, outcome.reward, len(actions), errors, end_reason, outcome.components
    )


def replay(
    domain_name: str, data_dir: str | Path | None = None, dump_dir: str | Path | None = None
) -> Iterator[TaskReplay]:
    if domain_name not in DOMAINS:
        raise ValueError(
            f"unknown tau2 domain {domain_name!r}: expected one of {', '.join(DOMAINS)}"
        )
    domain = DOMAINS[domain_name](data_dir=data_dir)
    folder = None
    if dump_dir is not None:
        folder = Path(dump_dir)
        folder.mkdir(parents=True, exist_ok=True)
    for scenario in domain.scenarios():
        yield replay_task(domain, scenario, folder)


def run(
    domain_name: str,
    data_dir: str | Path | None = None,
    as_json: bool = False,
    dump_dir: str | Path | None = None,
    out: TextIO = sys.stdout,
) -> int:
    """Print one line per task and then `N passed, M failed`; the exit status (0: all passed).
    With as_json each task line is a JSON object (JSON Lines)."""
    passed = failed = 0
    for result in replay(domain_name, data_dir, dump_dir):
        if as_json:
            out.write(json.dumps({**asdict(result), "passed": result.passed}) + "\n")
        else:
            out.write(
                f"task {result.task_id}: reward {result.reward:.1f}  "
                f"({result.gold_actions} gold actions, {result.tool_errors} tool errors)\n"
            )
        passed += result.passed
        failed += not result.passed
    out.write(f"{passed} passed, {failed} failed\n")
    return 0 if failed == 0 else 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--domain", required=True, choices=sorted(DOMAINS))
    parser.add_argument(
        "--data-dir", default=None, help="official-layout folder (default: bundled data)"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per task")
    parser.add_argument(
        "--dump-db", default=None, metavar="DIR", help="write each task's final DB to DIR/<id>.json"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args.domain, args.data_dir, args.json, args.dump_db)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
