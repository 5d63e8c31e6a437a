"""A local fake of Prolific's researcher API with the documented shapes (../shared/reference/
prolific.md): a real HTTP server in a thread that records every call, keeps submissions and
bonus set-ups, and can be told to fail around the bonus pay call or to answer busy (429, 503,
with or without Retry-After)."""

import csv
import io
import time
import uuid

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agents.serving.process import free_port
from tests.support.scripted_server import ThreadedServer

CATEGORIES = {
    "TOO_QUICKLY",
    "TOO_SLOWLY",
    "FAILED_INSTRUCTIONS",
    "INCOMP_LONGITUDINAL",
    "FAILED_CHECK",
    "LOW_EFFORT",
    "MALINGERING",
    "NO_CODE",
    "BAD_CODE",
    "NO_DATA",
    "UNSUPP_DEVICE",
    "OTHER",
}


def error(status: int, detail: str) -> JSONResponse:
    body = {"error": {"status": status, "title": "Error", "error_code": status, "detail": detail}}
    return JSONResponse(body, status_code=status)


class FakeProlific(ThreadedServer):
    def __init__(self, token: str = "fake-token-123"):
        self.token = token
        self.studies: dict[str, dict] = {}
        self.submissions: dict[str, dict] = {}
        self.setups: dict[str, dict] = {}
        self.calls: list[tuple[str, str, dict | None]] = []
        self.pays: list[str] = []  # setup ids, once per pay call that paid
        # "after": pay, then answer 500 (as if the answer was lost); "before": 500, not paid
        self.pay_fault: str | None = None
        # statuses the next requests answer (e.g. 429), in order; (status, Retry-After) sends
        # the header too
        self.fail_next: list[int | tuple[int, str]] = []
        self.times: list[float] = []  # time.monotonic() of each call, beside `calls`
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        routes = [
            Route("/api/v1/users/me{s:path}", self.me),
            Route("/api/v1/studies/{study}/submissions{s:path}", self.list_submissions),
            Route("/api/v1/studies/{study}{s:path}", self.study),
            Route("/api/v1/submissions/bulk-approve{s:path}", self.bulk_approve, methods=["POST"]),
            Route("/api/v1/submissions/bonus-payments{s:path}", self.set_up, methods=["POST"]),
            Route(
                "/api/v1/submissions/{sid}/transition{s:path}", self.transition, methods=["POST"]
            ),
            Route("/api/v1/submissions/{sid}{s:path}", self.submission),
            Route("/api/v1/bulk-bonus-payments/{bid}/pay{s:path}", self.pay, methods=["POST"]),
        ]
        self.server = uvicorn.Server(
            uvicorn.Config(Starlette(routes=routes), port=self.port, log_level="warning")
        )

    # --- the researcher's data ----------------------------------------------------------------
    def add_study(self, study_id: str, minutes: int = 10):
        self.studies[study_id] = {
            "id": study_id,
            "status": "ACTIVE",
            "estimated_completion_time": minutes,
            "maximum_allowed_time": 2 * minutes + 10,
            "reward": 300,
        }

    def add_submission(self, sid: str, pid: str, study_id: str, status: str = "ACTIVE"):
        self.submissions[sid] = {
            "id": sid,
            "participant_id": pid,
            "study_id": study_id,
            "status": status,
            "started_at": "2026-01-01T10:00:00Z",
            "completed_at": None,
            "study_code": "",
            "return_requested": None,
            "time_taken": 300,
            "reward": 300,
            "bonus_payments": [],
            "ip": "127.0.0.1",
            "entered_code": "",
        }

    def called(self, method: str, fragment: str) -> list:
        return [c for c in self.calls if c[0] == method and fragment in c[1]]

    # --- endpoints ----------------------------------------------------------------------------
    async def check(self, request: Request):
        body = await request.json() if await request.body() else None
        self.calls.append((request.method, request.url.path, body))
        self.times.append(time.monotonic())
        if request.headers.get("authorization") != f"Token {self.token}":
            return None, error(401, "Invalid token")
        if self.fail_next:
            status, after = self.fail_next.pop(0), None
            if isinstance(status, tuple):
                status, after = status
            headers = {"Retry-After": after} if after is not None else None
            body = {"message": "slow down", "detail": str(status)}
            return None, JSONResponse(body, status, headers=headers)
        return body, None

    async def me(self, request):
        _, refused = await self.check(request)
        return refused or JSONResponse({"id": "researcher1", "email": "r@example.org"})

    async def study(self, request):
        _, refused = await self.check(request)
        study = self.studies.get(request.path_params["study"])
        return refused or (JSONResponse(study) if study else error(404, "No such study"))

    async def list_submissions(self, request):
        _, refused = await self.check(request)
        if refused:
            return refused
        study = request.path_params["study"]
        rows = [s for s in self.submissions.values() if s["study_id"] == study]
        limit = int(request.query_params.get("limit", 20))
        offset = int(request.query_params.get("offset", 0))
        page = rows[offset : offset + limit]
        base = f"{self.url}/api/v1/studies/{study}/submissions/"
        more = offset + limit < len(rows)
        items = [{k: v for k, v in s.items() if k != "study_id"} for s in page]
        return JSONResponse(
            {
                "results": items,
                "_links": {
                    "self": {"href": f"{base}?limit={limit}&offset={offset}"},
                    "next": {
                        "href": f"{base}?limit={limit}&offset={offset + limit}" if more else None
                    },
                },
                "meta": {"count": len(rows)},
            }
        )

    async def submission(self, request):
        _, refused = await self.check(request)
        if refused:
            return refused
        row = self.submissions.get(request.path_params["sid"])
        if row is None:
            return error(404, "No such submission")
        detail = {k: v for k, v in row.items() if k != "participant_id"}
        return JSONResponse({**detail, "participant": row["participant_id"]})

    async def transition(self, request):
        body, refused = await self.check(request)
        if refused:
            return refused
        row = self.submissions.get(request.path_params["sid"])
        if row is None:
            return error(404, "No such submission")
        action = (body or {}).get("action")
        if action == "REJECT":
            if len(body.get("message") or "") < 100:
                return error(400, "message must be at least 100 characters")
            if body.get("rejection_category") not in CATEGORIES:
                return error(400, "invalid rejection_category")
        target = {"APPROVE": "APPROVED", "REJECT": "REJECTED"}.get(action)
        if target is None:
            return error(400, f"unknown action {action}")
        if row["status"] == target:
            return JSONResponse(row)  # a repeated transition is ignored
        if row["status"] != "AWAITING REVIEW":
            return error(400, f"cannot {action} a submission {row['status']}")
        row["status"] = target
        return JSONResponse(row)

    async def bulk_approve(self, request):
        body, refused = await self.check(request)
        if refused:
            return refused
        for sid in body.get("submission_ids", []):
            row = self.submissions.get(sid)
            if row and row["status"] == "AWAITING REVIEW":
                row["status"] = "APPROVED"
        return JSONResponse({}, status_code=202)

    async def set_up(self, request):
        body, refused = await self.check(request)
        if refused:
            return refused
        study, lines, unknown = body.get("study_id"), [], []
        for who, amount in csv.reader(io.StringIO(body.get("csv_bonuses", ""))):
            row = next(
                (
                    s
                    for s in self.submissions.values()
                    if s["study_id"] == study and who in (s["participant_id"], s["id"])
                ),
                None,
            )
            if row is None:
                unknown.append(who)
            lines.append((row, round(float(amount) * 100)))
        if unknown:
            return error(400, f"These ids did not take part: {', '.join(unknown)}")
        setup_id = uuid.uuid4().hex[:24]
        amount = sum(pence for _, pence in lines)
        self.setups[setup_id] = {"study": study, "lines": lines}
        fees = round(amount * 0.33)
        return JSONResponse(
            {
                "id": setup_id,
                "study": study,
                "amount": amount,
                "fees": fees,
                "vat": 0,
                "total_amount": amount + fees,
            },
            status_code=201,
        )

    async def pay(self, request):
        _, refused = await self.check(request)
        if refused:
            return refused
        setup = self.setups.get(request.path_params["bid"])
        if setup is None:
            return error(404, "No such bulk bonus payment")
        if self.pay_fault == "before":
            return error(500, "internal error")
        for row, pence in setup["lines"]:  # NOT idempotent: a second call pays again
            row["bonus_payments"].append(pence)
        self.pays.append(request.path_params["bid"])
        if self.pay_fault == "after":
            return error(500, "internal error")
        return Response(status_code=202)
