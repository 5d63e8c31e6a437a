"""One agent turn in a participant's chat.

The consumer calls `agent_turn`; it streams the reply through agents/llm, runs the agent's
tool calls on this conversation's own Domain state (through studies/lib/domain_bridge.py), and stores
every message before the browser hears of it.

A turn that hears nothing from the engine for PARLEY_STALL_TIMEOUT seconds (well under the
client's read timeout) ends with EngineStalled, so the page can offer Retry within seconds.
Two windows may answer the same message at once (a second tab opened mid-reply): the first
to store wins under the conversation's row lock, the other stores nothing and shows that reply.
An answer with nothing in it (no text, no call) is asked for once more (EMPTY_REPLY_RETRIES);
empty again, it is stored and the page told so (EMPTY_REPLY_NOTICE), never shown as a bubble.
"""

import asyncio
import itertools
import json
import time
from collections.abc import Awaitable, Callable

from django.conf import settings
from django.db import transaction

from agents.domains.base import Domain
from agents.domains.base import Scenario as DomainScenario
from agents.llm import LLMClient, shared_client
from studies.lib.db_threads import db
from studies.lib.domain_bridge import (
    domain_and_scenario,
    domain_of,
    system_prompt,
    system_prompt_of,
)
from studies.lib.lock_objects import lock_conversation, lock_conversation_id
from studies.lib.prepared_queries import Prepared
from studies.models import Arm, Message, Participant, next_seq

Send = Callable[[dict], Awaitable[None]]

# The least token budget of a step that must be a tool call: SmolLM2's forced tau2 airline
# calls (passengers, flights) ran past the demo arms' 96 tokens in 2 of 4 tries, and a call cut
# off is no call: its `<tool_call>` text reached the page (issue 23). The reply is then only
# the call, so the arm's max_tokens, which bounds its text, is not stretched.
FORCED_CALL_TOKENS = 384

# Pieces that arrive within this many seconds of the last delta sent travel together: a frame
# per token costs the server a write and the page a render; ten updates a second still read as
# a smooth stream, and the first piece always goes at once.
DELTA_INTERVAL = 0.1

# An answer with no text (or only whitespace) and no call is asked for again, once a turn, with
# the same request: SmolLM2 out of tool budget on demo-retail answered nothing (the "json"
# tool format strips a call written as text even when no tools are offered) and the page
# showed an empty bubble. The empty attempt is not stored: it holds nothing to keep.
EMPTY_REPLY_RETRIES = 1

# Said on the page (the "reply" event's "notice") when the stored answer has no text: the
# re-ask gave none either, and an empty bubble tells the participant nothing.
EMPTY_REPLY_NOTICE = "The assistant gave no answer. You can write your message again."


class EngineStalled(Exception):
    """The engine sent nothing for the stall timeout in the middle of a turn."""


def stall_timeout() -> float:
    # Read at each turn, not at import: a test (or a shell) may change the setting.
    return settings.PARLEY_STALL_TIMEOUT


def first_token_timeout() -> float:
    """After the stall timeout the page is told the engine is slow; only after this one is it
    a stall (a busy engine may be slow to start: prefill, a queue)."""
    return settings.PARLEY_FIRST_TOKEN_TIMEOUT


def arm_client(arm: Arm) -> LLMClient:
    """The worker's one long-lived client for the arm's endpoint on this event loop, shared by
    every turn and every arm on that endpoint (one connection pool, not one per turn)."""
    urls, _ = arm.endpoint.routing()
    return shared_client(urls, api_key=arm.endpoint.api_key(), timeout=settings.PARLEY_LLM_TIMEOUT)


def metrics(result) -> dict:
    """The one place a stored agent message gets its serving record from the client's result."""
    usage = result.usage or {}
    return {
        "model": result.model or "",
        "replica": result.replica,
        "finish_reason": result.finish_reason or "",
        "ttft_ms": round(result.ttft * 1000) if result.ttft is not None else None,
        "latency_ms": round(result.latency * 1000),
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
    }


async def agent_turn(
    participant: Participant, messages: list[Message], user_message: Message, send: Send
) -> Message | None:
    """Stream the agent's answer to `user_message`; loop over tool calls up to the Domain's cap.

    `messages` is the conversation as read when the turn began (chat_turn.Stored.messages); each
    message this turn stores is appended to it, so the only database work is storing them.
    """
    domain, scenario = domain_of(participant)
    system = system_prompt(participant)
    tools = domain.tools(scenario) if domain else []
    budget = domain.max_tool_calls_per_turn if domain else 0
    params = participant.arm.generation_params()
    reply_to = user_message.client_id
    client = arm_client(participant.arm)
    # The conversation keeps to its own replica; those the last health check found down go last.
    conversation, (_, down) = str(participant.token), participant.arm.endpoint.routing()
    # Replies of an earlier, broken turn count as this turn's; any other is another window's.
    mine = [m.pk for m in messages if m.reply_to_id == user_message.pk]
    reasks = EMPTY_REPLY_RETRIES
    for step in itertools.count():
        chat = [m.to_chat() for m in messages]
        if system:
            chat.insert(0, {"role": "system", "content": system})
        offer_tools = tools if budget > 0 else None  # out of budget: the agent must answer
        # One "start" a step: a re-ask's deltas go to the bubble the empty attempt opened.
        await send({"type": "start", "reply_to": reply_to})
        while True:
            # `async with`: a turn cut short (the browser gone) frees its connection at once
            async with client.stream_chat(
                participant.arm.model_name,
                chat,
                tools=offer_tools,
                tool_format=participant.arm.tool_format,
                conversation=conversation,
                avoid=down,
                **step_params(participant.arm, params, offer_tools, step),
            ) as stream:
                await relay(stream, send, reply_to)
            result = stream.result
            calls = result.tool_calls[:budget] if offer_tools else []
            if calls or (result.content or "").strip() or reasks == 0:
                break
            reasks -= 1  # nothing said, nothing called: asked again, this attempt unstored
        stored = await db(store_turn_message)(
            user_message,
            mine,
            role=Message.Role.ASSISTANT,
            content=result.content,
            tool_calls=calls or None,
            reply_to=user_message,
            **metrics(result),
        )
        if stored is None:  # another window answered this message first
            return await answered_elsewhere(user_message, send)
        mine.append(stored.pk)
        messages.append(stored)
        if not calls:
            await send(reply_event(reply_to, stored))
            return stored
        await send({"type": "tool_calls", "reply_to": reply_to, "message": stored.to_client()})
        for call in calls:
            result_message = await db(run_tool)(
                user_message.conversation_id, domain, scenario, call, user_message
            )
            mine.append(result_message.pk)
            messages.append(result_message)
            await send(
                {
                    "type": "tool_result",
                    "reply_to": reply_to,
                    "message": result_message.to_client(),
                }
            )
        budget -= len(calls)


def opening_requests(arm: Arm) -> list[dict]:
    """The first agent turn's request on `arm` as `agent_turn` sends it, up to the
    participant's first message: the system prompt, the tools and the greeting, one request
    per distinct opening over its study's scenarios (none for a chat that opens with nothing
    of its own). `manage.py serve_agents` has the engine prefill them before it reports ready,
    so that a conversation's first turn prefills only the participant's message."""
    study = arm.study
    rows = list(study.scenarios.filter(active=True)) or [None]
    client = LLMClient(tool_format=arm.tool_format)  # only shapes the body; sends nothing
    requests = {}
    for row in rows:
        domain, scenario = domain_and_scenario(study, row)
        if domain is not None and scenario is None:
            continue  # a Domain's study without scenarios serves no conversation yet
        system = system_prompt_of(domain, scenario, arm)
        tools = domain.tools(scenario) if domain else []
        greeting = arm.greeting or (domain.greeting(scenario) if domain else "") or ""
        if not (system or tools or greeting):
            continue
        chat = [{"role": "system", "content": system}] if system else []
        if greeting:  # stored as the conversation's first message (start.start_conversation)
            chat.append({"role": "assistant", "content": greeting})
        budget = domain.max_tool_calls_per_turn if domain else 0
        offer_tools = tools if budget > 0 else None
        params = step_params(arm, arm.generation_params(), offer_tools, 0)
        body = client.request_body(
            arm.model_name, chat, tools=offer_tools, tool_format=arm.tool_format, **params
        )
        requests[json.dumps(body, sort_keys=True)] = body
    return list(requests.values())


def step_params(arm: Arm, params: dict, offer_tools: list[dict] | None, step: int) -> dict:
    """The request parameters of one step of a reply: a tool call forced when the arm's tool
    choice asks for one at this step, with room for a whole call; no tool_choice at all when
    no tools are offered (a Domain without tools, or the budget spent), as engines refuse one
    without tools."""
    if not offer_tools:
        return {k: v for k, v in params.items() if k != "tool_choice"}
    if arm.forces_tool_call(step):
        budget = max(params.get("max_tokens") or 0, FORCED_CALL_TOKENS)
        return {**params, "tool_choice": "required", "max_tokens": budget}
    return params


async def relay(stream, send: Send, reply_to: str) -> None:
    """Pass the stream's text on as deltas: the first piece at once; a later one goes with
    those that arrived within DELTA_INTERVAL of the last delta sent (it waits at most one gap
    between the engine's pieces, and never past the reply's end).

    Any token is the engine's progress, text or a tool call that shows none (a forced call
    streams no text until it is whole): before its first token the page hears "slow" after
    the stall timeout, and EngineStalled comes after the first-token timeout; after it,
    EngineStalled comes when no token has come for the stall timeout. A Watchdog keeps that
    time beside the reading, so a piece costs one read and nothing more (a task and a wait a
    piece were 3% of the server's CPU under load: docs/results/chat_load.md)."""
    watchdog = Watchdog(stream, send, reply_to)
    sent_at, held = None, []  # sent_at: when the last delta went; None before the first
    try:
        async for delta in stream:
            await watchdog.told()  # "slow" goes out before the first delta, never after it
            now = time.monotonic()
            held.append(delta)
            if sent_at is None or now - sent_at >= DELTA_INTERVAL:
                await send({"type": "delta", "reply_to": reply_to, "text": "".join(held)})
                sent_at, held = now, []
        await watchdog.settle()
    except asyncio.CancelledError:
        # the watchdog's cancel (a stall) becomes EngineStalled; any other one goes on
        if watchdog.stalled is not None and watchdog.task.uncancel() == 0:
            raise watchdog.stalled from None
        raise
    finally:
        await watchdog.stop()
    if held:
        await send({"type": "delta", "reply_to": reply_to, "text": "".join(held)})


class Watchdog:
    """The stall and slow-start timers of one relayed reply: one timer on the event loop that,
    when it fires, looks at the time of the stream's latest token and sets itself again for
    the next deadline, tells the page "slow" once, or cancels the relaying task, noting why
    (`stalled`), so that the stream being read is closed."""

    def __init__(self, stream, send: Send, reply_to: str):
        self.stream, self.send, self.reply_to = stream, send, reply_to
        self.stall = stall_timeout()
        self.began = time.monotonic()
        self.task = asyncio.current_task()
        self.loop = asyncio.get_running_loop()
        self.told_slow = False
        self.telling: asyncio.Task | None = None  # the "slow" notice on its way
        self.stalled: EngineStalled | None = None
        self.timer = self.loop.call_later(self.stall, self.check)

    def deadline(self) -> float:
        heard = self.stream.last_token
        if heard is not None:
            return heard + self.stall
        return self.began + (first_token_timeout() if self.told_slow else self.stall)

    def check(self):
        left = self.deadline() - time.monotonic()
        if left > 0:  # a token came since the timer was set
            self.timer = self.loop.call_later(left, self.check)
        elif self.stream.last_token is not None:
            self.stop_with(EngineStalled(f"no token from the engine for {self.stall:g} s"))
        elif self.told_slow:
            timeout = first_token_timeout()
            self.stop_with(EngineStalled(f"no first token from the engine in {timeout:g} s"))
        else:
            notice = "The assistant is slow to answer just now; please wait a little."
            message = {"type": "slow", "reply_to": self.reply_to, "message": notice}
            self.telling = self.loop.create_task(self.send(message))
            self.told_slow = True
            self.check()

    def stop_with(self, error: EngineStalled):
        self.stalled = error
        self.task.cancel()

    async def settle(self):
        """At the reply's end: the timer stopped, and a "slow" notice still on its way sent
        (a reply of tool calls shows no text). A stall cannot be pending here: the timer runs
        only while the task waits, and its cancel is thrown in where the task waits."""
        self.timer.cancel()
        await self.told()

    async def told(self):
        if self.telling is not None:
            telling, self.telling = self.telling, None
            await telling

    async def stop(self):
        self.timer.cancel()
        if self.telling is not None and not self.telling.done():
            self.telling.cancel()
            await asyncio.gather(self.telling, return_exceptions=True)


def reply_event(reply_to: str, reply: Message) -> dict:
    """The page's "reply" event for a stored final answer; one without text carries
    EMPTY_REPLY_NOTICE, which the page shows in place of an empty bubble."""
    event = {"type": "reply", "reply_to": reply_to, "message": reply.to_client()}
    if not (reply.content or "").strip():
        event["notice"] = EMPTY_REPLY_NOTICE
    return event


def final_reply(user_message: Message) -> Message | None:
    return (
        user_message.replies.filter(role=Message.Role.ASSISTANT, tool_calls__isnull=True)
        .order_by("seq")
        .first()
    )


# The reply's reads, compiled once (studies/lib/prepared_queries.py).
LATER_MESSAGES = Prepared(
    lambda conversation, seq: (
        Message.objects.filter(conversation=conversation, seq__gt=seq)
        .order_by()  # unordered: only the largest seq matters
        .values_list("seq", "reply_to_id", "pk")
    ),
    2,
)


@transaction.atomic
def store_turn_message(user_message: Message, mine: list[int], **fields) -> Message | None:
    """Store this turn's agent message unless another turn already answers `user_message`
    (the conversation's row lock orders two windows' writes, on every worker); None when one
    does. One read after the lock gives both the other replies and the next seq."""
    lock_conversation_id(user_message.conversation_id)
    later = LATER_MESSAGES.rows(user_message.conversation_id, user_message.seq)
    if any(reply_to == user_message.pk and pk not in mine for _, reply_to, pk in later):
        return None
    seq = next_seq([user_message.seq, *(seq for seq, _, _ in later)])
    return Message.objects.create(conversation_id=user_message.conversation_id, seq=seq, **fields)


async def answered_elsewhere(user_message: Message, send: Send) -> Message | None:
    """Show the other turn's stored reply, or, while it is still running tools, say so."""
    reply = await db(final_reply)(user_message)
    reply_to = user_message.client_id
    if reply is not None:
        await send(reply_event(reply_to, reply))
        return reply
    await send(
        {
            "type": "error",
            "reply_to": reply_to,
            "retry": True,
            "message": "This message is being answered in another window; press Retry in a moment.",
        }
    )
    return None


def run_tool(
    conversation_id: int,
    domain: Domain,
    scenario: DomainScenario,
    call: dict,
    user_message: Message,
) -> Message:
    """Run one tool call on this conversation's own state and store its result."""
    with transaction.atomic():
        conversation = lock_conversation(conversation_id)
        state = domain.load_state(scenario, conversation.state)
        function = call.get("function", {})
        arguments = function.get("arguments") or "{}"
        output = domain.execute_tool(state, function.get("name", ""), arguments)
        if not isinstance(output, str):
            output = json.dumps(output)
        conversation.state = domain.dump_state(state)
        conversation.save(update_fields=["state"])
        return Message.objects.create(
            conversation=conversation,
            seq=conversation.next_seq(),
            role=Message.Role.TOOL,
            content=output,
            tool_call_id=call.get("id", ""),
            tool_name=function.get("name", ""),
            reply_to=user_message,
        )
