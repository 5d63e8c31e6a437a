"""What a participant is shown when a step cannot go on: the lowest layer of studies, so the
flow, the Domain bridge and the views all raise the same error."""


class FlowError(Exception):
    """A problem the participant is shown, with a title and an explanation."""

    # Worth the researcher's attention (kept as a StudyError and shown on the monitor); False
    # for the study working as configured (full, paused).
    recorded = True

    def __init__(self, title: str, detail: str, status: int = 400):
        super().__init__(detail)
        self.title, self.detail, self.status = title, detail, status


class StudyFull(FlowError):
    """Every arm has its target of participants: the arrival takes no place."""

    recorded = False

    def __init__(self):
        super().__init__(
            "This study is full",
            "Every place in this study has been taken, so it cannot start for you. Thank you "
            "for your interest; please return to Prolific.",
            status=409,
        )


class StudyNotOpen(FlowError):
    recorded = False

    def __init__(self):
        super().__init__(
            "This study is not open", "The study is not accepting participants now.", 403
        )


class NotFound(FlowError):
    """A participant or study link that names nothing (unknown or malformed): nothing to record,
    there is no study to keep it under."""

    recorded = False

    def __init__(self, title: str, detail: str):
        super().__init__(title, detail, status=404)
