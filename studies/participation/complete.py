"""Completion: the ending a participant reached, the code and link they take back to Prolific,
and the study's progress once a completion is stored (closed when full, then analysed)."""

import logging

from studies import tasks
from studies.lib.prepared_queries import Prepared
from studies.models import COMPLETE_URL, CompletionCode, Ending, Participant, Study
from studies.prolific import sync as prolific_sync

PROLIFIC_COMPLETE_URL = COMPLETE_URL


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
