"""One agent turn in a participant's chat.

The consumer calls `agent_turn`; it streams the reply through agents/llm, runs the agent's
tool calls on this conversation's own Domain state (through studies/domains.py), and stores
every message before the browser hears of it.
"""

import json
from collections.abc import Awaitable, Callable

from channels.db import database_sync_to_async
from django.conf import settings
from django.db import transaction

from agents.domains.base import Domain
from agents.domains.base import Scenario as DomainScenario
from agents.llm import LLMClient, shared_client
from agents.paths import secret

from . import flow
from .domains import domain_of, history, system_prompt
from .models import Arm, Conversation, Message, Participant

Send = Callable[[dict], Awaitable[None]]


def arm_client(arm: Arm) -> LLMClient:
    """The worker's one long-lived client for the arm's endpoint on this event loop, shared by
    every turn and every arm on that endpoint (one connection pool, not one per turn)."""
    api_key = secret(arm.api_key_env) if arm.api_key_env else None
    return shared_client(arm.endpoint_url, api_key=api_key, timeout=settings.PARLEY_LLM_TIMEOUT)


def metrics(result) -> dict:
    usage = result.usage or {}
    return {
        "model": result.model or "",
        "finish_reason": result.finish_reason or "",
        "ttft_ms": round(result.ttft * 1000) if result.ttft is not None else None,
        "latency_ms": round(result.latency * 1000),
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
    }


async def agent_turn(participant: Participant, user_message: Message, send: Send) -> Message:
    """Stream the agent's answer to `user_message`; loop over tool calls up to the Domain's cap."""
    conversation = await database_sync_to_async(lambda: participant.conversation)()
    domain, scenario = await database_sync_to_async(domain_of)(participant)
    system = await database_sync_to_async(system_prompt)(participant)
    tools = domain.tools(scenario) if domain else []
    budget = domain.max_tool_calls_per_turn if domain else 0
    params = participant.arm.generation_params()
    reply_to = user_message.client_id
    client = arm_client(participant.arm)
    while True:
        messages = await database_sync_to_async(history)(conversation)
        if system:
            messages.insert(0, {"role": "system", "content": system})
        offer_tools = tools if budget > 0 else None  # out of budget: the agent must answer
        await send({"type": "start", "reply_to": reply_to})
        # `async with`: a turn cut short (the browser gone) frees its connection at once
        async with client.stream_chat(
            participant.arm.model_name,
            messages,
            tools=offer_tools,
            tool_format=participant.arm.tool_format,
            **params,
        ) as stream:
            async for delta in stream:
                await send({"type": "delta", "reply_to": reply_to, "text": delta})
        result = stream.result
        calls = result.tool_calls[:budget] if offer_tools else []
        stored = await database_sync_to_async(flow.store_agent_message)(
            conversation,
            role=Message.Role.ASSISTANT,
            content=result.content,
            tool_calls=calls or None,
            reply_to=user_message,
            **metrics(result),
        )
        if not calls:
            await send({"type": "reply", "reply_to": reply_to, "message": stored.to_client()})
            return stored
        await send({"type": "tool_calls", "reply_to": reply_to, "message": stored.to_client()})
        for call in calls:
            result_message = await database_sync_to_async(run_tool)(
                conversation, domain, scenario, call, user_message
            )
            await send(
                {
                    "type": "tool_result",
                    "reply_to": reply_to,
                    "message": result_message.to_client(),
                }
            )
        budget -= len(calls)


def run_tool(
    conversation: Conversation,
    domain: Domain,
    scenario: DomainScenario,
    call: dict,
    user_message: Message,
) -> Message:
    """Run one tool call on this conversation's own state and store its result."""
    with transaction.atomic():
        conversation = Conversation.objects.select_for_update().get(pk=conversation.pk)
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
            seq=flow.next_seq(conversation),
            role=Message.Role.TOOL,
            content=output,
            tool_call_id=call.get("id", ""),
            tool_name=function.get("name", ""),
            reply_to=user_message,
        )
