"""The participant's chat over a WebSocket.

Client -> server: {"type": "message", "id": <client message id>, "text": ...}, {"type": "end"}.
Server -> client: history, ack (after the message is stored), start, delta (streamed text),
tool_calls / tool_result (cards), reply (the stored answer), status, error, redirect.
A resent message id is acknowledged again and never stored twice; if it was already
answered the stored reply is sent instead of a new one.

Hostile frames never crash the socket: a binary frame is closed 1003, a frame over
PARLEY_MAX_FRAME_BYTES 1009; anything else that is not a message we can take (not JSON, too deeply
nested, unknown type, bad id or text) is answered with an error event. A refused message carries
"drop": true so the page stops resending it; one refused for its rate ("slow down") carries
"retry": true instead.
"""

import json
import logging
import re

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.urls import reverse

from agents.llm import LLMError

from . import chat, domains, flow, ratelimit
from .models import Message, Participant

log = logging.getLogger(__name__)
CLIENT_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_FRAME_BYTES = 64 * 1024  # default for PARLEY_MAX_FRAME_BYTES; a message is far smaller


def max_frame_bytes() -> int:
    return int(getattr(settings, "PARLEY_MAX_FRAME_BYTES", MAX_FRAME_BYTES))


class ChatConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self):
        token = self.scope["url_route"]["kwargs"]["token"]
        self.participant = await database_sync_to_async(load_participant)(token)
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
        if self.participant.status != Participant.Status.CHAT:
            await self.redirect()
            return
        await self.send_json(await database_sync_to_async(snapshot)(self.participant))
        pending = await database_sync_to_async(unanswered)(self.participant)
        if pending is not None:  # the connection dropped while the agent was answering
            await self.answer(pending)
            await self.send_json(await database_sync_to_async(status)(self.participant))

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
        self.participant = await database_sync_to_async(load_participant)(self.participant.token)
        if self.participant is None:  # deleted while connected (e.g. by the researcher)
            await self.close(code=4404)
        elif self.participant.status != Participant.Status.CHAT:
            await self.redirect()
        elif kind == "message":
            await self.on_message(content)
        elif kind == "end":
            await self.on_end()
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
        if not isinstance(client_id, str) or not CLIENT_ID.match(client_id):
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
        if not ratelimit.message_allowed(self.participant.token, client[0]):
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
            stored = await database_sync_to_async(flow.store_user_message)(
                self.participant, client_id, text
            )
        except flow.FlowError as error:
            await self.refuse(client_id, error.detail)
            return
        await self.send_json(
            {
                "type": "ack",
                "id": client_id,
                "seq": stored.message.seq,
                "duplicate": not stored.created,
            }
        )
        if stored.reply is not None:
            await self.send_json(
                {"type": "reply", "reply_to": client_id, "message": stored.reply.to_client()}
            )
        elif not await self.ended_by_domain():
            await self.answer(stored.message)
        if not await self.ended_by_domain():
            await self.send_json(await database_sync_to_async(status)(self.participant))

    async def ended_by_domain(self) -> bool:
        """End the chat when the Domain says it is over (e.g. a donation was stated)."""
        reason = await database_sync_to_async(domains.end_reason)(self.participant)
        if reason is None:
            return False
        self.participant = await database_sync_to_async(flow.end_chat)(self.participant, reason)
        await self.send_json({"type": "ended", "reason": reason})
        await self.redirect()
        return True

    async def answer(self, message):
        failure = {"type": "error", "reply_to": message.client_id, "retry": True}
        try:
            await chat.agent_turn(self.participant, message, self.send_json)
        except chat.EngineStalled as stalled:
            log.warning("agent reply stalled for %s: %s", self.participant, stalled)
            notice = "The assistant has stopped answering. Your message is saved; press Retry."
            await self.send_json({**failure, "stalled": True, "message": notice})
        except Exception as error:  # any engine failure: the message is kept for Retry
            if isinstance(error, LLMError):
                log.warning("agent reply failed for %s: %s", self.participant, error)
            else:
                log.exception("agent reply failed for %s", self.participant)
            notice = "The assistant could not answer just now. Your message is saved; press Retry."
            await self.send_json({**failure, "message": notice})

    async def on_end(self):
        try:
            self.participant = await database_sync_to_async(flow.end_chat)(self.participant)
        except flow.FlowError as error:
            await self.send_json({"type": "error", "message": error.detail})
            return
        await self.redirect()

    async def redirect(self):
        url = reverse("studies:participant", args=[self.participant.token])
        await self.send_json({"type": "redirect", "url": url})


def load_participant(token) -> Participant | None:
    participant = (
        Participant.objects.select_related("study", "arm", "scenario").filter(token=token).first()
    )
    return flow.expire_if_overdue(participant) if participant else None


def unanswered(participant: Participant):
    last = participant.conversation.messages.order_by("-seq").first()
    return last if last is not None and last.role == Message.Role.USER else None


def status(participant: Participant) -> dict:
    return {"type": "status", **flow.chat_status(participant)}


def snapshot(participant: Participant) -> dict:
    messages = [m.to_client() for m in participant.conversation.messages.order_by("seq")]
    return {"type": "history", "messages": messages, **flow.chat_status(participant)}
