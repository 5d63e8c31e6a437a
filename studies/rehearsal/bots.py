"""Bot participants: drive a study's real flow over HTTP and WebSocket to rehearse it or load it.

A bot arrives by the Prolific link, consents, chats (canned messages, or the study Domain's
user simulator), answers the questionnaire with valid values and follows the completion
redirect, loading every page it is sent to, as a person's browser would. Its PROLIFIC_PID carries an HMAC under the study's bot key,
which only the site can make, so the server marks it a bot on arrival and a real participant
cannot. The key lives in the database, not in settings: the command line, a Celery worker and
every web worker read the same one, whatever DJANGO_SECRET_KEY each process was given.
"""

import asyncio
import hashlib
import hmac
import json
import math
import random
import re
import secrets
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlencode, urlsplit

from django.conf import settings

from studies.lib.db_threads import db
from studies.models import Item, Participant, Study

BOT_PREFIX = "BOT"
KINDS = ("scripted", "simulator")
CANNED = (
    "Hello! Could you help me with this?",
    "Thanks. Can you tell me a bit more?",
    "That makes sense. What would you suggest next?",
    "Great, thank you for your help.",
)
OPEN_CHAT_USER = (
    "You are a participant in a research study, chatting with an assistant. Write short, "
    "natural messages as a curious person would; ask questions and react to the answers."
)
CSRF = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


# --- marking ---------------------------------------------------------------------------------


def signature(study: Study, nonce: str) -> str:
    """The study-specific HMAC of a bot's nonce, keyed by the study's stored bot key."""
    if not study.bot_key:  # an empty key would let anyone sign
        raise ValueError(f"study {study.slug!r} has no bot key")
    message = f"parley-bot:{study.slug}:{nonce}".encode()
    return hmac.new(study.bot_key.encode(), message, hashlib.sha256).hexdigest()[:20]


def bot_pid(study: Study, nonce: str | None = None) -> str:
    nonce = nonce or secrets.token_hex(5)
    return f"{BOT_PREFIX}{nonce}-{signature(study, nonce)}"


def is_bot_pid(study: Study, pid: str) -> bool:
    if not study.bot_key or not pid.startswith(BOT_PREFIX) or "-" not in pid:
        return False
    nonce, _, signed = pid[len(BOT_PREFIX) :].partition("-")
    return hmac.compare_digest(signed, signature(study, nonce))


# --- what a bot needs to know of its study -----------------------------------------------------


@dataclass
class Answer:
    key: str
    kind: str
    points: int
    low: float | None
    high: float | None
    expected: str

    def value(self, rng: random.Random) -> str:
        """A valid answer: any point of a scale, the expected point of an attention check."""
        if self.kind == Item.Kind.ATTENTION:
            return self.expected
        if self.kind == Item.Kind.LIKERT:
            return str(rng.randint(1, self.points))
        if self.kind == Item.Kind.NUMBER:
            low = self.low if self.low is not None else 0.0
            high = self.high if self.high is not None else low + 10
            return f"{rng.uniform(low, high):.2f}"
        return "Answered by a bot participant."


@dataclass
class Plan:
    """A study as the bots see it, read once from the database."""

    slug: str
    study_id: str
    turns: int
    completion_code: str
    answers: list[Answer]
    pid: Callable[[], str]
    rating: bool = False  # an annotation study: rate each conversation instead of chatting
    realism: bool = False

    @classmethod
    def of(cls, study: Study, turns: int | None = None) -> "Plan":
        answers = [
            Answer(i.key, i.kind, i.scale_points, i.min_value, i.max_value, i.expected_answer)
            for i in study.questionnaire_items()
        ]
        turns = turns or max(study.min_exchanges, 1)
        return cls(
            slug=study.slug,
            study_id=study.prolific_study_id or "BOTSTUDY",
            turns=min(turns, study.max_exchanges),
            completion_code=study.completion_code,
            answers=answers,
            pid=lambda: bot_pid(study),
            rating=hasattr(study, "annotation"),
            realism=hasattr(study, "annotation") and study.annotation.ask_realism,
        )


# --- the participant's other side: canned text or a user simulator ---------------------------


class Scripted:
    def __init__(self, rng: random.Random):
        self.rng = rng

    async def next_message(self, token: str, conversation: list[dict], turn: int, last: bool):
        return CANNED[turn % len(CANNED)]

    async def close(self):
        pass


class Simulated:
    """The study Domain's user simulator (PlainSimulator on the engine) plays the participant,
    with the Domain's simulator prompt for this participant's scenario."""

    def __init__(self, engine_url: str | None = None):
        from agents.llm import LLMClient

        self.client = LLMClient(engine_url or settings.PARLEY_ENGINE_URL, timeout=120)

    async def next_message(self, token: str, conversation: list[dict], turn: int, last: bool):
        from agents.simulators import PlainSimulator, user_view

        domain, scenario, model = await db(_simulated_user)(token)
        simulator = PlainSimulator(self.client, model, temperature=0.8, max_tokens=80)
        if domain is None:
            messages = [{"role": "system", "content": OPEN_CHAT_USER}, *user_view(conversation)]
            turn_ = await simulator.answer(messages, None)
        else:
            choices = domain.user_choices(scenario, conversation, last)
            turn_ = await simulator.reply(domain, scenario, conversation, choices)
        return turn_.text.strip() or CANNED[turn % len(CANNED)]

    async def close(self):
        await self.client.aclose()


def _simulated_user(token: str):
    from studies.lib.domain_bridge import domain_of

    participant = Participant.objects.select_related("study", "arm", "scenario").get(token=token)
    domain, scenario = domain_of(participant)
    return domain, scenario, participant.arm.model_name


# --- one bot ---------------------------------------------------------------------------------


@dataclass
class BotRun:
    pid: str
    token: str = ""
    completed: bool = False
    code: str = ""
    error: str = ""
    ttft: list[float] = field(default_factory=list)  # seconds from send to first streamed text
    reply: list[float] = field(default_factory=list)  # seconds from send to the stored reply


class BotFailed(Exception):
    pass


def csrf_of(page) -> str:
    """The form's CSRF token on a page (an httpx response); a page that is no 200 says its
    status, which "no form" would hide (a server error, a retry page)."""
    if page.status_code != 200:
        raise BotFailed(f"{page.url.path} answered {page.status_code}")
    match = CSRF.search(page.text)
    if not match:
        raise BotFailed(f"no form on {page.url.path}")
    return match.group(1)


async def one_bot(plan: Plan, url: str, player, rng: random.Random, think=(0.0, 0.0)) -> BotRun:
    import httpx

    run = BotRun(pid=plan.pid())
    params = {
        "PROLIFIC_PID": run.pid,
        "STUDY_ID": plan.study_id,
        "SESSION_ID": secrets.token_hex(8),
    }
    # A connection idle for 4 s is not reused: uvicorn closes idle ones at 5 s, and a request
    # sent on one as it closes fails ("Server disconnected") where a browser would resend it.
    limits = httpx.Limits(keepalive_expiry=4.0)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http:
        try:
            arrived = await http.get(f"/s/{plan.slug}/?{urlencode(params)}")
            if arrived.status_code != 302:
                raise BotFailed(f"arrival answered {arrived.status_code}")
            page = arrived.headers["location"]
            run.token = page.rstrip("/").rsplit("/", 1)[-1]
            consent = await http.get(page)
            decision = {"decision": "accept", "csrfmiddlewaretoken": csrf_of(consent)}
            accepted = await http.post(f"{page}consent/", data=decision)
            if accepted.status_code != 302:
                raise BotFailed(f"consent was not accepted: answered {accepted.status_code}")
            if plan.rating:
                await rate(plan, http, page, rng)
            else:
                await shown(http, page)  # the chat page, which then opens the socket
                await chat(plan, url, run, player, rng, think)
                form = await http.get(page)
                answers = {a.key: a.value(rng) for a in plan.answers}
                answers["csrfmiddlewaretoken"] = csrf_of(form)
                submitted = await http.post(f"{page}questionnaire/", data=answers)
                if submitted.status_code != 302:
                    raise BotFailed(f"questionnaire answered {submitted.status_code}")
            await shown(http, page)  # the debrief page, whose button leads to done/
            done = await http.get(f"{page}done/")
            location = done.headers.get("location", "")
            run.code = parse_qs(urlsplit(location).query).get("cc", [""])[0]
            if done.status_code != 302 or not run.code:
                raise BotFailed("no completion code")
            run.completed = True
        except Exception as error:  # noqa: BLE001 - any failure is this bot's, counted, not the run's
            run.error = f"{type(error).__name__}: {error}"
    return run


async def shown(http, page: str) -> None:
    """A page the browser is sent to: it must answer 200 (a bot that skipped it would cost the
    server less than a person does)."""
    answered = await http.get(page)
    if answered.status_code != 200:
        raise BotFailed(f"{page} answered {answered.status_code}")


POSITION = re.compile(r'name="position" value="(\d+)"')


async def rate(plan: Plan, http, page: str, rng: random.Random) -> None:
    """An annotation study's rater: every conversation shown gets valid answers (a bot cannot
    know a gold conversation's, so it may fail that check, as a careless person would)."""
    for _ in range(1000):  # far above any n: a page that never moves on is a failure
        form = await http.get(page)
        position = POSITION.search(form.text)
        if position is None:
            return
        answers = {a.key: a.value(rng) for a in plan.answers}
        if plan.realism:
            answers |= {
                "real_person": rng.choice(["real", "simulated"]),
                "realism_confidence": str(rng.randint(1, 5)),
            }
        answers |= {"position": position[1], "csrfmiddlewaretoken": csrf_of(form)}
        rated = await http.post(f"{page}rate/", data=answers)
        if rated.status_code != 302:
            raise BotFailed(f"rating answered {rated.status_code}")
    raise BotFailed("the rating pages never ended")


async def chat(plan: Plan, url: str, run: BotRun, player, rng: random.Random, think) -> None:
    """The chat page's side of the WebSocket: send, wait for the stored reply, end."""
    import websockets

    ws_url = url.replace("http", "ws", 1).rstrip("/") + f"/ws/p/{run.token}/"
    async with websockets.connect(ws_url, origin=url.rstrip("/"), open_timeout=30) as socket:
        history = await receive(socket, "history")
        conversation = [
            {"role": m["role"], "content": m["content"]}
            for m in history["messages"]
            if m["role"] in ("user", "assistant")
        ]
        for turn in range(plan.turns):
            if think[1] > 0:  # a person reads the page, then the reply, before typing
                await asyncio.sleep(rng.uniform(*think))
            text = await player.next_message(run.token, conversation, turn, turn == plan.turns - 1)
            conversation.append({"role": "user", "content": text})
            sent = time.perf_counter()
            await socket.send(json.dumps({"type": "message", "id": f"b{turn}", "text": text}))
            first = None
            while True:
                event = await receive(socket)
                if event["type"] == "delta" and first is None:
                    first = time.perf_counter() - sent
                elif event["type"] == "reply":
                    run.reply.append(time.perf_counter() - sent)
                    run.ttft.append(first if first is not None else run.reply[-1])
                    conversation.append(
                        {"role": "assistant", "content": event["message"]["content"]}
                    )
                elif event["type"] == "status":
                    break
                elif event["type"] == "redirect":  # the Domain ended the chat
                    return
        await socket.send('{"type": "end"}')
        await receive(socket, "redirect")


async def receive(socket, kind: str | None = None, timeout: float = 180) -> dict:
    """The next event (of `kind`, skipping others); an error event fails the bot."""
    while True:
        event = json.loads(await asyncio.wait_for(socket.recv(), timeout))
        if event.get("type") in ("error", "superseded"):
            raise BotFailed(f"chat {event['type']}: {event.get('message')}")
        if kind is None or event.get("type") == kind:
            return event


# --- a run of many bots ------------------------------------------------------------------------


def percentiles(values: list[float]) -> dict[str, float | None]:
    """p50, p95, p99 in milliseconds (nearest rank), None when nothing was measured."""
    ordered = sorted(values)
    if not ordered:
        return {"p50": None, "p95": None, "p99": None}

    def rank(q):
        return round(ordered[max(math.ceil(q * len(ordered) / 100) - 1, 0)] * 1000, 1)

    return {"p50": rank(50), "p95": rank(95), "p99": rank(99)}


@dataclass
class Report:
    runs: list[BotRun]
    arms: dict[str, int]
    seconds: float

    @property
    def completed(self) -> int:
        return sum(r.completed for r in self.runs)

    @property
    def failed(self) -> int:
        return len(self.runs) - self.completed

    def to_dict(self) -> dict:
        return {
            "bots": len(self.runs),
            "completed": self.completed,
            "failed": self.failed,
            "arms": self.arms,
            "codes": dict(Counter(r.code for r in self.runs if r.code)),
            "turns": sum(len(r.reply) for r in self.runs),
            "ttft_ms": percentiles([t for r in self.runs for t in r.ttft]),
            "reply_ms": percentiles([t for r in self.runs for t in r.reply]),
            "errors": dict(Counter(r.error for r in self.runs if r.error)),
            "seconds": round(self.seconds, 2),
        }

    def text(self) -> str:
        d = self.to_dict()
        lines = [
            f"{d['completed']} completed, {d['failed']} failed of {d['bots']} bots "
            f"in {d['seconds']} s ({d['turns']} chat turns)",
            "per arm: " + (", ".join(f"{a}: {n}" for a, n in d["arms"].items()) or "-"),
        ]
        for name in ("ttft_ms", "reply_ms"):
            p = d[name]
            label = "first token" if name == "ttft_ms" else "whole reply"
            lines.append(f"{label} (ms): p50 {p['p50']}  p95 {p['p95']}  p99 {p['p99']}")
        lines += [f"error x{n}: {error}" for error, n in d["errors"].items()]
        return "\n".join(lines)


def arm_counts(tokens: list[str]) -> dict[str, int]:
    arms = Participant.objects.filter(token__in=[t for t in tokens if t]).values_list(
        "arm__name", flat=True
    )
    return dict(sorted(Counter(arms).items()))


async def drive(
    plan: Plan,
    n: int,
    concurrency: int,
    url: str,
    kind: str = "scripted",
    think=(0.0, 0.0),
    progress: bool = False,
    seed: int | None = None,
    player=None,
) -> Report:
    """Run `n` bots, at most `concurrency` at once, against the server at `url`."""
    rng = random.Random(seed)
    player = player or (Simulated() if kind == "simulator" else Scripted(rng))
    gate = asyncio.Semaphore(concurrency)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=n, unit="bot", desc=plan.slug)

    async def bot(i):
        async with gate:
            run = await one_bot(plan, url, player, random.Random(rng.random()), think)
        if bar is not None:
            bar.update()
            bar.set_postfix(failed=sum(1 for r in done if not r.completed) + (not run.completed))
        done.append(run)
        return run

    done: list[BotRun] = []
    started = time.perf_counter()
    try:
        runs = await asyncio.gather(*(bot(i) for i in range(n)))
    finally:
        await player.close()
        if bar is not None:
            bar.close()
    arms = await db(arm_counts)([r.token for r in runs])
    return Report(list(runs), arms, time.perf_counter() - started)


def run_bots(
    study: Study,
    n: int,
    concurrency: int,
    url: str | None = None,
    kind: str = "scripted",
    **options,
) -> Report:
    """The synchronous entry of the command and the Celery task."""
    plan = Plan.of(study, options.pop("turns", None))
    return asyncio.run(drive(plan, n, concurrency, url or settings.PUBLIC_URL, kind, **options))
