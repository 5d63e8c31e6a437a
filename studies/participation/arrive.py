"""Arrival: a Prolific link's parameters checked, the study and participant found, and a newcomer
given a place (the least-filled arm: assign.py) or a returning one resumed."""

import re
import uuid

from django.db import IntegrityError
from django.utils.crypto import constant_time_compare

from studies.lib.flow_errors import FlowError, NotFound, StudyNotOpen
from studies.lib.lock_objects import PAGE_RELATIONS
from studies.lib.prepared_queries import Prepared
from studies.models import Participant, Study
from studies.participation.assign import ASSIGN_ATTEMPTS, ArmTaken, join_least_filled
from studies.rehearsal import bots

PROLIFIC_PARAMS = ("PROLIFIC_PID", "STUDY_ID", "SESSION_ID")
PROLIFIC_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


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
