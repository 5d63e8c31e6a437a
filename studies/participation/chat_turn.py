"""A chat turn: the participant's message stored (or refused, and why), the chat's status, and
the chat's end (scored by the Domain; the questionnaire follows)."""

import re
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from studies.lib.domain_bridge import score_conversation
from studies.lib.flow_errors import FlowError
from studies.lib.lock_objects import lock_chat_conversation, lock_participant_with_page
from studies.lib.prepared_queries import Prepared, fields_of, instances
from studies.models import Conversation, Message, Participant, next_seq, time_out_overdue
from studies.participation.start import CONVERSATION_OF


def expire_if_overdue(participant: Participant) -> Participant:
    """The participant, timed out if past the limit (the periodic task does it for everyone)."""
    if participant.is_overdue() and time_out_overdue(Participant.objects.filter(pk=participant.pk)):
        participant.status = Participant.Status.TIMED_OUT
    return participant


def chat_closed(participant: Participant) -> "ChatOver":
    """Why a message cannot be taken once the chat is closed: the time limit, or its end."""
    if participant.status == Participant.Status.TIMED_OUT or participant.is_overdue():
        minutes = participant.study.time_limit_minutes
        return TimeUp(
            "Time is up",
            f"The time limit of {minutes} minutes has passed, so this message was not sent. "
            "Your conversation so far is saved.",
        )
    return ChatOver("The chat has ended", "This conversation is over.")


@dataclass
class Stored:
    """A chat turn's start, read under the conversation's lock in one transaction: the chat
    consumer needs nothing else from the database until the agent's reply is stored."""

    message: Message
    created: bool
    reply: Message | None  # the stored agent reply, when this message was already answered
    participant: Participant  # as now stored (status, study)
    messages: list[Message]  # the whole conversation, this message included, by seq

    @property
    def sent(self) -> int:
        """The participant's messages so far."""
        return sum(m.role == Message.Role.USER for m in self.messages)

    def replies(self) -> list[int]:
        """Replies already stored for this message (an earlier, broken turn's)."""
        return [m.pk for m in self.messages if m.reply_to_id == self.message.pk]


class ChatOver(FlowError):
    """The participant is no longer in the chat (ended, timed out): the page moves on."""


class TimeUp(ChatOver):
    """The study's time limit has passed: a message sent now is not taken (say so)."""


LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def storable_text(text: str) -> str:
    """Text every database keeps: NUL stripped (PostgreSQL refuses it), lone surrogates (not
    encodable as UTF-8) replaced by U+FFFD; a message is cleaned rather than refused, so a page
    that resends it is never locked out."""
    return LONE_SURROGATE.sub("\ufffd", text.replace("\x00", ""))


# A chat turn's reads, compiled once (studies/lib/prepared_queries.py); its lock:
# lock_chat_conversation.
# Unordered: an ORDER BY costs Django more to compile than the sort costs Python.
MESSAGES = Prepared(
    lambda conversation: (
        Message.objects.filter(conversation=conversation)
        .order_by()
        .values_list(*fields_of(Message))
    ),
    1,
)


@transaction.atomic
def store_user_message(participant: Participant, client_id: str, text: str) -> Stored:
    """Store the participant's message before it is acknowledged; a resent client id is a no-op.

    Three statements under one lock (the conversation with its participant's status; its
    messages; the insert): a chat turn is the platform's hottest path, so it reads the
    conversation once and answers the rest (duplicates, counts, next seq, history) from that
    read. The study, arm and scenario come with `participant` (the chat consumer's, read when
    the chat opened); only what changes during a chat is read again under the lock.
    """
    text = storable_text(text)
    locked = lock_chat_conversation(participant.pk)
    if not locked:
        raise Conversation.DoesNotExist
    conversation_id, ended_at, status, created_at = locked[0]
    participant.status, participant.created_at = status, created_at
    messages = sorted(instances(Message, MESSAGES.rows(conversation_id)), key=lambda m: m.seq)
    existing = next((m for m in messages if m.client_id == client_id), None)
    if existing:
        replies = [
            m
            for m in messages
            if m.reply_to_id == existing.pk
            and m.role == Message.Role.ASSISTANT
            and not m.tool_calls
        ]
        return Stored(existing, False, replies[-1] if replies else None, participant, messages)
    sent = sum(m.role == Message.Role.USER for m in messages)
    check_can_send(participant, ended_at, text, sent)
    message = Message.objects.create(
        conversation_id=conversation_id,
        seq=next_seq(m.seq for m in messages),
        role=Message.Role.USER,
        content=text,
        client_id=client_id,
    )
    return Stored(message, True, None, participant, [*messages, message])


def check_can_send(participant: Participant, ended_at, text: str, sent: int) -> None:
    study = participant.study
    if participant.status != Participant.Status.CHAT or ended_at:
        raise chat_closed(participant)
    if participant.is_overdue():  # the sweep has not reached them yet: the limit holds anyway
        raise chat_closed(participant)
    if not text.strip():
        raise FlowError("Empty message", "Please type a message first.")
    if len(text) > study.max_message_chars:  # refused whole and said so, never cut
        raise FlowError(
            "Message too long",
            f"This message was not sent: it is {len(text):,} characters long and the limit is "
            f"{study.max_message_chars:,}. Please shorten it and send it again.",
        )
    if sent >= study.max_exchanges:
        raise FlowError(
            "Message limit reached",
            "You have sent the maximum number of messages; please end the chat.",
        )


def user_message_count(conversation: Conversation) -> int:
    return conversation.messages.filter(role=Message.Role.USER).count()


def chat_status(participant: Participant, sent: int | None = None) -> dict:
    """What the page shows beside the chat; `sent` when the caller has already counted."""
    if sent is None:
        sent = user_message_count(participant.conversation)
    study = participant.study
    open_ = participant.status == Participant.Status.CHAT and not participant.is_overdue()
    return {
        "sent": sent,
        "can_end": sent >= study.min_exchanges,
        "can_send": open_ and sent < study.max_exchanges,
        "min_exchanges": study.min_exchanges,
        "max_exchanges": study.max_exchanges,
        # the page counts down from this (the server's clock, not the browser's)
        "seconds_left": participant.seconds_left(),
        "time_limit_minutes": study.time_limit_minutes,
    }


@transaction.atomic
def end_chat(participant: Participant, reason: str = "participant") -> Participant:
    participant = lock_participant_with_page(participant.pk)
    if participant.status != Participant.Status.CHAT:
        return participant
    conversation = CONVERSATION_OF.objects(participant.pk)[0]
    conversation.participant = participant  # as the reverse accessor would: no second read
    if (
        reason == "participant"
        and user_message_count(conversation) < participant.study.min_exchanges
    ):
        raise FlowError(
            "Too early to end",
            f"Please send at least {participant.study.min_exchanges} message(s) first.",
        )
    conversation.ended_at = timezone.now()
    conversation.end_reason = reason
    conversation.save(update_fields=["ended_at", "end_reason"])
    participant.outcome = score_conversation(participant, conversation)
    participant.status = Participant.Status.QUESTIONNAIRE
    participant.chat_ended_at = conversation.ended_at
    participant.save(update_fields=["outcome", "status", "chat_ended_at"])
    return participant
