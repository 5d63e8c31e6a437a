"""What a participant is shown when a step cannot go on: the lowest layer of studies, so the
flow, the Domain bridge and the views all raise the same error."""


class FlowError(Exception):
    """A problem the participant is shown, with a title and an explanation."""

    def __init__(self, title: str, detail: str, status: int = 400):
        super().__init__(detail)
        self.title, self.detail, self.status = title, detail, status
