"""tau2 scoring: the reward is the product of the task's reward basis (default DB x COMMUNICATE).

- DB: the gold actions replayed on a fresh DB (tool errors ignored, as in tau2) must leave the
  same whole DB as the agent's conversation: equal sha256 of the canonical JSON.
- COMMUNICATE: each communicate_info string occurs in some assistant message, compared in lower
  case with the message's commas removed.
- NL_ASSERTION (where the basis names it, as tau2 evaluates it) needs an LLM judge (judge.py).
  Without one, or when the judge fails, the part is "unjudged": left out of the reward, named in
  details["unjudged"], and the conversation is never a success. Why not 0: a 0 would count every
  such conversation as failed (112 of 114 v1.0.0 retail tasks), a silent verdict the judge never
  gave; why not 1: that would pass them. A training run refuses to start instead
  (Tau2Domain.check_judge), so an unjudged reward never trains anything.
- A conversation cut off by the step or error limit scores 0.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..base import Message, Outcome, message_text
from .store import Store

PREMATURE_ENDS = {"max_steps", "max_turns", "too_many_errors"}
DEFAULT_BASIS = ["DB", "COMMUNICATE"]
NOT_EVALUATED = "not evaluated"
UNJUDGED = "unjudged"  # an NL part of the basis that no judge scored: out of the reward
NOT_IN_BASIS = "not in the reward basis"  # assertions the task has but its reward ignores

# A judge gets the assertions and the conversation and says which hold.
NLJudge = Callable[[list[str], list[Message]], list[bool]]


def tool_calls_of(conversation: list[Message]) -> list[tuple[str, Any]]:
    """(name, arguments) of every agent tool call, in order."""
    calls = []
    for message in conversation:
        if message.get("role") == "assistant":
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {}
                calls.append((function.get("name", ""), function.get("arguments") or {}))
    return calls


def communicate_checks(conversation: list[Message], infos: list[str]) -> list[dict[str, Any]]:
    said = [
        message_text(m).lower().replace(",", "")
        for m in conversation
        if m.get("role") == "assistant"
    ]
    return [{"info": info, "met": any(info.lower() in text for text in said)} for info in infos]


def action_checks(
    conversation: list[Message], actions: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """tau2's ACTION basis: each gold action matches some agent call on its compare_args."""
    calls = []
    for name, arguments in tool_calls_of(conversation):
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                arguments = {}
        calls.append((name, arguments if isinstance(arguments, dict) else {}))
    checks = []
    for action in actions:
        keys = action.get("compare_args")
        met = False
        for name, arguments in calls:
            if name != action["name"]:
                continue
            compared = keys if keys is not None else list(arguments)
            gold = action.get("arguments") or {}
            if not compared or {k: arguments[k] for k in compared if k in arguments} == {
                k: gold[k] for k in compared if k in gold
            }:
                met = True
                break
        checks.append({"action": action.get("action_id", action["name"]), "met": met})
    return checks


def score(
    task: dict[str, Any],
    conversation: list[Message],
    agent_db: Store,
    gold_db: Callable[[], Store],
    digest: Callable[[Store], str],
    end_reason: str | None = None,
    judge: NLJudge | None = None,
    initial_db: Callable[[], Store] | None = None,
) -> Outcome:
    """The tau2 Outcome. details["checked"] says whether the reward compared anything the
    conversation could change: not when the gold actions leave the DB as it started (known when
    `initial_db` is given) and nothing is to be communicated or judged, as then an empty chat
    scores 1 too."""
    if end_reason in PREMATURE_ENDS:
        note = f"conversation ended prematurely ({end_reason})"
        return Outcome(0.0, False, {}, {"note": note, "end_reason": end_reason, "checked": True})
    criteria = task.get("evaluation_criteria")
    if not criteria:
        details = {"note": "no evaluation criteria", "end_reason": end_reason, "checked": False}
        return Outcome(1.0, True, {}, details)

    basis = criteria.get("reward_basis") or DEFAULT_BASIS
    components: dict[str, Any] = {}
    details: dict[str, Any] = {"reward_basis": basis, "end_reason": end_reason}

    if criteria.get("actions") is None and criteria.get("env_assertions") is None:
        components["DB"] = 1.0
        details["db"] = {"note": "no expected actions"}
    else:
        agent_hash, gold_hash = digest(agent_db), digest(gold_db())
        components["DB"] = 1.0 if agent_hash == gold_hash else 0.0
        details["db"] = {
            "match": agent_hash == gold_hash,
            "agent_hash": agent_hash,
            "gold_hash": gold_hash,
        }
        if initial_db is not None:
            details["db"]["gold_changes_db"] = digest(initial_db()) != gold_hash

    checks = communicate_checks(conversation, criteria.get("communicate_info") or [])
    components["COMMUNICATE"] = 1.0 if all(c["met"] for c in checks) else 0.0
    details["communicate"] = checks

    assertions = criteria.get("nl_assertions") or []
    unjudged: dict[str, str] = {}
    if assertions and "NL_ASSERTION" not in basis:
        # tau2 judges only what the reward reads (EvaluationType.ALL): no judge call is spent
        components["NL_ASSERTION"] = NOT_IN_BASIS
    elif "NL_ASSERTION" in basis and not assertions:
        components["NL_ASSERTION"] = 1.0  # nothing to judge: met, as in tau2
    elif "NL_ASSERTION" in basis and judge is None:
        components["NL_ASSERTION"] = UNJUDGED
        unjudged["NL_ASSERTION"] = "no NL judge configured (setting nl_judge)"
    elif "NL_ASSERTION" in basis:
        try:
            verdicts = [bool(v) for v in judge(assertions, conversation)]
            if len(verdicts) != len(assertions):
                raise ValueError(f"{len(verdicts)} verdicts for {len(assertions)} assertions")
        except Exception as exc:  # a judge outage must not lose the rest of the score
            details["nl_error"] = f"{type(exc).__name__}: {exc}"
            components["NL_ASSERTION"] = UNJUDGED
            unjudged["NL_ASSERTION"] = f"the NL judge failed: {details['nl_error']}"
        else:
            details["nl_assertions"] = [
                {"assertion": a, "met": v} for a, v in zip(assertions, verdicts, strict=True)
            ]
            components["NL_ASSERTION"] = 1.0 if all(verdicts) else 0.0

    if "ACTION" in basis:
        checks = action_checks(conversation, criteria.get("actions") or [])
        components["ACTION"] = 1.0 if all(c["met"] for c in checks) else 0.0
        details["actions"] = checks
    if "ENV_ASSERTION" in basis:
        components["ENV_ASSERTION"] = NOT_EVALUATED  # retail/airline v0.2.0 tasks have none

    db_checked = details["db"].get("gold_changes_db", "match" in details["db"])
    details["checked"] = bool(
        (db_checked and "DB" in basis)
        or (details["communicate"] and "COMMUNICATE" in basis)
        or (assertions and "NL_ASSERTION" in basis)
        or (criteria.get("actions") and "ACTION" in basis)
    )
    reward = 1.0
    for part in basis:
        if part in unjudged:
            continue  # left out of the reward, and named below: never a silent 0 or 1
        value = components.get(part, NOT_EVALUATED)
        # "not evaluated" (a part parley cannot score, ENV_ASSERTION) never counts as a success
        reward *= value if isinstance(value, float) else 0.0
    if unjudged:
        details["unjudged"] = unjudged
        details["note"] = (
            f"reward over {', '.join(p for p in basis if p not in unjudged) or 'nothing'} only;"
            f" {', '.join(unjudged)} unjudged, so success is unknown and not counted"
        )
    return Outcome(reward, reward == 1.0 and not unjudged, components, details)
