"""What each of CooperBench's two agents is told, in parley's words after the benchmark's
cooperative template (cooperbench/CooperBench at 44b4a7a,
src/cooperbench/agents/mini_swe_agent_v2/config/coop.yaml) as the paper's release renders it
(CHATS-lab/scope_usim usim/cooperbench/agent.py): the feature, the colleague on another branch,
the automatic merge, messaging, one command per step and the submit command."""

from __future__ import annotations

from agents.llm.tool_format import tool_prompt

from .workspace import STOP_SIGNAL, TOOLS

MESSAGE_FROM = "[Message from {name}]: {content}"  # the benchmark's form of a delivered message
TOOL_RESULT = "[Tool result: {name}]\n{content}"  # the partner's results, in its text-only view


def instructions(me: str, colleague: str, feature: str) -> str:
    return f"""You are a software engineer, {me}, working with a colleague, {colleague}, on one \
codebase. You each have your own copy of the repository and implement a different feature, at \
the same time, each on your own branch. When you have both submitted, your two patches are \
merged automatically with git, and the work succeeds only if both features' tests pass on the \
merged code. So write a correct implementation first, and coordinate with your colleague so that \
the patches merge cleanly (say which files and lines you will touch; avoid editing the same \
lines).

## Your feature

{feature.strip()}

## How you work

Each of your replies is one step: a short reasoning, then at least one tool call. Commands run \
in a new shell each time, in the repository's root. Use send_message to talk to {colleague}; \
messages from them appear as "{MESSAGE_FROM.format(name=colleague, content="...")}". Explore \
the code, make your change, check it (run the tests you write), then submit with the submit \
tool (or `echo {STOP_SIGNAL}`). After submitting you take no more steps."""


def partner_tools_block() -> str:
    """The partner's tools, described in its system prompt whatever model plays it: its calls
    are read from its text (agents.llm's JSON format), so every simulator supply can code."""
    return (
        tool_prompt(TOOLS)
        + "\nHere each result comes back in the next message, beginning with "
        + TOOL_RESULT.format(name="<tool name>", content="").strip()
        + "."
    )
