"""The participant's path through a study: arrive, consent, chat, questionnaire, complete.

Views and the chat consumer stay thin and call these functions; every write happens
in a transaction so that nothing stored is lost or duplicated.
"""

import logging
import re
import uuid
from dataclasses import dataclass

from django.db import IntegrityError, InterfaceError, OperationalError, transaction
from django.db.models import Count, Q
from django.utils import timezone
from django.utils.crypto import constant_time_compare

from studies import tasks
from studies.annotation.assignment import NoConversations, assign
from studies.lib.domain_bridge import (  # noqa: F401 - debrief: the debrief page's words, for views
    debrief,
    opening_messages,
    outcome_after_questionnaire,
    questionnaire_inputs,
    score_conversation,
)
from studies.lib.flow_errors import FlowError, NotFound, StudyFull, StudyNotOpen
from studies.lib.lock_objects import (
    PAGE_RELATIONS,
    lock_arm,
    lock_chat_conversation,
    lock_participant,
    lock_participant_with_page,
    lock_study,
)
from studies.lib.prepared_queries import Prepared, fields_of, instances
from studies.models import (
    COMPLETE_URL,
    Arm,
    CompletionCode,
    Conversation,
    Ending,
    Item,
    Message,
    Participant,
    Response,
    Scenario,
    Study,
    current_consent,
    next_seq,
    time_out_overdue,
)
from studies.participation import problems
from studies.prolific import sync as prolific_sync
from studies.rehearsal import bots

PROLIFIC_PARAMS = ("PROLIFIC_PID", "STUDY_ID", "SESSION_ID")
PROLIFIC_COMPLETE_URL = COMPLETE_URL
PROLIFIC_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


# --- arrival ---------------------------------------------------------------------------------


def check_prolific_params(params) -> dict[str, str]:
    """The three Prolific parameters, or a FlowError that names what is missing or malformed."""
    missing = [name for name in PROLIFIC_PARAMS if not params.get(name, "").strip()]
    if missing:
        raise FlowError(
            "This link is incomplete",
            "The study link is missing " + ", ".join(missing) + ". Please open the study again "
            "from Prolific so that the link carries your participant details.",
        )
    values = {name: params[name].strip() for name in PROLIFIC_PARAMS}
    bad = [name for name, value in values.items() if not PROLIFIC_ID.match(value)]
    if bad:
        raise FlowError(
            "This link is malformed",
            "These parameters are not valid Prolific identifiers: " + ", ".join(bad) + ".",
        )
    return values


SLUG = re.compile(r"[-a-zA-Z0-9_]+")  # what a Study.slug can be; any other text names none
STUDY = Prepared(lambda slug: Study.objects.filter(slug=slug), 1, kinds=(str,))  # slug: unique


def open_study(slug: str) -> Study:
    """The study of a participant link; the URLs take any text, so that a malformed link gets
    the same friendly page as an unknown one (and never reaches the database)."""
    found = STUDY.objects(slug) if SLUG.fullmatch(slug) else []
    study = found[0] if found else None
    if study is None:
        raise NotFound("Study not found", "There is no study at this address.")
    return study


# Every participant page reads its participant by token, with what the page shows of the study:
# compiled once (studies/lib/prepared_queries.py), as compiling it cost more than running it.
# The token is unique: no order needed.
PARTICIPANT = Prepared(
    lambda token: Participant.objects.select_related(*PAGE_RELATIONS).filter(token=token),
    1,
    kinds=(uuid.UUID,),
)


def find_participant(token: str) -> Participant:
    """The participant of a /p/<token>/ link, unknown and malformed tokens alike a NotFound."""
    try:
        key = uuid.UUID(str(token))
    except ValueError:
        key = None
    found = PARTICIPANT.objects(key) if key is not None else []
    participant = found[0] if found else None
    if participant is None:
        raise NotFound(
            "Link not found",
            "This participant link is not valid: it may be incomplete. Please open the study "
            "again from Prolific.",
        )
    return participant


def arrive(study: Study, params, known_token: str | None = None) -> tuple[Participant, bool]:
    """Resume the participant of this PROLIFIC_PID, or create one in the least-filled arm.

    known_token is the participant token this browser was given at its first arrival (the view
    reads it from a signed cookie), or None.
    """
    values = check_prolific_params(params)
    if study.prolific_study_id and values["STUDY_ID"] != study.prolific_study_id:
        raise FlowError("Wrong study", "This link's STUDY_ID does not belong to this study.")
    existing = RETURNING.objects(study.pk, values["PROLIFIC_PID"])
    if existing:
        return resume(existing[0], values, known_token), False
    if study.status != Study.Status.LIVE:
        raise StudyNotOpen()
    try:
        participant = _assign(study, values)
    except IntegrityError:  # the same PID arrived twice at once: the other request created it
        participant = Participant.objects.get(study=study, prolific_pid=values["PROLIFIC_PID"])
        return resume(participant, values, known_token), False
    return resume(participant, values, known_token), True


# What happened and what the participant can do about it, in their words: a new Prolific
# submission (they returned the study and took it again) cannot take over the earlier one here.
SESSION_TAKEN = (
    "This study was already started with your Prolific ID",
    "Your Prolific ID was already used to start this study from an earlier Prolific submission, "
    "and this link belongs to a new submission, so it cannot open that study. This happens if "
    "you returned the study on Prolific and then took it again. To carry on where you left off, "
    "open the study from Prolific on the same device and browser you used the first time. If "
    "you cannot, please message the researcher through Prolific and say you saw this page; do "
    "not take the study again.",
)


def resume(participant: Participant, values: dict[str, str], known_token: str | None):
    """The participant, if this arrival is theirs: the stored SESSION_ID, or this browser's cookie.

    A PROLIFIC_PID is no secret (it appears in links, screenshots and messages); the SESSION_ID
    is Prolific's submission id, which only the participant's own study link carries.
    Prolific gives a new SESSION_ID when a participant returns the study and takes it again (a
    new submission). We cannot tell that person from someone who knows their PID, so a new
    SESSION_ID resumes only in the browser that started (the cookie), and the new submission id
    is recorded there, as the researcher approves that submission; elsewhere it is refused.
    """
    same_session = constant_time_compare(values["SESSION_ID"], participant.prolific_session_id)
    same_browser = known_token is not None and constant_time_compare(
        known_token, str(participant.token)
    )
    if not (same_session or same_browser):
        raise FlowError(*SESSION_TAKEN, status=403)
    if not same_session:
        Participant.objects.filter(pk=participant.pk).update(
            prolific_session_id=values["SESSION_ID"]
        )
        participant.prolific_session_id = values["SESSION_ID"]
    return participant


ASSIGN_ATTEMPTS = 8  # choices of an arm before an arrival takes the one it holds


class ArmTaken(Exception):
    """Another arrival filled the chosen arm meanwhile: choose again."""


# (study, Prolific id) is unique: no order needed
RETURNING = Prepared(
    lambda study_id, pid: Participant.objects.filter(study_id=study_id, prolific_pid=pid),
    2,
    kinds=(int, str),
)


def _assign(study: Study, values: dict[str, str]) -> Participant:
    # Arrivals lock the arm they join, not the study: arrivals to different arms run side by
    # side. Under the arm's lock its count is exact; it is taken only if still least filled,
    # else the attempt's transaction ends (releasing the lock) and the arrival chooses again.
    is_bot = bots.is_bot_pid(study, values["PROLIFIC_PID"])
    for attempt in range(ASSIGN_ATTEMPTS):
        try:
            return join_least_filled(study, values, is_bot, attempt == ASSIGN_ATTEMPTS - 1)
        except ArmTaken:
            continue
    raise AssertionError("unreachable: the last attempt always joins")


@transaction.atomic
def join_least_filled(study: Study, values: dict[str, str], is_bot: bool, last: bool):
    arm, scenario = place_in_least_filled(study, is_bot, last)
    return Participant.objects.create(
        study=study,
        arm=arm,
        scenario=scenario,
        prolific_pid=values["PROLIFIC_PID"],
        prolific_study_id=values["STUDY_ID"],
        prolific_session_id=values["SESSION_ID"],
        is_bot=is_bot,
    )


def place_in_least_filled(study: Study, is_bot: bool, last: bool) -> tuple[Arm, Scenario | None]:
    """The arm (locked until the caller's transaction ends) and scenario of a new place.

    Under the arm's lock its count is exact, so the target per arm is a cap two concurrent
    arrivals cannot both pass: an arm found full sends the arrival to choose again, and when
    every arm is full it takes no place (StudyFull). Bots rehearse beside people, uncapped.
    """
    arm = least_filled_arm(study, is_bot)
    lock_arm(arm.pk)
    filled = {a.pk: a.filled for a in arms_with_fill(study, is_bot)}
    mine = filled.get(arm.pk, arm.filled)
    if not is_bot and mine >= study.target_per_arm:
        if min(filled.values(), default=mine) >= study.target_per_arm or last:
            raise StudyFull()
        raise ArmTaken
    if mine > min(filled.values(), default=0) and not last:
        raise ArmTaken
    return arm, scenario_for(study, arm, is_bot)


def scenario_for(study: Study, arm: Arm, is_bot: bool = False) -> Scenario | None:
    """The least-used scenario; a study whose Domain needs one and has none starts nobody (the
    participant is told, and takes no place)."""
    scenario = least_used_scenario(study, arm, is_bot)
    if scenario is None and study.needs_scenarios():
        raise FlowError(
            "This study is not ready",
            "The study has no task ready for you yet. Please try again later or return to "
            "Prolific.",
            503,
        )
    return scenario


def is_full(study: Study) -> bool:
    """Every active arm holds its target of people (active plus completed)."""
    arms = arms_with_fill(study)
    return bool(arms) and all(arm.filled >= study.target_per_arm for arm in arms)


def _arms_with_fill(is_bot: bool) -> Prepared:
    holding = Q(
        participants__status__in=Participant.ACTIVE,
        participants__is_bot=is_bot,
        participants__is_preview=False,
    )
    return Prepared(
        lambda study_id: (
            Arm.objects.filter(study_id=study_id, active=True)
            .order_by()
            .annotate(filled=Count("participants", filter=holding))
        ),
        1,
    )


# compiled once (studies/lib/prepared_queries.py): each arrival counts twice, and compiling the
# annotated query cost more than running it
ARMS_WITH_FILL = {is_bot: _arms_with_fill(is_bot) for is_bot in (False, True)}


def arms_with_fill(study: Study, is_bot: bool = False) -> list[Arm]:
    """The active arms, each with `filled`: its active plus completed participants (bots
    counted apart from people; previews never)."""
    return ARMS_WITH_FILL[bool(is_bot)].objects(study.pk)


def least_filled_arm(study: Study, is_bot: bool = False) -> Arm:
    """Fewest active plus completed participants; ties go to the lower (order, id). Bots are
    balanced among bots, so a rehearsal never tilts where real participants go."""
    arms = arms_with_fill(study, is_bot)
    if not arms:
        raise FlowError("This study is not ready", "The study has no active arm yet.", 503)
    return min(arms, key=lambda arm: (arm.filled, arm.order, arm.id))


def _scenario_use(is_bot: bool) -> Prepared:
    return Prepared(
        lambda study_id, arm_id: (
            Scenario.objects.filter(study_id=study_id, active=True)
            .order_by()
            .annotate(
                used=Count(
                    "participants",
                    filter=Q(
                        participants__arm_id=arm_id,
                        participants__status__in=Participant.ACTIVE,
                        participants__is_bot=is_bot,
                        participants__is_preview=False,
                    ),
                )
            )
        ),
        2,
    )


SCENARIO_USE = {is_bot: _scenario_use(is_bot) for is_bot in (False, True)}


def least_used_scenario(study: Study, arm: Arm, is_bot: bool = False) -> Scenario | None:
    """Within the arm, the scenario used least often, so every scenario is used about equally."""
    scenarios = SCENARIO_USE[bool(is_bot)].objects(study.pk, arm.pk)
    return min(scenarios, key=lambda s: (s.used, s.id), default=None)


# --- steps -------------------------------------------------------------------------------------


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


class ConsentChanged(FlowError):
    """The consent text changed while the participant read it: they read the new one first."""


def give_consent(participant: Participant, accepted: bool, read=None) -> Participant:
    """Consent, and the chat begins. A participant the study cannot start (no scenario for
    the task) gives their place back (UNSTARTED) and sees why; the FlowError is raised on.
    `read`: the id of the consent version their page showed; an agreement to a text that is no
    longer the study's is refused (ConsentChanged), so each record names the text agreed to."""
    try:
        return _give_consent(participant, accepted, read)
    except (OperationalError, InterfaceError, ConsentChanged):
        raise  # the database is briefly away (a retry page), or the text to read again: the
        # place is theirs still
    except Exception:
        release_unstarted(participant)
        raise


@transaction.atomic
def _give_consent(participant: Participant, accepted: bool, read=None) -> Participant:
    participant = lock_participant_with_page(participant.pk)
    if participant.status != Participant.Status.CONSENT:
        return participant  # a double submit changes nothing
    if accepted:
        if is_annotation(participant.study):
            # A rater's place is taken under the study's lock (annotation.assign): taken before
            # the consent version's, in the order an admin's save of the study takes them
            # (studies/lib/lock_objects.py), or the two can deadlock.
            lock_study(participant.study_id)
        # Locked until this agreement commits: an edit of the text waits, then sees that
        # someone agreed to this version and makes a new one.
        version = current_consent(participant.study, lock=True)
        if read is not None and str(read) != str(version.pk):
            raise ConsentChanged(
                "The consent information has changed",
                "The study's consent information was updated while you were reading it. "
                "Please read it again before you decide.",
                status=409,
            )
        participant.consent_version = version
    if accepted and is_annotation(participant.study):
        start_rating(participant)  # a rater: conversations to rate, not a chat
        participant.consented_at = timezone.now()
    elif accepted:
        if participant.scenario_id is None:  # arrived before the pool was filled
            participant.scenario = scenario_for(participant.study, participant.arm)
        participant.status = Participant.Status.CHAT
        participant.consented_at = timezone.now()
        start_conversation(participant)
    else:
        participant.status = Participant.Status.NO_CONSENT
    participant.save()
    return participant


def is_annotation(study: Study) -> bool:
    """An annotation study: its participants rate conversations (participation/rating.py)."""
    return hasattr(study, "annotation")


def start_rating(participant: Participant) -> None:
    """The rater's conversations, or why there are none (give_consent then frees the place)."""
    try:
        assign(participant)
    except NoConversations as none:
        raise FlowError(
            "No conversations left to rate",
            "Every conversation in this study already has all the ratings it needs. Thank you "
            "for your interest; please return the study on Prolific.",
        ) from none
    participant.status = Participant.Status.RATING


def release_unstarted(participant: Participant) -> None:
    """The place of a participant who could not start goes back to the pool."""
    Participant.objects.filter(pk=participant.pk, status=Participant.Status.CONSENT).update(
        status=Participant.Status.UNSTARTED
    )


def restart(participant: Participant) -> Participant:
    """A participant who could not start, back again: a place anew (arm and scenario chosen
    again, caps applied), or the FlowError that still keeps them out."""
    study = participant.study
    if study.status != Study.Status.LIVE and not participant.is_preview:
        raise StudyNotOpen()
    for attempt in range(ASSIGN_ATTEMPTS):
        try:
            with transaction.atomic():
                locked = lock_participant(participant.pk)
                if locked.status != Participant.Status.UNSTARTED:
                    return locked
                if locked.is_preview:  # a preview keeps the arm its link fixed
                    arm, scenario = locked.arm, scenario_for(study, locked.arm)
                else:
                    arm, scenario = place_in_least_filled(
                        study, locked.is_bot, attempt == ASSIGN_ATTEMPTS - 1
                    )
                locked.arm, locked.scenario = arm, scenario
                locked.status = Participant.Status.CONSENT
                locked.created_at = timezone.now()  # their time limit starts with the place
                locked.save(update_fields=["arm", "scenario", "status", "created_at"])
                return locked
        except ArmTaken:
            continue
    raise AssertionError("unreachable: the last attempt always joins or raises")


def start_preview(arm: Arm) -> Participant:
    """A participant for staff to walk the real flow on this arm: the arm is the link's, and
    previews count nowhere (assignment, caps, exports, analysis)."""
    key = uuid.uuid4().hex[:16]
    return Participant.objects.create(
        study=arm.study,
        arm=arm,
        scenario=least_used_scenario(arm.study, arm),
        prolific_pid=f"preview-{key}",
        prolific_study_id="preview",
        prolific_session_id=f"preview-{key}",
        is_preview=True,
    )


CONVERSATION_OF = Prepared(
    lambda participant_id: Conversation.objects.filter(participant_id=participant_id), 1
)


def start_conversation(participant: Participant) -> Conversation:
    """The participant's conversation, begun with its opening (state, greeting) if it has none.
    Called under the participant's row lock (consent), so nothing else creates it meanwhile: a
    read and a plain insert, without get_or_create's savepoint."""
    found = CONVERSATION_OF.objects(participant.pk)
    if found:
        return found[0]
    state, greeting = opening_messages(participant)
    conversation = Conversation(participant=participant, state=state)
    conversation.save(force_insert=True)
    if greeting:
        Message.objects.create(
            conversation=conversation,
            seq=next_seq(()),
            role=Message.Role.ASSISTANT,
            content=greeting,
        )
    return conversation


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


# --- questionnaire ------------------------------------------------------------------------------


def validate_answers(
    items: list[Item], data, needs: dict | None = None
) -> tuple[dict[int, float | str], dict[str, str]]:
    """Check every answer on the server: (values by item id, errors by item key). `needs`: the
    Domain's inputs by name; an item mapped to one must be answered within its bounds."""
    values, errors = {}, {}
    needs = needs or {}
    for item in items:
        need = needs.get(item.domain_input)
        raw = (data.get(item.key) or "").strip()
        if raw != storable_text(raw):  # a NUL or broken character: say so, never a 500
            errors[item.key] = "Please remove the unusual characters from this answer."
            continue
        if not raw:
            if item.required or item.kind == Item.Kind.ATTENTION or need:
                errors[item.key] = "Please answer this question."
            continue
        if item.kind == Item.Kind.TEXT:
            if len(raw) > 5000:
                errors[item.key] = "Please keep this answer under 5000 characters."
            else:
                values[item.id] = raw
            continue
        try:
            number = float(raw)
        except ValueError:
            errors[item.key] = "Please enter a number."
            continue
        if item.is_scale:
            if not number.is_integer() or not 1 <= number <= item.scale_points:
                errors[item.key] = f"Please choose one of the points 1 to {item.scale_points}."
                continue
        else:
            if number != number or number in (float("inf"), float("-inf")):
                errors[item.key] = "Please enter a number."
                continue
            if item.min_value is not None and number < item.min_value:
                errors[item.key] = f"Please enter a number of at least {item.min_value:g}."
                continue
            if item.max_value is not None and number > item.max_value:
                errors[item.key] = f"Please enter a number of at most {item.max_value:g}."
                continue
        if need and not need.min_value <= number <= need.max_value:
            errors[item.key] = (
                f"Please enter a number from {need.min_value:g} to {need.max_value:g}."
            )
            continue
        values[item.id] = number
    return values, errors


ITEMS = Prepared(lambda questionnaire_id: Item.objects.filter(questionnaire_id=questionnaire_id), 1)


def questionnaire_items(study: Study) -> list[Item]:
    """Study.questionnaire_items, through the compiled read (the questionnaire itself comes
    with the participant's page read)."""
    questionnaire = getattr(study, "questionnaire", None)
    return ITEMS.objects(questionnaire.pk) if questionnaire is not None else []


@transaction.atomic
def submit_questionnaire(participant: Participant, data) -> dict[str, str]:
    """Store the answers and complete the participant; returns errors (nothing stored) if any."""
    participant = lock_participant_with_page(participant.pk)
    if participant.status != Participant.Status.QUESTIONNAIRE:
        return {}
    items = questionnaire_items(participant.study)
    needs = questionnaire_inputs(participant)
    values, errors = validate_answers(items, data, needs)
    if errors:
        return errors
    by_id = {item.id: item for item in items}
    # As update_or_create per item, in one read and one insert: under the participant's lock
    # no other request writes these rows meanwhile.
    stored = {r.item_id: r for r in Response.objects.filter(participant=participant)}
    added = []
    for item_id, value in values.items():
        field = "value_text" if isinstance(value, str) else "value_number"
        if item_id in stored:
            setattr(stored[item_id], field, value)
            stored[item_id].save(update_fields=[field])
        else:
            added.append(Response(participant=participant, item_id=item_id, **{field: value}))
    Response.objects.bulk_create(added)
    checks = [item for item in items if item.kind == Item.Kind.ATTENTION]
    if checks:
        participant.attention_passed = all(
            values.get(item.id) == float(item.expected_answer) for item in checks
        )
    inputs = {by_id[i].domain_input: v for i, v in values.items() if by_id[i].domain_input in needs}
    participant.outcome, problem = outcome_after_questionnaire(participant, inputs)
    if problem:  # the participant is done all the same; the researcher sees it on the monitor
        problems.record(
            participant.study,
            participant,
            "questionnaire",
            FlowError("The outcome was not taken from the questionnaire", problem),
        )
    participant.status = Participant.Status.COMPLETED
    participant.completed_at = timezone.now()
    participant.save()
    transaction.on_commit(lambda: study_progress(participant.study_id))
    return {}


STUDY_BY_ID = Prepared(lambda pk: Study.objects.filter(pk=pk), 1)


def study_progress(study_id: int) -> None:
    """After a completion: once every active arm has its target of completed people, close the
    study if it asked to be closed when full, and analyse it. One read of the study and one
    count (every completion runs this; places held by people still going may yet be given
    back, so they do not count)."""
    found = STUDY_BY_ID.objects(study_id)
    if not found or not tasks.target_reached(found[0]):
        return
    study = found[0]
    if study.close_when_full and study.status == Study.Status.LIVE:
        Study.objects.filter(pk=study_id, status=Study.Status.LIVE).update(
            status=Study.Status.CLOSED
        )
    try:
        tasks.analyse_at_target(study)
    except Exception:  # the participant's completion is stored; a broker hiccup must not undo it
        logging.getLogger(__name__).exception("could not start the analysis of study %s", study_id)


def ending(participant: Participant) -> str | None:
    """Which of the study's endings the participant reached (each may have its code): a
    completion whose failed attention checks allow a rejection under Prolific's rules is
    FAILED_ATTENTION when the study has that code; a returned submission reaches none."""
    study = participant.study
    if participant.status == Participant.Status.COMPLETED:
        if (
            participant.attention_passed is False
            and study.code(Ending.FAILED_ATTENTION)
            and prolific_sync.attention_rejection_allowed(participant)
        ):
            return Ending.FAILED_ATTENTION
        return Ending.COMPLETED
    return {
        Participant.Status.NO_CONSENT: Ending.NO_CONSENT,
        Participant.Status.TIMED_OUT: Ending.TIMED_OUT,
    }.get(participant.status)


CODES = Prepared(
    lambda study_id: CompletionCode.objects.filter(study_id=study_id).values_list("ending", "code"),
    1,
)


def completion_code(participant: Participant) -> str:
    """The code the participant takes back to Prolific; those who decline or time out get the
    study's OTHER code (its problem code) when their own is blank."""
    if participant.is_preview:  # staff walking the flow: nothing to return to Prolific
        return ""
    study = participant.study
    if not study.knows_codes():  # read through the compiled query, once a page
        study.remember_codes(CODES.rows(study.pk))
    if participant.status == Participant.Status.WITHDRAWN:
        # Stopped from inside the study: paid only where the study's policy pays for partial
        # participation; else they return the submission on Prolific (no code to give).
        return study.code(Ending.COMPLETED) if study.pays_partial else ""
    reached = ending(participant)
    if reached is None:
        return ""
    code = participant.study.code(reached)
    if not code and reached in (Ending.NO_CONSENT, Ending.TIMED_OUT):
        code = participant.study.code(Ending.PROBLEM)
    return code


def completion_url(participant: Participant) -> str | None:
    code = completion_code(participant)
    return PROLIFIC_COMPLETE_URL.format(code=code) if code else None
