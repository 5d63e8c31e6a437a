"""Errors raised by the client. `retryable` says whether trying again could help."""


class LLMError(Exception):
    """Any failure talking to an engine; `status` is the HTTP status when there was one."""

    def __init__(self, message: str, *, status: int | None = None, retryable: bool = False):
        super().__init__(message)
        self.status = status
        self.retryable = retryable
        self.attempts = 0  # filled in by the client when it gives up
        self.partial = ""  # content already streamed to the caller, if any


class LLMConnectionError(LLMError):
    """The engine could not be reached (`connecting`), or dropped the connection."""

    def __init__(self, message: str, *, connecting: bool = False):
        super().__init__(message, retryable=True)
        self.connecting = connecting


class LLMTimeout(LLMError):
    """No connection within connect_timeout (retryable) or no byte within timeout (not retried:
    the engine may still be working on the request)."""

    def __init__(self, message: str, *, connecting: bool):
        super().__init__(message, retryable=connecting)
        self.connecting = connecting


class LLMHTTPError(LLMError):
    """The engine answered with an error status; 5xx and 429 are retryable, other 4xx are not."""

    def __init__(self, message: str, *, status: int, retry_after: float | None = None):
        super().__init__(message, status=status, retryable=status >= 500 or status == 429)
        self.retry_after = retry_after
