"""The participant's chat over a WebSocket.

Client -> server: {"type": "message", "id": <client message id>, "text": ...}, {"type": "end"},
{"type": "withdraw"} (stop taking part: the chat ends, the page moves on to ask about the data).
Server -> client: history, ack (after the message is stored), start, delta (streamed text),
tool_calls / tool_result (cards), reply (the stored answer), status, error, redirect.
A resent message id is acknowledged again and never stored twice; if it was already
answered the stored reply is sent instead of a new one.

Hostile frames never crash the socket: a binary frame is closed 1003, a frame over
PARLEY_MAX_FRAME_BYTES 1009; anything else that is not a message we can take (not JSON, too deeply
nested, unknown type, bad id or text) is answered with an error event. A refused message carries
"drop": true so the page stops resending it; one refused for its rate ("slow down") carries
"retry": true instead.

PostgreSQL unreachable is said at once, with Retry (on connecting: close 1013, and the page comes
back); a tab closed mid-reply stops the turn quietly, and its message is answered on return.
"""

import json
import logging
import re
import traceback
import uuid
from dataclasses import dataclass

from channels.consumer import get_handler_name
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.db.models import prefetch_related_objects
from django.urls import reverse

from agents.llm import LLMError
from studies.chat import agent_turn
from studies.lib import domain_bridge
from studies.lib.db_threads import db
from studies.lib.flow_errors import FlowError
from studies.lib.prepared_queries import Prepared
from studies.models import Conversation, Message, Participant
from studies.participation import problems, ratelimit, withdraw
from studies.participation.chat_turn import (
    ChatOver,
    chat_status,
    end_chat,
    expire_if_overdue,
    store_user_message,
)
from studies.participation.middleware import OUTAGE

log = logging.getLogger(__name__)
CLIENT_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")  # fullmatch: `$` would let "abc\n" through


def max_frame_bytes() -> int:
    return settings.PARLEY_MAX_FRAME_BYTES


class Left(Exception):
    """The participant's socket closed while we were sending (the tab closed mid-reply)."""


NOT_SAVED = (
    "The study's database is briefly unavailable, so your last message could not be saved "
    "with its answer. Please press Retry in a moment."
)


class ChatConsumer(AsyncJsonWebsocketConsumer):
    """One participant's socket. The participant, with study, arm and scenario, is read at
    connect and then kept: each message re-reads only its status under the conversation's lock
    (chat_turn.store_user_message), so a turn costs two transactions (the message, the reply)."""

    stale = False

    async def dispatch(self, message):
        """As Channels' own, without its `close_old_connections` before every handler: that is
        a hop to Channels' one sync thread for each frame, and this consumer's database work
        (studies/threads.db) gives its connections back itself. PARLEY_LEAN_CHAT_DISPATCH=0
        runs Channels' own (the way out if a Channels upgrade changes what this copies)."""
        try:
            if not settings.PARLEY_LEAN_CHAT_DISPATCH:
                await super().dispatch(message)
                return
            handler = getattr(self, get_handler_name(message), None)
            if handler is None:
                raise ValueError(f"No handler for message type {message['type']}")
            await handler(message)
        except Left:  # a normal event: the disconnect that follows ends the consumer
            who = getattr(getattr(self, "participant", None), "pk", None)
            log.info("participant #%s left mid-turn", who)

    async def send_json(self, content, close=False):
        """Every event out; a socket closed meanwhile is Left, not a server error (uvicorn
        raises its ClientDisconnected, an OSError, only for this)."""
        try:
            await super().send_json(content, close=close)
        except OSError as gone:
            raise Left from gone

    async def connect(self):
        token = self.scope["url_route"]["kwargs"]["token"]
        try:
            self.participant, opening = await db(open_chat)(token)
        except OUTAGE as error:  # the page reconnects by itself, as after any close
            log.warning("chat not opened, database unavailable: %s", error)
            await self.accept()
            await self.close(code=1013)  # try again later
            return
        if self.participant is None:
            await self.close(code=4404)
            return
        await self.accept()
        # One live window per participant: an older one (on any server) is told to stop.
        self.group = f"participant-{self.participant.pk}"
        await self.channel_layer.group_send(
            self.group, {"type": "chat.superseded", "by": self.channel_name}
        )
        await self.channel_layer.group_add(self.group, self.channel_name)
        if opening is None:  # not in the chat (yet, or any more)
            await self.redirect()
            return
        await self.send_json(opening.history)
        if opening.pending is not None:  # the connection dropped while the agent was answering
            await self.answer(opening.messages, opening.pending)  # adds the reply
            if await self.ended_by_domain(opening.messages):
                return
            await self.send_json(await db(status)(self.participant))

    async def disconnect(self, code):
        if getattr(self, "group", None):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def chat_superseded(self, event):
        if event["by"] != self.channel_name:
            await self.send_json(
                {"type": "superseded", "message": "This chat continues in another window."}
            )
            await self.close(code=4409)

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        if text_data is None:  # the protocol is JSON text; binary is unsupported data
            await self.close(code=1003)
            return
        if len(text_data) > max_frame_bytes() or (
            len(text_data.encode("utf-8", "surrogatepass")) > max_frame_bytes()
        ):
            await self.close(code=1009)
            return
        try:
            content = json.loads(text_data)
        except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser goes
            await self.send_json({"type": "error", "message": "That frame was not valid JSON."})
            return
        await self.receive_json(content)

    async def receive_json(self, content, **kwargs):
        kind = content.get("type") if isinstance(content, dict) else None
        if kind == "message":
            await self.on_message(content)
        elif kind == "end":
            await self.on_end()
        elif kind == "withdraw":
            await self.on_withdraw()
        else:
            shown = repr(kind)[:40] if isinstance(kind, str) else type(kind).__name__
            await self.send_json({"type": "error", "message": f"Unknown message type {shown}."})

    async def refuse(self, client_id: str, detail: str):
        """An error for a message that will never be taken: the page drops it from its queue."""
        await self.send_json(
            {"type": "error", "reply_to": client_id, "drop": True, "message": detail}
        )

    async def on_message(self, content):
        client_id, text = content.get("id"), content.get("text")
        if not isinstance(client_id, str) or not CLIENT_ID.fullmatch(client_id):
            await self.send_json(
                {
                    "type": "error",
                    "message": "Each message needs an id of 1-64 letters, digits, - or _.",
                }
            )
            return
        if not isinstance(text, str):
            await self.refuse(client_id, "The message needs text.")
            return
        client = self.scope.get("client") or [None]
        if not await ratelimit.message_allowed_async(self.participant.token, client[0]):
            await self.send_json(
                {
                    "type": "error",
                    "reply_to": client_id,
                    "retry": True,
                    "message": "Please slow down: too many messages in a minute. "
                    "Wait a moment, then press Retry.",
                }
            )
            return
        try:
            if self.stale:
                self.participant = await db(load_participant)(self.participant.token)
                self.stale = False
            if self.participant is None:
                raise Participant.DoesNotExist
            stored = await db(store_user_message)(self.participant, client_id, text)
        except OUTAGE as error:  # not acknowledged: the page keeps it for Retry
            log.warning("message not stored for %s, database unavailable: %s", client_id, error)
            await self.send_json(
                {"type": "error", "reply_to": client_id, "retry": True, "message": NOT_SAVED}
            )
            return
        except (Participant.DoesNotExist, Conversation.DoesNotExist):  # deleted meanwhile
            await self.close(code=4404)
            return
        except ChatOver as over:  # ended or timed out: say why, then the page moves on
            # Not "drop": the redirect right after finds the message unsent and tells the next
            # page, which says why the message was not taken.
            await self.send_json({"type": "error", "reply_to": client_id, "message": over.detail})
            await self.redirect()
            return
        except FlowError as error:
            await self.refuse(client_id, error.detail)
            return
        self.participant = stored.participant
        await self.send_json(
            {
                "type": "ack",
                "id": client_id,
                "seq": stored.message.seq,
                "duplicate": not stored.created,
            }
        )
        if stored.reply is not None:
            await self.send_json(agent_turn.reply_event(client_id, stored.reply))
        elif await self.ended_by_domain(stored.messages):
            return
        else:
            await self.answer(stored.messages, stored.message)  # adds the turn's messages
            if await self.ended_by_domain(stored.messages):
                return
        await self.send_json({"type": "status", **chat_status(self.participant, stored.sent)})

    async def ended_by_domain(self, messages: list[Message]) -> bool:
        """End the chat when the Domain says it is over (e.g. a donation was stated)."""
        reason = domain_bridge.end_reason(self.participant, messages)
        if reason is None:
            return False
        self.participant = await db(end_chat)(self.participant, reason)
        await self.send_json({"type": "ended", "reason": reason})
        await self.redirect()
        return True

    async def answer(self, messages: list[Message], message: Message) -> Message | None:
        failure = {"type": "error", "reply_to": message.client_id, "retry": True}
        try:
            return await agent_turn.agent_turn(self.participant, messages, message, self.send_json)
        except Left:
            raise  # the tab closed: the reply stops; the message is answered on reconnecting
        except OUTAGE as error:
            # The streamed reply could not be stored: the page takes it back and offers Retry
            # at once. Recording the problem would only wait on the same database.
            log.warning(
                "reply not stored for participant #%s, database unavailable: %s",
                self.participant.pk,
                error,
            )
            self.stale = True
            await self.send_json({**failure, "message": NOT_SAVED})
        except agent_turn.EngineStalled as stalled:
            log.warning("agent reply stalled for participant #%s: %s", self.participant.pk, stalled)
            await self.failed("The agent stalled", stalled)
            notice = "The assistant has stopped answering. Your message is saved; press Retry."
            await self.send_json({**failure, "stalled": True, "message": notice})
        except Exception as error:  # any engine failure: the message is kept for Retry
            if isinstance(error, LLMError):
                log.warning(
                    "agent reply failed for participant #%s: %s", self.participant.pk, error
                )
            else:
                log.exception("agent reply failed for participant #%s", self.participant.pk)
            await self.failed("The agent could not answer", error)
            notice = "The assistant could not answer just now. Your message is saved; press Retry."
            await self.send_json({**failure, "message": notice})
        return None

    async def failed(self, title: str, error: Exception) -> None:
        """Keep an engine failure where the researcher sees it (the monitor), with its cause;
        the participant is read whole again before the next message, so a Retry meets an arm
        the researcher has fixed meanwhile (another endpoint, another model)."""
        arm = self.participant.arm
        detail = f"Arm {arm.name} ({arm.model_name} on endpoint {arm.endpoint.name}): {error}"
        trace = (
            "" if isinstance(error, LLMError | agent_turn.EngineStalled) else traceback.format_exc()
        )
        await db(problems.record)(
            self.participant.study,
            self.participant,
            self.scope["path"],
            FlowError(title, detail),
            trace,
        )
        self.stale = True

    async def on_end(self):
        try:
            self.participant = await db(end_chat)(self.participant)
        except OUTAGE as error:
            log.warning("chat not ended, database unavailable: %s", error)
            notice = "The chat could not be ended just now; please try again in a moment."
            await self.send_json({"type": "error", "message": notice})
            return
        except FlowError as error:
            await self.send_json({"type": "error", "message": error.detail})
            return
        await self.redirect()

    async def on_withdraw(self):
        """Stop taking part: the conversation ends now, the page goes on to the question about
        the data, and this socket closes cleanly (1000), as the chat is over."""
        try:
            await db(withdraw.withdraw)(self.participant)
        except OUTAGE as error:
            log.warning("withdrawal not stored, database unavailable: %s", error)
            notice = "Stopping did not go through just now; please try again in a moment."
            await self.send_json({"type": "error", "message": notice})
            return
        except FlowError as error:
            await self.send_json({"type": "error", "message": error.detail})
            return
        await self.send_json({"type": "withdrawn"})
        await self.redirect()
        await self.close(code=1000)

    async def redirect(self):
        url = reverse("studies:participant", args=[self.participant.token])
        await self.send_json({"type": "redirect", "url": url})


@dataclass
class Opening:
    history: dict  # the "history" event
    messages: list[Message]
    pending: Message | None  # the participant's last message, when it has no reply yet


# Compiled once (studies/lib/prepared_queries.py): each chat opens with it.
PARTICIPANT = Prepared(
    lambda token: Participant.objects.select_related("study", "arm__endpoint", "scenario").filter(
        token=token
    ),
    1,
    kinds=(uuid.UUID,),
)


def load_participant(token) -> Participant | None:
    # The arm's endpoint and its replicas come along: every turn picks a replica from them.
    try:
        key = uuid.UUID(str(token))
    except ValueError:
        return None
    found = PARTICIPANT.objects(key)
    if not found:
        return None
    prefetch_related_objects(found, "arm__endpoint__replicas")
    return found[0]


def open_chat(token) -> tuple[Participant | None, Opening | None]:
    """The participant of this token (None if there is none) and, while they are in the chat,
    what the page is shown on connecting."""
    participant = load_participant(token)
    if participant is None:
        return None, None
    participant = expire_if_overdue(participant)
    if participant.status != Participant.Status.CHAT:
        return participant, None
    messages = list(Message.objects.filter(conversation__participant=participant).order_by("seq"))
    sent = sum(m.role == Message.Role.USER for m in messages)
    history = {
        "type": "history",
        "messages": [m.to_client() for m in messages],
        **chat_status(participant, sent),
    }
    last = messages[-1] if messages else None
    pending = last if last is not None and last.role == Message.Role.USER else None
    return participant, Opening(history, messages, pending)


def status(participant: Participant) -> dict:
    return {"type": "status", **chat_status(participant)}
