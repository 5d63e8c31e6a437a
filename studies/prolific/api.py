"""The Prolific researcher API: the calls parley makes, and the webhook signature.

Facts from Prolific's documentation (see ../shared/reference/prolific.md). The token comes from
settings (PROLIFIC_API_TOKEN, read from the environment) and lives only in this client's request
headers: it is never stored, logged, or shown in an error or a repr.
"""

import base64
import hashlib
import hmac
import json
import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from email.utils import parsedate_to_datetime

import httpx
from django.conf import settings
from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt
from tenacity.wait import wait_base, wait_exponential

log = logging.getLogger(__name__)

# Submission statuses as objects spell them; filters use underscores (both are accepted).
RESERVED, ACTIVE, TIMED_OUT, AWAITING_REVIEW = "RESERVED", "ACTIVE", "TIMED-OUT", "AWAITING REVIEW"
APPROVED, RETURNED, REJECTED = "APPROVED", "RETURNED", "REJECTED"
SCREENED_OUT, PARTIALLY_APPROVED, PROCESSING = "SCREENED OUT", "PARTIALLY APPROVED", "PROCESSING"
# How far along a submission is: a webhook that would move it back arrived out of order (Prolific
# does not guarantee order), unless Prolific itself says so (an UNREJECT or UNRETURN).
STATUS_RANK = {RESERVED: 0, ACTIVE: 1, AWAITING_REVIEW: 2, PROCESSING: 3}  # every other: final
# Every status Prolific documents; any other word is not stored (it would outrank, as final, the
# real statuses that follow it, and may not fit the column).
KNOWN_STATUSES = frozenset(
    (RESERVED, ACTIVE, TIMED_OUT, AWAITING_REVIEW, APPROVED, RETURNED, REJECTED, SCREENED_OUT)
    + (PARTIALLY_APPROVED, PROCESSING)
)


def status_rank(status: str) -> int:
    status = normal_status(status)
    return STATUS_RANK.get(status, 4) if status else -1  # none known yet: anything is news


REJECTION_CATEGORIES = {
    "TOO_QUICKLY": "Too quickly",
    "TOO_SLOWLY": "Too slowly",
    "FAILED_INSTRUCTIONS": "Failed instructions",
    "INCOMP_LONGITUDINAL": "Incomplete longitudinal",
    "FAILED_CHECK": "Failed attention check",
    "LOW_EFFORT": "Low effort",
    "MALINGERING": "Malingering",
    "NO_CODE": "No code",
    "BAD_CODE": "Bad code",
    "NO_DATA": "No data",
    "UNSUPP_DEVICE": "Unsupported device",
    "OTHER": "Other",
}
REJECTION_MESSAGE_MIN = 100  # characters Prolific requires of a rejection message
BULK_APPROVE_MAX = 1000  # ids per bulk-approve request (batches are sent one after another)


def normal_status(status: str | None) -> str:
    """A submission status in the objects' spelling, whichever spelling came in."""
    text = (status or "").strip().upper()
    return {"AWAITING_REVIEW": AWAITING_REVIEW, "SCREENED_OUT": SCREENED_OUT}.get(
        text, text.replace("TIMED_OUT", TIMED_OUT)
    )


def check_rejection(message: str, category: str) -> None:
    """ValueError naming what Prolific would refuse in a rejection."""
    if category not in REJECTION_CATEGORIES:
        raise ValueError(
            f"Unknown rejection category {category!r}; one of {', '.join(REJECTION_CATEGORIES)}."
        )
    if len((message or "").strip()) < REJECTION_MESSAGE_MIN:
        raise ValueError(
            f"A rejection message needs at least {REJECTION_MESSAGE_MIN} characters "
            f"(this one has {len((message or '').strip())})."
        )


# --- webhook signature ---------------------------------------------------------------------


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """base64(HMAC-SHA256(secret, timestamp + body)), as Prolific signs a webhook."""
    digest = hmac.new(secret.encode(), timestamp.encode() + body, hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


def signature_valid(secret: str, timestamp: str, body: bytes, given: str) -> bool:
    """Over the raw body; Prolific's own example signs json.dumps of the parsed body, so that
    form is accepted too. Constant-time comparisons."""
    if not (secret and timestamp and given):
        return False
    if hmac.compare_digest(signature(secret, timestamp, body), given):
        return True
    try:
        redumped = json.dumps(json.loads(body)).encode()
    except (ValueError, UnicodeDecodeError):
        return False
    return redumped != body and hmac.compare_digest(signature(secret, timestamp, redumped), given)


# --- the API ----------------------------------------------------------------------------------


class ProlificError(Exception):
    """A failed call: `status` is the HTTP status (None: no answer, the outcome is unknown)."""

    def __init__(self, method: str, path: str, status: int | None, detail: str):
        super().__init__(f"Prolific {method} {path}: {status or 'no answer'}: {detail}")
        self.status, self.detail = status, detail

    @property
    def refused(self) -> bool:
        """Prolific answered that it did not do it (4xx): repeating it cannot do it twice."""
        return self.status is not None and 400 <= self.status < 500


class NotConfigured(ProlificError):
    def __init__(self):
        Exception.__init__(self, "PROLIFIC_API_TOKEN is not set.")
        self.status, self.detail = None, "PROLIFIC_API_TOKEN is not set."


@dataclass
class BonusSetup:
    id: str
    amount: int  # pence/cents, as Prolific answers
    total_amount: int


def error_detail(response: httpx.Response) -> str:
    """The explanation in either error body Prolific sends, else the start of the text."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:300]
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict):
            parts = [error.get("title"), error.get("detail"), error.get("additional_information")]
            return " ".join(str(p) for p in parts if p)[:500] or json.dumps(error)[:500]
        if body.get("detail") or body.get("message"):
            return " ".join(str(body[k]) for k in ("message", "detail") if body.get(k))[:500]
    return json.dumps(body)[:500]


# Answers that say "not now": 429 (too many requests: nothing was done) and 503 (unavailable).
BUSY = frozenset({429, 503})
MAX_RETRY_AFTER = 60.0  # seconds waited inside one call; longer: the call fails, the job retries


class Busy(Exception):
    """A busy answer, retried inside `Prolific.request`; never leaves it."""

    def __init__(self, response: httpx.Response):
        super().__init__(response.status_code)
        self.response = response


def retry_after(response: httpx.Response) -> float | None:
    """The seconds a Retry-After header asks for (delta-seconds or an HTTP date), or None."""
    value = response.headers.get("retry-after", "").strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - datetime.now(UTC)).total_seconds()
    return max(0.0, seconds) if math.isfinite(seconds) else None


def asked_wait(retry_state: RetryCallState) -> float | None:
    """The Retry-After of the busy answer the last attempt got, if it sent one."""
    error = retry_state.outcome.exception() if retry_state.outcome else None
    return retry_after(error.response) if isinstance(error, Busy) else None


class wait_retry_after(wait_base):
    """Prolific's Retry-After when it sends one, else exponential back-off (1, 2, 4, ... s)."""

    def __init__(self, fallback: wait_base):
        self.fallback = fallback

    def __call__(self, retry_state: RetryCallState) -> float:
        asked = asked_wait(retry_state)
        return self.fallback(retry_state) if asked is None else asked


def asks_too_long(retry_state: RetryCallState) -> bool:
    """Stop at once when Retry-After asks longer than a call waits (honoured, not shortened)."""
    asked = asked_wait(retry_state)
    return asked is not None and asked > MAX_RETRY_AFTER


class Prolific:
    """One client per job. `retries` applies to busy answers (429; 503 unless the call must not
    be repeated), after Retry-After when given, else with exponential back-off; money calls
    (approvals, bonuses) are sent one after another by their callers."""

    def __init__(self, token: str | None = None, base_url: str | None = None, retries: int = 4):
        token = token if token is not None else settings.PROLIFIC_API_TOKEN
        if not token:
            raise NotConfigured
        self.base_url = (base_url or settings.PROLIFIC_API_URL).rstrip("/")
        self.retries = retries
        self._http = httpx.Client(
            base_url=self.base_url,
            timeout=settings.PROLIFIC_TIMEOUT,
            headers={"Authorization": f"Token {token}"},  # the only place the token is kept
        )

    def __repr__(self) -> str:  # never the token
        return f"<Prolific {self.base_url}>"

    def close(self) -> None:
        self._http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def request(self, method: str, path: str, json_body=None, params=None, url=None, repeat=True):
        """One call, retried while Prolific is busy. `repeat=False`: a call that must not be
        sent twice (paying bonuses) is retried on 429 only, which says nothing was done."""
        target = url or f"/api/v1/{path.strip('/')}/"
        busy = BUSY if repeat else {429}

        def attempt():
            try:
                response = self._http.request(method, target, json=json_body, params=params)
            except httpx.HTTPError as error:
                # No answer: the request may or may not have been done (the caller decides).
                raise ProlificError(method, target, None, type(error).__name__) from None
            if response.status_code in busy:
                raise Busy(response)
            return response

        retrying = Retrying(
            retry=retry_if_exception_type(Busy),
            stop=stop_after_attempt(self.retries + 1) | asks_too_long,
            wait=wait_retry_after(wait_exponential(multiplier=1, max=MAX_RETRY_AFTER)),
            sleep=lambda seconds: time.sleep(seconds),  # looked up per call: tests may stub it
            reraise=True,
        )
        try:
            response = retrying(attempt)
        except Busy as busy_answer:
            response = busy_answer.response
        if response.status_code >= 400:
            detail, asked = error_detail(response), retry_after(response)
            if asked is not None:
                detail += f" (Prolific asks to retry after {asked:.0f} s)"
            raise ProlificError(method, target, response.status_code, detail)
        if not response.content:
            return {}
        try:
            return response.json()
        except ValueError:
            raise ProlificError(method, target, response.status_code, "not JSON") from None

    def same_origin(self, href: str) -> httpx.URL:
        """A link from an answer, followed only on the API's own host: the token goes nowhere else."""
        url, base = httpx.URL(href), httpx.URL(self.base_url)
        if url.is_absolute_url and (url.scheme, url.host, url.port) != (
            base.scheme,
            base.host,
            base.port,
        ):
            raise ProlificError("GET", url.path, None, "a next link to another host")
        return url

    def me(self) -> dict:
        return self.request("GET", "users/me")

    # studies
    def study(self, study_id: str) -> dict:
        return self.request("GET", f"studies/{study_id}")

    def submissions(self, study_id: str, page_size: int = 200) -> Iterator[dict]:
        """Every submission of the study, following `_links.next.href` to the last page."""
        body = self.request(
            "GET", f"studies/{study_id}/submissions", params={"limit": page_size, "offset": 0}
        )
        while True:
            yield from body.get("results") or []
            href = ((body.get("_links") or {}).get("next") or {}).get("href")
            if not href:
                return
            body = self.request("GET", "", url=self.same_origin(href))

    def submission(self, submission_id: str) -> dict:
        return self.request("GET", f"submissions/{submission_id}")

    # decisions
    def transition(self, submission_id: str, action: str, **fields) -> dict:
        return self.request(
            "POST", f"submissions/{submission_id}/transition", {"action": action, **fields}
        )

    def reject(self, submission_id: str, message: str, category: str) -> dict:
        check_rejection(message, category)
        return self.transition(
            submission_id, "REJECT", message=message.strip(), rejection_category=category
        )

    def bulk_approve(self, submission_ids: list[str]) -> None:
        for start in range(0, len(submission_ids), BULK_APPROVE_MAX):
            batch = submission_ids[start : start + BULK_APPROVE_MAX]
            self.request("POST", "submissions/bulk-approve", {"submission_ids": batch})

    # bonuses: set up (pays nobody), then pay (NOT idempotent: see studies/prolific/sync.py)
    def set_up_bonuses(self, study_id: str, lines: list[tuple[str, Decimal]]) -> BonusSetup:
        csv = "\n".join(f"{who},{amount:.2f}" for who, amount in lines)
        body = self.request(
            "POST", "submissions/bonus-payments", {"study_id": study_id, "csv_bonuses": csv}
        )
        return BonusSetup(
            id=str(body["id"]),
            amount=int(body.get("amount") or 0),
            total_amount=int(body.get("total_amount") or 0),
        )

    def pay_bonuses(self, setup_id: str) -> None:
        self.request("POST", f"bulk-bonus-payments/{setup_id}/pay", repeat=False)
