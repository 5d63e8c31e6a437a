"""Every place parley keeps something about one person, each with what it holds of them (the
per-person export) and how it is emptied (the erasure): one registry, so the two cannot drift.

A Place names the models it covers; tests/studies/privacy checks that every model related to a
Participant or a Conversation is covered by one, so a new model cannot be forgotten silently.
The order of PLACES is the erasure's: places that find rows through others first (analysis runs
find their rows by the person's ratings, pools by their conversation), the participant last.
"""

import csv
import io
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.contrib.admin.models import LogEntry
from django.contrib.contenttypes.models import ContentType
from django.db.models import F, Q

from studies.models import (
    AnalysisRun,
    Bonus,
    BonusPayment,
    Conversation,
    Message,
    Participant,
    ProlificEvent,
    RatedConversation,
    RatingAssignment,
    Response,
    Review,
    StudyError,
    Withdrawal,
)

ERASED = "[erased]"
# A text file under the data folder bigger than this is no log or export parley writes (model
# weights, checkpoints): not read.
LARGEST_TEXT_FILE = 64 * 1024 * 1024


@dataclass
class Person:
    """One participant and the strings that identify them wherever text is kept."""

    participant: Participant

    @property
    def needles(self) -> tuple[str, ...]:
        """The Prolific id, the token (both spellings), the submission id: what names them."""
        p = self.participant
        found = [p.prolific_pid, str(p.token), p.token.hex, p.prolific_session_id]
        return tuple(dict.fromkeys(n for n in found if n and n.strip()))

    @property
    def pattern(self) -> re.Pattern:
        # Whole ids only: a short id ("p1") must not cut into another's ("p10").
        alternatives = "|".join(re.escape(n) for n in sorted(self.needles, key=len, reverse=True))
        return re.compile(rf"(?<![\w-])(?:{alternatives})(?![\w-])")

    def names(self, text: str) -> bool:
        return bool(text) and self.pattern.search(text) is not None

    def scrub(self, value):
        """`value` (JSON: dicts, lists, strings) with every identifier replaced by [erased]."""
        if isinstance(value, str):
            return self.pattern.sub(ERASED, value)
        if isinstance(value, list):
            return [self.scrub(v) for v in value]
        if isinstance(value, dict):
            return {self.scrub(k): self.scrub(v) for k, v in value.items()}
        return value

    def conversation_id(self) -> int | None:
        return (
            Conversation.objects.filter(participant=self.participant)
            .values_list("pk", flat=True)
            .first()
        )

    def pool_copies(self):
        """Redacted copies of their conversation in annotation pools (any study's)."""
        conversation = self.conversation_id()
        if conversation is None:
            return RatedConversation.objects.none()
        return RatedConversation.objects.filter(origin_conversation_id=conversation)


@dataclass(frozen=True)
class Place:
    name: str
    where: str  # in words, for the export and the docs
    covers: tuple[type, ...]  # the models (tables) this place reads and empties
    held: Callable[[Person], list]  # what it holds of them, JSON-ready
    erase: Callable[[Person], int]  # rows (or files) erased or redacted


def rows(queryset, *fields) -> list[dict]:
    return [json.loads(json.dumps(row, default=str)) for row in queryset.values(*fields)]


# --- analysis runs: their stored inputs name participants ----------------------------------


def run_rows(run: AnalysisRun, person: Person) -> tuple[list[str], list[list[str]], list]:
    """(CSV header, the CSV rows about them, the "ratings" entries about them) of a run's inputs:
    a chat study's rows by Prolific id, an annotation study's by the person's ratings (the
    conversation, position and time: a rater is only a number there) or by the pool copies of
    their conversation (other raters' ratings of it)."""
    inputs = run.inputs or {}
    mine = {
        (conversation, position, rated_at.isoformat() if rated_at else None)
        for conversation, position, rated_at in RatingAssignment.objects.filter(
            participant=person.participant
        ).values_list("conversation_id", "position", "rated_at")
    }
    copies = set(person.pool_copies().values_list("pk", flat=True))

    def about(entry: dict) -> bool:
        key = (entry.get("conversation"), entry.get("position"), entry.get("rated_at"))
        return key[0] in copies or key in mine

    listed = inputs.get("ratings")
    ratings = (
        [r for r in listed if isinstance(r, dict) and about(r)] if isinstance(listed, list) else []
    )
    table = list(csv.reader(io.StringIO(inputs.get("csv") or "")))
    header, body = (table[0], table[1:]) if table else ([], [])

    def cell(row, column):
        return row[header.index(column)] if column in header and len(row) == len(header) else None

    def number(text):
        return int(text) if text is not None and text.isdigit() else None

    def row_about(row) -> bool:
        if any(person.pattern.fullmatch(value) for value in row):
            return True
        entry = {
            "conversation": number(cell(row, "conversation")),
            "position": number(cell(row, "position")),
            "rated_at": cell(row, "rated_at") or None,
        }
        return entry["conversation"] is not None and about(entry)

    return header, [row for row in body if row_about(row)], ratings


def csv_records(text: str):
    """(row, its text as written) for each record of a CSV: a quoted cell may span lines."""
    consumed: list[str] = []

    def lines():
        for line in text.splitlines(keepends=True):
            consumed.append(line)
            yield line

    for row in csv.reader(lines()):
        yield row, "".join(consumed)
        consumed.clear()


def runs_naming(person: Person):
    """The runs whose stored inputs or results hold a row or a word about them."""
    studies = {person.participant.study_id}
    studies |= set(person.pool_copies().values_list("study_id", flat=True))
    for run in AnalysisRun.objects.filter(study_id__in=studies).order_by("pk"):
        header, found, ratings = run_rows(run, person)
        stored = json.dumps([run.inputs, run.results, run.figures, run.settings, run.error])
        if found or ratings or person.names(stored):
            yield run, header, found, ratings


def runs_held(person: Person) -> list:
    return [
        {"run": run.pk, "study": run.study_id, "columns": header, "rows": found, "ratings": ratings}
        for run, header, found, ratings in runs_naming(person)
    ]


def runs_erase(person: Person) -> int:
    """Their rows go from each run's inputs, and any word naming them from all it keeps; the run
    is marked as computed before the erasure (its results still count them: re-computing would
    change a reported, perhaps pre-registered, analysis behind the researcher's back)."""
    n = 0
    for run, _header, found, ratings in runs_naming(person):
        inputs = dict(run.inputs or {})
        if found:
            # The text of the other rows as it was written (studies/analysis/csvfile.py), whole.
            records = list(csv_records(inputs["csv"]))
            inputs["csv"] = "".join(
                text
                for number, (row, text) in enumerate(records)
                if number == 0 or row not in found
            )
        if ratings:
            inputs["ratings"] = [r for r in inputs["ratings"] if r not in ratings]
        for count in ("participants", "ratings"):  # how many rows the inputs say they hold
            if found and isinstance(inputs.get(count), int):
                inputs[count] = max(0, inputs[count] - len(found))
        AnalysisRun.objects.filter(pk=run.pk).update(
            inputs=person.scrub(inputs),
            results=person.scrub(run.results),
            figures=person.scrub(run.figures),
            settings=person.scrub(run.settings),
            error=person.scrub(run.error),
            erased_participants=F("erased_participants") + 1,  # two erasures at once count 2
        )
        n += 1
    return n


# --- annotation pools: copies of their conversation, and every rating of those copies -------


def pool_held(person: Person) -> list:
    copies = person.pool_copies()
    return [
        {
            **copy,
            "ratings": rows(
                RatingAssignment.objects.filter(conversation_id=copy["id"]),
                "id",
                "participant_id",
                "position",
                "status",
                "answers",
                "rated_at",
            ),
        }
        for copy in rows(copies, "id", "study_id", "transcript", "arm", "created_at")
    ]


def pool_erase(person: Person) -> int:
    copies = list(person.pool_copies().values_list("pk", flat=True))
    ratings, _ = RatingAssignment.objects.filter(conversation_id__in=copies).delete()
    deleted, _ = RatedConversation.objects.filter(pk__in=copies).delete()
    return ratings + deleted


# --- what the person did --------------------------------------------------------------------


def delete(queryset) -> int:
    return queryset.delete()[1].get(queryset.model._meta.label, 0)


def messages(person: Person):
    return Message.objects.filter(conversation__participant=person.participant).order_by("seq")


def problems(person: Person):
    """Problems recorded for them, and any other whose text names them (a path before paths
    were masked, a traceback): found by the database, confirmed as whole ids here (a short id
    must not take another's problems with it)."""
    texts = Q()
    for needle in person.needles:
        texts |= Q(path__contains=needle) | Q(detail__contains=needle)
        texts |= Q(traceback__contains=needle)
    named = {
        pk
        for pk, *text in StudyError.objects.filter(texts).values_list(
            "pk", "path", "detail", "traceback"
        )
        if person.names(" ".join(text))
    }
    return StudyError.objects.filter(Q(participant=person.participant) | Q(pk__in=named))


def prolific_events(person: Person):
    """Webhooks about their submission, or whose payload or result names them."""
    p = person.participant
    found = set()
    if p.prolific_session_id:
        found |= set(
            ProlificEvent.objects.filter(resource_id=p.prolific_session_id).values_list(
                "pk", flat=True
            )
        )
    # JSON containment differs per database: the payloads are read here, as text.
    for pk, payload, result in ProlificEvent.objects.exclude(pk__in=found).values_list(
        "pk", "payload", "result"
    ):
        if person.names(json.dumps(payload)) or person.names(result):
            found.add(pk)
    return ProlificEvent.objects.filter(pk__in=found).order_by("pk")


def events_erase(person: Person) -> int:
    """The event stays (its id and digest refuse a replay), emptied of what names them."""
    return prolific_events(person).update(payload={}, resource_id="", result=ERASED)


def admin_log(person: Person):
    """The admin's history of their rows: entries on them, and any naming them (whole ids)."""
    p = person.participant
    on_them = Q(content_type=ContentType.objects.get_for_model(Participant), object_id=str(p.pk))
    texts = Q(pk__in=[])
    for needle in person.needles:
        texts |= Q(object_repr__contains=needle) | Q(change_message__contains=needle)
    named = {
        pk
        for pk, name, message in LogEntry.objects.filter(texts).values_list(
            "pk", "object_repr", "change_message"
        )
        if person.names(f"{name} {message}")
    }
    return LogEntry.objects.filter(on_them | Q(pk__in=named)).order_by("pk")


def admin_log_erase(person: Person) -> int:
    n = 0
    for entry in admin_log(person):
        entry.object_repr = ERASED if person.names(entry.object_repr) else entry.object_repr
        entry.change_message = person.scrub(entry.change_message)
        entry.save(update_fields=["object_repr", "change_message"])
        n += 1
    return n


def refused_payments(person: Person):
    """Bonus payments Prolific refused keep their lines, [Prolific id, amount], for the record."""
    return [
        payment
        for payment in BonusPayment.objects.filter(study_id=person.participant.study_id)
        if any(person.names(str(who)) for who, *_ in payment.refused_lines or [])
    ]


def refused_erase(person: Person) -> int:
    n = 0
    for payment in refused_payments(person):
        lines = [
            [ERASED, *rest] if person.names(str(who)) else [who, *rest]
            for who, *rest in payment.refused_lines
        ]
        BonusPayment.objects.filter(pk=payment.pk).update(refused_lines=lines)
        n += 1
    return n


def bonuses_held(person: Person) -> list:
    return rows(
        Bonus.objects.filter(participant=person.participant),
        "id",
        "amount",
        "payment_id",
        "payment__state",
        "payment__paid_at",
    )


def bonuses_erase(person: Person) -> int:
    """A bonus is a payment record: it keeps the submission id, the amount and its payment's
    date, and no longer points at the person."""
    p = person.participant
    return Bonus.objects.filter(participant=p).update(
        participant=None, submission_id=p.prolific_session_id
    )


# --- files under the data folder (logs, exports saved there, Celery's file broker) ---------


def database_files() -> set[Path]:
    """The SQLite files (read as tables, never as text) and their journals."""
    found = set()
    for db in settings.DATABASES.values():
        for name in (db.get("NAME"), (db.get("TEST") or {}).get("NAME")):
            if name and str(name) != ":memory:":
                for suffix in ("", "-wal", "-shm", "-journal"):
                    found.add(Path(str(name) + suffix).resolve())
    return found


# Where under the data folder parley writes what can name a participant: the servers' logs
# (`make demo`'s and serve_agents' logs/, a worker's *.log beside them), exports a researcher
# saved there, and Celery's file broker and result store. Only these are read and rewritten: the
# same folder holds model weights, tokenizers, checkpoints and training runs, whose text is no
# one's data and must never be edited (a short Prolific id, matched as a word, would otherwise
# rewrite a tokenizer's vocabulary line).
PERSONAL_FOLDERS = ("logs", "exports", "celery-broker", "celery-results")


def text_files() -> Iterator[Path]:
    root = Path(settings.DATA_DIR)
    skip = database_files()
    found = [root / folder for folder in PERSONAL_FOLDERS if (root / folder).is_dir()]
    paths = [p for folder in found for p in folder.rglob("*")]
    paths += list(root.glob("*.log")) if root.is_dir() else []
    for path in sorted(paths):
        try:
            if path.is_symlink() or not path.is_file() or path.resolve() in skip:
                continue
            if path.stat().st_size > LARGEST_TEXT_FILE:
                continue
        except OSError:  # gone meanwhile (a queue file taken by a worker)
            continue
        yield path


def files_naming(person: Person) -> Iterator[tuple[Path, str]]:
    for path in text_files():
        try:
            text = path.read_bytes().decode("utf-8", errors="replace")
        except OSError:
            continue
        if person.names(text):
            yield path, text


def files_held(person: Person) -> list:
    root = Path(settings.DATA_DIR)
    return [
        {
            "file": str(path.relative_to(root)),
            "lines": [line for line in text.splitlines() if person.names(line)],
        }
        for path, text in files_naming(person)
    ]


def files_erase(person: Person) -> int:
    """Each line naming them is replaced by [erased] (a saved export's row holds their answers
    beside their Prolific id; a log line, what they did). Rewritten in place: the same file, so
    a process still appending to a log keeps writing to it."""
    n = 0
    for path, text in files_naming(person):
        kept = "".join(
            (ERASED + "\n" if line.endswith("\n") else ERASED) if person.names(line) else line
            for line in text.splitlines(keepends=True)
        )
        with path.open("r+b") as file:
            file.write(kept.encode("utf-8"))
            file.truncate()
        n += 1
    return n


# --- the registry ------------------------------------------------------------------------------


PLACES: tuple[Place, ...] = (
    Place(
        "analysis_runs",
        "stored analysis runs: their inputs (the participant table, the ratings) and results",
        (AnalysisRun,),
        runs_held,
        runs_erase,
    ),
    Place(
        "pool_copies",
        "redacted copies of their conversation in annotation pools, and every rating of them",
        (RatedConversation,),
        pool_held,
        pool_erase,
    ),
    Place(
        "ratings",
        "the conversations they were given to rate, and their answers",
        (RatingAssignment,),
        lambda person: rows(
            RatingAssignment.objects.filter(participant=person.participant).order_by("position"),
            "id",
            "conversation_id",
            "position",
            "status",
            "answers",
            "rated_at",
        ),
        lambda person: delete(RatingAssignment.objects.filter(participant=person.participant)),
    ),
    Place(
        "problems",
        "problems they met (the monitor's list)",
        (StudyError,),
        lambda person: rows(problems(person), "id", "path", "title", "detail", "created_at"),
        lambda person: delete(problems(person)),
    ),
    Place(
        "prolific_events",
        "Prolific's webhooks about their submission",
        (ProlificEvent,),
        lambda person: rows(
            prolific_events(person),
            "id",
            "event_type",
            "resource_id",
            "payload",
            "result",
            "received_at",
        ),
        events_erase,
    ),
    Place(
        "admin_log",
        "the admin's history: entries on their rows, or naming them",
        (LogEntry,),
        lambda person: rows(
            admin_log(person), "id", "action_time", "object_repr", "change_message"
        ),
        admin_log_erase,
    ),
    Place(
        "refused_bonus_lines",
        "lines of bonus payments Prolific refused",
        (BonusPayment,),
        lambda person: [
            {"payment": p.pk, "lines": [line for line in p.refused_lines if person.names(line[0])]}
            for p in refused_payments(person)
        ],
        refused_erase,
    ),
    Place(
        "bonuses",
        "bonuses paid to them (the submission id, the amount and the date stay, by law)",
        (Bonus,),
        bonuses_held,
        bonuses_erase,
    ),
    Place(
        "review",
        "the researcher's approval or rejection of their submission",
        (Review,),
        lambda person: rows(
            Review.objects.filter(participant=person.participant),
            "action",
            "message",
            "rejection_category",
            "state",
            "created_at",
            "sent_at",
        ),
        lambda person: delete(Review.objects.filter(participant=person.participant)),
    ),
    Place(
        "responses",
        "their questionnaire answers",
        (Response,),
        lambda person: rows(
            Response.objects.filter(participant=person.participant).order_by("item__order"),
            "item__key",
            "value_number",
            "value_text",
            "created_at",
        ),
        lambda person: delete(Response.objects.filter(participant=person.participant)),
    ),
    Place(
        "messages",
        "their conversation's messages (theirs and the agent's)",
        (Message,),
        lambda person: rows(
            messages(person), "seq", "role", "content", "tool_calls", "tool_name", "created_at"
        ),
        lambda person: delete(messages(person)),
    ),
    Place(
        "withdrawal",
        "when they stopped taking part from inside the study, and what they said of their data",
        (Withdrawal,),
        lambda person: rows(
            Withdrawal.objects.filter(participant=person.participant),
            "id",
            "stage",
            "at",
            "data_kept",
            "decided_at",
            "paid",
        ),
        # the row names no one and keeps the monitor's and the analysis's counts true: only its
        # link to the person goes
        lambda person: Withdrawal.objects.filter(participant=person.participant).update(
            participant=None
        ),
    ),
    Place(
        "conversation",
        "their conversation: its Domain state and how it ended",
        (Conversation,),
        lambda person: rows(
            Conversation.objects.filter(participant=person.participant),
            "state",
            "started_at",
            "ended_at",
            "end_reason",
        ),
        lambda person: delete(Conversation.objects.filter(participant=person.participant)),
    ),
    Place(
        "files",
        "files under the data folder (logs, saved exports, queued task messages)",
        (),
        files_held,
        files_erase,
    ),
    Place(
        "participant",
        "the participant: Prolific ids, token, arm, status, outcome, times",
        (Participant,),
        lambda person: rows(
            Participant.objects.filter(pk=person.participant.pk),
            "id",
            "study__slug",
            "prolific_pid",
            "prolific_study_id",
            "prolific_session_id",
            "arm__name",
            "scenario_id",
            "status",
            "attention_passed",
            "outcome",
            "prolific_status",
            "partial_data",
            "is_bot",
            "is_preview",
            "created_at",
            "consented_at",
            "chat_ended_at",
            "completed_at",
        ),
        lambda person: delete(Participant.objects.filter(pk=person.participant.pk)),
    ),
)
