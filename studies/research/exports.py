"""CSV exports: responses (one row per participant) and transcripts (one row per message)."""

import json
from collections.abc import Iterable, Iterator

from django.db.models import Count
from django.http import StreamingHttpResponse

from studies.analysis import csvfile
from studies.models import Item, Message, Response, humans_unless

# No participant token (the /p/<token>/ address): whoever holds it can act as the participant,
# and exports travel. prolific_pid (unique per study) joins responses to transcripts.
PARTICIPANT_COLUMNS = [
    "study",
    "prolific_pid",
    "study_id",
    "session_id",
    "arm",
    "scenario",
    "status",
    "prolific_status",
    "partial_data",  # returned or timed out on Prolific: kept, flagged
    "attention_passed",
    "created_at",
    "consented_at",
    "consent_version",  # the consent text agreed to: its number and SHA-256 (the study's
    "consent_sha256",  # consent versions hold each text)
    "chat_ended_at",
    "completed_at",
    "messages",
    "outcome_reward",
    "outcome_success",
    "outcome",
]
MESSAGE_COLUMNS = [
    "study",
    "prolific_pid",
    "arm",
    "scenario",
    "seq",
    "role",
    "content",
    "tool_calls",
    "tool_name",
    "tool_call_id",
    "client_id",
    "model",
    "replica",
    "finish_reason",
    "ttft_ms",
    "latency_ms",
    "prompt_tokens",
    "completion_tokens",
    "created_at",
]


def iso(value) -> str:
    return value.isoformat() if value else ""


def response_rows(participants, include_bots: bool = False) -> Iterator[list]:
    """Header, then one row per participant; item columns hold the raw answers as given."""
    participants = list(
        humans_unless(participants, include_bots)
        .select_related("study", "arm", "scenario", "consent_version")
        .annotate(n_messages=Count("conversation__messages"))
        .order_by("study_id", "created_at", "id")
    )
    items = list(
        Item.objects.filter(questionnaire__study__in={p.study_id for p in participants}).order_by(
            "questionnaire__study_id", "order", "id"
        )
    )
    keys = list(dict.fromkeys(item.key for item in items))
    answers: dict[int, dict[str, object]] = {}
    for response in Response.objects.filter(participant__in=participants).select_related("item"):
        answers.setdefault(response.participant_id, {})[response.item.key] = response.value
    yield PARTICIPANT_COLUMNS + keys
    for p in participants:
        outcome = p.outcome or {}
        row = [
            p.study.slug,
            p.prolific_pid,
            p.prolific_study_id,
            p.prolific_session_id,
            p.arm.name,
            p.scenario.key if p.scenario else "",
            p.status,
            p.prolific_status,
            p.partial_data,
            "" if p.attention_passed is None else p.attention_passed,
            iso(p.created_at),
            iso(p.consented_at),
            p.consent_version.version if p.consent_version else "",
            p.consent_version.sha256 if p.consent_version else "",
            iso(p.chat_ended_at),
            iso(p.completed_at),
            p.n_messages,
            outcome.get("reward", ""),
            outcome.get("success", ""),
            json.dumps(outcome) if outcome else "",
        ]
        mine = answers.get(p.pk, {})
        yield row + [mine.get(key, "") for key in keys]


def transcript_rows(participants, include_bots: bool = False) -> Iterator[list]:
    yield MESSAGE_COLUMNS
    participants = humans_unless(participants, include_bots)
    messages = (
        Message.objects.filter(conversation__participant__in=participants)
        .select_related(
            "conversation__participant__study",
            "conversation__participant__arm",
            "conversation__participant__scenario",
        )
        .order_by(
            "conversation__participant__study_id",
            "conversation__participant__created_at",
            "conversation_id",
            "seq",
        )
    )
    for m in messages.iterator(chunk_size=2000):
        p = m.conversation.participant
        yield [
            p.study.slug,
            p.prolific_pid,
            p.arm.name,
            p.scenario.key if p.scenario else "",
            m.seq,
            m.role,
            m.content,
            json.dumps(m.tool_calls) if m.tool_calls else "",
            m.tool_name,
            m.tool_call_id,
            m.client_id or "",
            m.model,
            m.replica,
            m.finish_reason,
            m.ttft_ms,
            m.latency_ms,
            m.prompt_tokens,
            m.completion_tokens,
            iso(m.created_at),
        ]


class Echo:
    def write(self, value):
        return value


def csv_response(rows: Iterable[list], filename: str) -> StreamingHttpResponse:
    writer = csvfile.Writer(Echo())  # integers as integers, formula-like text neutralised
    response = StreamingHttpResponse(
        (writer.writerow(row) for row in rows), content_type="text/csv"
    )
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response
