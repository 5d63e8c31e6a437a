"""Consent: the participant agrees to the current consent text (and the chat or the rating
begins: start.py) or declines."""

from django.db import InterfaceError, OperationalError, transaction
from django.utils import timezone

from studies.lib.flow_errors import FlowError
from studies.lib.lock_objects import lock_participant_with_page, lock_study
from studies.models import Participant, Study, current_consent
from studies.participation.assign import scenario_for
from studies.participation.start import release_unstarted, start_conversation, start_rating


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
