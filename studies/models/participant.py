"""A participant's path through a study: the conversation, its messages, the answers and problems."""

import uuid
from datetime import timedelta

from django.db import models, transaction
from django.utils import timezone

from studies.models.consent import ConsentVersion
from studies.models.questionnaire import Item
from studies.models.study import Arm, Scenario, Study


def only_people(via: str = "") -> models.Q:
    """The participants who are data: not bots (rehearsals, studies/rehearsal/bots.py) and not previews
    (staff walking the flow). `via`: the path to them from the queried model, e.g.
    "participants" from Arm or Study."""
    prefix = f"{via}__" if via else ""
    return models.Q(**{f"{prefix}is_bot": False, f"{prefix}is_preview": False})


def humans_unless(participants, include_bots: bool):
    """Bot participants are rehearsal data: out of exports and analyses unless asked for.
    Previews are never data."""
    return (
        participants.filter(is_preview=False)
        if include_bots
        else participants.filter(only_people())
    )


class Participant(models.Model):
    class Status(models.TextChoices):
        CONSENT = "consent", "Reading consent"
        CHAT = "chat", "Chatting"
        QUESTIONNAIRE = "questionnaire", "Answering questionnaire"
        RATING = "rating", "Rating conversations"  # an annotation study's rater
        COMPLETED = "completed", "Completed"
        NO_CONSENT = "no_consent", "Declined consent"
        TIMED_OUT = "timed_out", "Timed out"
        # The study could not start them (e.g. no scenario yet): they hold no place, and take
        # one again when they come back and the study can start them.
        UNSTARTED = "unstarted", "Could not start"
        RETURNED = "returned", "Returned on Prolific"
        # Stopped from inside the study ("stop taking part"): a Withdrawal says when, at which
        # step, and whether they let the data gathered so far be kept.
        WITHDRAWN = "withdrawn", "Withdrew"

    # Those who hold a place in their arm (the least-filled assignment counts them).
    ACTIVE = (Status.CONSENT, Status.CHAT, Status.QUESTIONNAIRE, Status.RATING, Status.COMPLETED)
    # Those still on their way: the time limit applies to them.
    UNFINISHED = (Status.CONSENT, Status.CHAT, Status.QUESTIONNAIRE, Status.RATING)
    # The steps a participant can stop taking part from (consent has its own "I do not agree").
    CAN_WITHDRAW = (Status.CHAT, Status.QUESTIONNAIRE, Status.RATING)

    study = models.ForeignKey(Study, on_delete=models.CASCADE, related_name="participants")
    arm = models.ForeignKey(Arm, on_delete=models.PROTECT, related_name="participants")
    scenario = models.ForeignKey(
        Scenario, null=True, blank=True, on_delete=models.PROTECT, related_name="participants"
    )
    token = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    prolific_pid = models.CharField("PROLIFIC_PID", max_length=64)
    prolific_study_id = models.CharField("STUDY_ID", max_length=64)
    prolific_session_id = models.CharField("SESSION_ID", max_length=64)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.CONSENT)
    attention_passed = models.BooleanField(null=True, blank=True)
    outcome = models.JSONField(null=True, blank=True, help_text="The Domain's Outcome.")
    # Set on arrival from a PROLIFIC_PID only this server can sign (studies/rehearsal/bots.py): rehearsal
    # participants, left out of arm balance, exports and analysis unless asked for.
    is_bot = models.BooleanField(default=False, editable=False)
    # The submission's status on Prolific (studies/prolific/sync.py keeps it, by webhook and sync).
    prolific_status = models.CharField(max_length=24, blank=True, editable=False)
    prolific_synced_at = models.DateTimeField(null=True, blank=True, editable=False)
    partial_data = models.BooleanField(
        default=False,
        editable=False,
        help_text="Returned or timed out on Prolific: what was gathered is kept, flagged, and its "
        "place freed.",
    )
    # Opened by staff from the study page on a fixed arm: the real flow, but never counted in
    # assignment, caps, exports or analysis.
    is_preview = models.BooleanField(default=False, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    consented_at = models.DateTimeField(null=True, blank=True)
    # The consent text they agreed to, at consented_at (studies/models/consent.py).
    consent_version = models.ForeignKey(
        ConsentVersion,
        null=True,
        blank=True,
        on_delete=models.RESTRICT,  # a version someone agreed to goes only with its study
        related_name="participants",
        editable=False,
    )
    # When the study's retention period purged their identifying data (studies/research/
    # retention.py): PID, token and session id are pseudonyms from then on.
    purged_at = models.DateTimeField(null=True, blank=True, editable=False)
    chat_ended_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["study", "prolific_pid"], name="one_participant_per_pid"
            )
        ]
        indexes = [models.Index(fields=["study", "arm", "status"])]

    def __str__(self) -> str:
        return self.prolific_pid

    @property
    def deadline(self):
        return self.created_at + timedelta(minutes=self.study.time_limit_minutes)

    def is_overdue(self) -> bool:
        return self.status in self.UNFINISHED and timezone.now() > self.deadline

    def seconds_left(self) -> int:
        """Whole seconds until the time limit (0 once it has passed)."""
        return max(0, int((self.deadline - timezone.now()).total_seconds()))


class Withdrawal(models.Model):
    """A participant who stopped taking part from inside the study. It names no one (no PID, no
    token), so it outlives an erasure of their data and the count on the monitor and in the
    analysis stays true."""

    study = models.ForeignKey(Study, on_delete=models.CASCADE, related_name="withdrawals")
    participant = models.OneToOneField(
        Participant, null=True, blank=True, on_delete=models.SET_NULL, related_name="withdrawal"
    )
    arm_name = models.CharField(max_length=64, blank=True)
    stage = models.CharField(
        max_length=16, choices=Participant.Status.choices, help_text="The step they stopped at."
    )
    at = models.DateTimeField(default=timezone.now)
    data_kept = models.BooleanField(
        null=True,
        blank=True,
        help_text="Whether they let the data gathered so far be kept; blank: not answered yet "
        "(kept until they answer, and never analysed).",
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    erased_at = models.DateTimeField(null=True, blank=True)
    # Whether the study's policy paid them for partial participation (its completion code).
    paid = models.BooleanField(default=False)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"withdrawal from {self.study_id} at {self.stage}"


class StudyError(models.Model):
    """A problem a participant met (shown a friendly page instead), kept for the researcher."""

    study = models.ForeignKey(Study, on_delete=models.CASCADE, related_name="errors")
    participant = models.ForeignKey(
        Participant, null=True, blank=True, on_delete=models.SET_NULL, related_name="errors"
    )
    path = models.CharField(max_length=500, blank=True)
    title = models.CharField(max_length=200)
    detail = models.TextField(blank=True)
    traceback = models.TextField(blank=True, help_text="Unexpected errors only.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["study", "-created_at"])]

    def __str__(self) -> str:
        return self.title


class Conversation(models.Model):
    participant = models.OneToOneField(
        Participant, on_delete=models.CASCADE, related_name="conversation"
    )
    state = models.JSONField(
        null=True, blank=True, help_text="This conversation's own Domain state."
    )
    started_at = models.DateTimeField(auto_now_add=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    end_reason = models.CharField(max_length=32, blank=True)

    def __str__(self) -> str:
        return f"conversation of {self.participant}"

    def next_seq(self) -> int:
        """The seq this conversation's next message takes, read from the database (callers
        that already hold the messages pass their seqs to `next_seq` instead)."""
        return next_seq(self.messages.order_by("-seq").values_list("seq", flat=True)[:1])


def next_seq(seqs) -> int:
    """The one rule for a message's place: one after the conversation's largest seq, 1 first."""
    return max(seqs, default=0) + 1


TIME_LIMIT = "time limit"  # a Conversation's end_reason when its participant ran out of time


def time_out_overdue(participants=None, now=None) -> list[int]:
    """Time out the unfinished participants past their study's time limit (all of them, or those
    of the `participants` queryset), freeing their arm places; returns their ids.

    The periodic task and every page load call this. Rows a flow step holds locked are skipped
    (that step decides; the next sweep looks again), so a participant finishing right at the
    limit is never timed out after completing. Their conversation ends, with all it holds.
    """
    now = now or timezone.now()
    participants = (Participant.objects.all() if participants is None else participants).filter(
        status__in=Participant.UNFINISHED
    )
    limits = (
        Study.objects.filter(participants__in=participants)
        .order_by()
        .values_list("pk", "time_limit_minutes")
        .distinct()
    )
    overdue = models.Q(pk__in=[])
    for study_id, minutes in limits:
        overdue |= models.Q(study_id=study_id, created_at__lt=now - timedelta(minutes=minutes))
    with transaction.atomic():
        ids = list(
            participants.filter(overdue)
            .select_for_update(skip_locked=True)
            .values_list("pk", flat=True)
        )
        Participant.objects.filter(pk__in=ids).update(status=Participant.Status.TIMED_OUT)
        Conversation.objects.filter(participant_id__in=ids, ended_at__isnull=True).update(
            ended_at=now, end_reason=TIME_LIMIT
        )
    return ids


class Message(models.Model):
    class Role(models.TextChoices):
        USER = "user", "Participant"
        ASSISTANT = "assistant", "Agent"
        TOOL = "tool", "Tool result"

    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="messages"
    )
    seq = models.PositiveIntegerField()
    role = models.CharField(max_length=10, choices=Role.choices)
    content = models.TextField(blank=True)
    client_id = models.CharField(max_length=64, null=True, blank=True)
    reply_to = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="replies"
    )
    tool_calls = models.JSONField(null=True, blank=True)
    tool_call_id = models.CharField(max_length=100, blank=True)
    tool_name = models.CharField(max_length=100, blank=True)
    model = models.CharField(max_length=200, blank=True)
    replica = models.CharField(
        max_length=500, blank=True, help_text="Base URL of the replica that served this reply."
    )
    finish_reason = models.CharField(max_length=32, blank=True)
    ttft_ms = models.PositiveIntegerField(null=True, blank=True)
    latency_ms = models.PositiveIntegerField(null=True, blank=True)
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    completion_tokens = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["conversation", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["conversation", "seq"], name="unique_message_seq"),
            models.UniqueConstraint(
                fields=["conversation", "client_id"],
                condition=models.Q(client_id__isnull=False),
                name="unique_client_message",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.role} #{self.seq}"

    def to_chat(self) -> dict:
        """The OpenAI-style message the Domain and the model see."""
        message = {"role": self.role, "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        if self.role == self.Role.TOOL:
            message.update(tool_call_id=self.tool_call_id, name=self.tool_name)
        return message

    def to_client(self) -> dict:
        """What the participant's browser receives."""
        return {
            "seq": self.seq,
            "role": self.role,
            "content": self.content,
            "client_id": self.client_id,
            "tool_calls": self.tool_calls or [],
            "tool_name": self.tool_name,
        }


class Response(models.Model):
    participant = models.ForeignKey(Participant, on_delete=models.CASCADE, related_name="responses")
    item = models.ForeignKey(Item, on_delete=models.PROTECT, related_name="responses")
    value_number = models.FloatField(null=True, blank=True)
    value_text = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["participant", "item"], name="one_response_per_item")
        ]

    def __str__(self) -> str:
        return f"{self.participant} {self.item.key}"

    @property
    def value(self):
        return self.value_text if self.item.kind == Item.Kind.TEXT else self.value_number


def finished_participants(study: Study):
    """The participants who are a study's data: people who completed it, not returned or timed
    out on Prolific (partial data), not excluded by its attention rule."""
    participants = humans_unless(study.participants.all(), include_bots=False).filter(
        status=Participant.Status.COMPLETED, partial_data=False
    )
    if study.exclude_failed_attention:
        participants = participants.exclude(attention_passed=False)
    return participants
