"""The texts around a tau2 task: agent system prompt, greeting, user-simulator prompt, and the
instructions a human participant reads. Wording is the project's own; the rules follow tau2-bench."""

from __future__ import annotations

from typing import Any

GREETING = "Hi! How can I help you today?"  # tau2's agent always opens with this
STOP, TRANSFER, OUT_OF_SCOPE = "###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###"

AGENT_PROMPT = """<instructions>
You are a customer service agent. Help the user as the <policy> below allows.
On each turn do one of two things: send one message to the user, or call tools. Never both.
Be helpful, follow the policy strictly, and give tool arguments as valid JSON.
</instructions>
<policy>
{policy}
</policy>"""

SIMULATOR_PROMPT = f"""You are a customer talking to a customer service agent. Play the customer described in the scenario below, realistically.

Rules:
- Write one message at a time, like a person in a chat.
- Follow the scenario. Never invent facts it does not give you: anything it does not mention, you do not know.
- Say things in your own words rather than copying the scenario.
- Give information only when the agent asks for it, a little at a time.
- Keep going until your goal is reached. Then reply with {STOP} alone.
- If the agent transfers you to another agent, reply with {TRANSFER} alone.
- If the scenario does not tell you enough to go on, reply with {OUT_OF_SCOPE} alone.

<scenario>
{{scenario}}
</scenario>"""

# The Persona-Guided baseline's behavioural prefix of the simulator's system prompt, the release's
# text verbatim (a setting of the paper's run, not the project's wording): `--usim-user-prompt-
# prefix` of CHATS-lab/scope_usim cmd/slime/tau2/persona_guided.sh at commit
# 30d4ed4b744dacad2ae535b996372c54f8d41a21, put before the user simulator's own prompt with a
# blank line between (usim/core/environment/tau2/environment.py, _ConfiguredAgentGymEnv).
PERSONA_GUIDELINES = """IMPORTANT behavioral guidelines for this conversation:
- Vary your personality: sometimes be patient and cooperative, sometimes frustrated and impatient, sometimes confused about what you need.
- Occasionally give contradictory or unclear requests. Real customers often don't know exactly what they want.
- Show realistic emotional states: anger about service issues, anxiety about deadlines, confusion about policies.
- Sometimes refuse to follow the agent's instructions or insist on unreasonable requests.
- Occasionally go off-topic, ask unrelated questions, or provide irrelevant information.
- Vary your communication style: sometimes verbose, sometimes terse, sometimes formal, sometimes casual."""

SECTIONS = (
    ("reason_for_call", "Why you are contacting customer service", "Reason for call"),
    ("known_info", "What you know", "Known info"),
    ("unknown_info", "What you do not know", "Unknown info"),
    ("task_instructions", "How to act", "Task instructions"),
)


def agent_prompt(policy: str) -> str:
    return AGENT_PROMPT.format(policy=policy.strip())


def _scenario(task: dict[str, Any]) -> tuple[str | None, Any]:
    scenario = task.get("user_scenario") or {}
    return scenario.get("persona"), scenario.get("instructions")


def _indent(text: str) -> str:
    return "\n".join(
        "    " + line if line.strip() else "" for line in str(text).strip().splitlines()
    )


def simulator_prompt(task: dict[str, Any]) -> str:
    persona, instructions = _scenario(task)
    lines = []
    if persona:
        lines += ["Persona:", _indent(persona)]
    if isinstance(instructions, dict):
        lines.append(f"Domain: {instructions.get('domain', '')}")
        for key, _, label in SECTIONS:
            if instructions.get(key) is not None:
                lines += [f"{label}:", _indent(instructions[key])]
    else:
        lines += ["Instructions:", _indent(instructions or "")]
    return SIMULATOR_PROMPT.format(scenario="\n".join(lines))


def human_instructions(task: dict[str, Any]) -> str:
    """Plain text for the side panel of a study participant."""
    persona, instructions = _scenario(task)
    blocks = [
        "Please play the customer described below, in your own words. Share details only when the agent asks for them."
    ]
    if persona:
        blocks.append(f"About you\n{persona.strip()}")
    if isinstance(instructions, dict):
        for key, heading, _ in SECTIONS:
            text = instructions.get(key)
            if text and str(text).strip() not in ("", "."):
                blocks.append(f"{heading}\n{str(text).strip()}")
    elif instructions:
        blocks.append(f"Your situation\n{str(instructions).strip()}")
    blocks.append(
        "When your request is handled, or the agent cannot help further, end the conversation."
    )
    return "\n".join(line.rstrip() for line in "\n\n".join(blocks).splitlines())
