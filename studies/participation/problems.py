"""Problems participants meet, kept for the researcher: a StudyError per flow error or
unexpected exception (the participant sees a friendly page, the monitor lists these)."""

import logging

from django.db import DatabaseError, transaction

from studies.lib.credentials import mask, mask_path
from studies.lib.flow_errors import FlowError
from studies.models import Participant, Study, StudyError

log = logging.getLogger(__name__)

UNEXPECTED = FlowError(
    "Something went wrong",
    "The study met an unexpected problem on our side. The researchers have been told. You can "
    "reload this page in a moment; if it happens again, please return to Prolific.",
    status=503,
)


def record(
    study: Study | None,
    participant: Participant | None,
    path: str,
    error: FlowError,
    traceback: str = "",
) -> None:
    """Keep the problem for the researcher; never fails the page that reports it. The path
    keeps no token: staff who may only view the study read it on the monitor, and the token
    would let them open the participant's pages and write as them."""
    if study is None or not error.recorded:
        return
    try:
        with transaction.atomic():
            StudyError.objects.create(
                study=study,
                participant=participant,
                path=mask_path(path)[:500],
                title=error.title[:200],
                detail=error.detail,
                traceback=mask(traceback),
            )
    except DatabaseError:
        log.exception("could not record a participant's problem on study %s", study.pk)
