"""Starting: a chat's conversation begun with its opening, a rater's conversations assigned, a
place given back by someone who could not start (and taken anew on their return), and a
staff preview of an arm."""

import uuid

from django.db import transaction
from django.utils import timezone

from studies.annotation.assignment import NoConversations, assign
from studies.lib.domain_bridge import opening_messages
from studies.lib.flow_errors import FlowError, StudyNotOpen
from studies.lib.lock_objects import lock_participant
from studies.lib.prepared_queries import Prepared
from studies.models import Arm, Conversation, Message, Participant, Study, next_seq
from studies.participation.assign import (
    ASSIGN_ATTEMPTS,
    ArmTaken,
    least_used_scenario,
    place_in_least_filled,
    scenario_for,
)


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
