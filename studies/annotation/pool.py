"""An annotation study's pool: conversations drawn from finished studies (people's) and from
stored simulated ones (the sim-to-real evaluations, a training run's samples), as raters will
read them.

What a rater reads is the user's and the agent's words in order, nothing else: no tool calls
or results, no arm, model or simulator name, and the personal details a participant typed
replaced (studies/lib/redact.py, the redaction `imitate_users` applies; what the scenario gave
them stays). Where each conversation came from is kept beside it for the analysis. Adding the
same conversation again adds nothing.
"""

import json
from collections import Counter
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from studies.lib.redact import redact
from studies.models import (
    Message,
    RatedConversation,
    SimulatorEvaluation,
    Study,
    finished_participants,
)

SPEAKERS = {"user": "user", "assistant": "agent"}


@dataclass(frozen=True)
class Draw:
    """Which conversations to draw: by arm, by the Domain's success, by the number of the
    user's turns and by date (when the conversation was had). Empty means no filter."""

    arms: tuple[str, ...] = ()
    success: bool | None = None
    min_user_turns: int = 1
    max_user_turns: int | None = None
    since: datetime | None = None
    until: datetime | None = None

    def keeps(self, arm: str, success: bool | None, user_turns: int, when) -> bool:
        return (
            (not self.arms or arm in self.arms)
            and (self.success is None or success == self.success)
            and user_turns >= self.min_user_turns
            and (self.max_user_turns is None or user_turns <= self.max_user_turns)
            and (self.since is None or when >= self.since)
            and (self.until is None or when <= self.until)
        )


def transcript(messages: list[dict], kept: str = "", counts: Counter | None = None) -> list:
    """The words of a conversation in order, as a rater reads them: each user and agent turn
    with text (tool calls, tool results and empty turns left out), every turn redacted."""
    turns = []
    for m in messages:
        speaker = SPEAKERS.get(m.get("role"))
        text = m.get("content")
        if speaker and isinstance(text, str) and text.strip():
            turns.append({"speaker": speaker, "text": redact(text, kept, counts)})
    return turns


def add_people(pool: Study, origin: Study, draw: Draw = Draw()) -> int:
    """Finished participants' conversations of `origin` (people only, completed, not excluded by
    its attention rule); how many were added."""
    already = set(pool.rated_conversations.values_list("origin_conversation_id", flat=True))
    participants = (
        finished_participants(origin)
        .select_related("arm", "scenario", "conversation")
        .order_by("created_at", "pk")
    )
    chats = {}
    for m in Message.objects.filter(conversation__participant__in=participants).order_by(
        "conversation_id", "seq"
    ):
        chats.setdefault(m.conversation_id, []).append(m.to_chat())
    added = []
    for p in participants:
        conversation = getattr(p, "conversation", None)
        if conversation is None or conversation.pk in already:
            continue
        messages = chats.get(conversation.pk, [])
        user_turns = sum(m["role"] == "user" for m in messages)
        success = (p.outcome or {}).get("success")
        if not draw.keeps(p.arm.name, success, user_turns, conversation.started_at):
            continue
        scenario = p.scenario
        kept = json.dumps(scenario.payload) + scenario.title if scenario else ""
        added.append(
            RatedConversation(
                study=pool,
                transcript=transcript(messages, kept),
                source=RatedConversation.Source.PERSON,
                arm=p.arm.name,
                origin_study=origin,
                origin_conversation=conversation,
            )
        )
    RatedConversation.objects.bulk_create(added)
    return len(added)


def add_simulated(pool: Study, origin: Study, draw: Draw = Draw(), simulators=()) -> int:
    """`origin`'s sim-to-real conversations (an arm's checkpoint with a held-out simulator);
    `simulators` names which, all when empty. How many were added."""
    already = set(pool.rated_conversations.values_list("origin_evaluation_id", flat=True))
    evaluations = SimulatorEvaluation.objects.filter(arm__study=origin).select_related(
        "arm", "scenario"
    )
    if simulators:
        evaluations = evaluations.filter(simulator__in=simulators)
    added = []
    for e in evaluations.order_by("pk"):
        user_turns = sum(m.get("role") == "user" for m in e.conversation)
        if e.pk in already or not draw.keeps(e.arm.name, e.success, user_turns, e.created_at):
            continue
        kept = json.dumps(e.scenario.payload) + e.scenario.title
        added.append(
            RatedConversation(
                study=pool,
                transcript=transcript(e.conversation, kept),
                source=RatedConversation.Source.SIMULATOR,
                arm=e.arm.name,
                simulator=e.simulator,
                origin_study=origin,
                origin_evaluation=e,
            )
        )
    RatedConversation.objects.bulk_create(added)
    return len(added)


def add_training_samples(pool: Study, samples: Path, simulator: str, draw: Draw = Draw()) -> int:
    """A training run's sampled conversations (its samples.jsonl: the agent with the run's own
    simulator, one conversation per task and step), as `simulator`'s; `draw` filters by
    success (a positive reward), length and the date the file was written."""
    samples = samples.resolve()
    already = set(pool.rated_conversations.values_list("origin_sample", flat=True))
    when = datetime.fromtimestamp(samples.stat().st_mtime, tz=UTC)
    added = []
    for line, text in enumerate(samples.read_text().splitlines(), 1):
        if not text.strip() or f"{samples}:{line}" in already:
            continue
        row = json.loads(text)
        messages = row.get("conversation") or []
        user_turns = sum(m.get("role") == "user" for m in messages)
        success = (row.get("reward") or 0) > 0
        if not replace(draw, arms=()).keeps("", success, user_turns, when):  # no arms here
            continue
        added.append(
            RatedConversation(
                study=pool,
                transcript=transcript(messages),
                source=RatedConversation.Source.SIMULATOR,
                simulator=simulator,
                origin_sample=f"{samples}:{line}",
            )
        )
    RatedConversation.objects.bulk_create(added)
    return len(added)
