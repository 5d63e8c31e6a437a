"""The first reply on a fresh embedded engine: time to its first token, warming off and on.

    python bench/first_turn.py [--rounds 1] [--domain retail] [--threads N]

Each round starts the engine twice on the prepared base model, one after the other: without
--warm (before issue 36, point 4: the first conversation prefills the whole opening prompt),
then with --warm given the Domain's opening request (what `manage.py serve_agents` passes: the
engine prefills it before it reports ready). On each it sends the first turn of a tau2 retail
conversation as the demo's retail arm sends it (studies.chat.agent_turn: the Domain's system
prompt and tools in the structured tool format, the greeting, the participant's message, a
forced first tool call with 384 tokens of room, temperature 0.7), streamed, and takes the time
to the first generated token, as a study stores it (ttft_ms), and to the whole reply.
The engine's own log gives the prompt tokens it took from its prefix cache. Prints the load
(`uptime`) and commit before and after, and the two side by side; asserts nothing.
"""

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agents.domains import get_domain
from agents.llm import LLMClient
from agents.serving.launch import launch_engine, stop_engine, wait_engine
from agents.serving.prepare import ensure_base_model

PARTICIPANT = "Hi, I'd like to return the shoes from my last order, they are too small."
# the demo's retail arm (studies.rehearsal.demo_studies.seed_arms and TASK_STUDIES), at the
# first step of a reply (studies.chat.agent_turn.step_params: tool_choice FIRST forces a call,
# with FORCED_CALL_TOKENS of room)
ARM = dict(tool_format="structured", temperature=0.7, top_p=1.0, max_tokens=384)


def bodies(model: str, domain_name: str) -> tuple[dict, dict]:
    """(the opening request serve_agents warms with, the first turn's stream_chat arguments)."""
    domain = get_domain(domain_name)
    scenario = domain.scenarios("test")[0]
    opening = [{"role": "system", "content": domain.agent_system_prompt(scenario)}]
    if greeting := domain.greeting(scenario):
        opening.append({"role": "assistant", "content": greeting})
    tools = domain.tools(scenario) or None
    params = {k: v for k, v in ARM.items() if k != "tool_format"}
    if tools:
        params["tool_choice"] = "required"
    client = LLMClient(tool_format=ARM["tool_format"])
    warm = client.request_body(
        model, opening, tools=tools, tool_format=ARM["tool_format"], **params
    )
    turn = [*opening, {"role": "user", "content": PARTICIPANT}]
    first = dict(model=model, messages=turn, tools=tools, tool_format=ARM["tool_format"], **params)
    return warm, first


async def first_turn(url: str, first: dict) -> tuple[float, float]:
    """(seconds to the first token, to the whole reply) of the first turn, streamed through
    agents/llm as agent_turn streams it (its ttft is what a study stores as ttft_ms)."""
    started = time.monotonic()
    async with LLMClient(url, timeout=900, max_retries=0) as client:
        async with client.stream_chat(**first) as stream:
            async for _ in stream:
                pass
    return stream.result.ttft, time.monotonic() - started


def run(model_dir: Path, warm: dict | None, first: dict, extra: list[str]) -> dict:
    args = list(extra)
    if warm is not None:
        warm_file = Path(tempfile.mkstemp(prefix="first-turn-warm-", suffix=".json")[1])
        warm_file.write_text(json.dumps([warm]))
        args += ["--warm", str(warm_file)]
    log_path = Path(tempfile.mkstemp(prefix="first-turn-engine-", suffix=".log")[1])
    started = time.monotonic()
    process = launch_engine(model_dir, extra_args=args, log_path=log_path)
    try:
        url = wait_engine(process, timeout=900)
        ready = time.monotonic() - started
        ttft, whole = asyncio.run(first_turn(url, first))
    finally:
        stop_engine(process)  # the hung-up request is logged as it leaves
    log = log_path.read_text()
    log_path.unlink()
    served = [line for line in log.splitlines() if " prompt (" in line]
    cached = served[-1].split(" prompt (")[1].split(" cached")[0] if served else "?"
    prompt = served[-1].split(": ")[-1].split(" prompt")[0] if served else "?"
    return {"ready": ready, "ttft": ttft, "whole": whole, "prompt": prompt, "cached": cached}


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def commit() -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1, help="off/on pairs, one after the other")
    parser.add_argument("--domain", default="retail", help="the Domain whose first turn is sent")
    parser.add_argument("--threads", type=int, help="the engine's --threads (default: its own)")
    args = parser.parse_args(argv)
    model_dir = ensure_base_model()
    warm, first = bodies(model_dir.name, args.domain)
    extra = ["--threads", str(args.threads)] if args.threads else []
    print(f"commit {commit()}; before: {uptime()}", flush=True)
    rows = []
    for round_ in range(1, args.rounds + 1):
        for label, warming in (("warming off", None), ("warming on", warm)):
            row = {"round": round_, "label": label, **run(model_dir, warming, first, extra)}
            row["load"] = uptime().split("load average: ")[1]
            rows.append(row)
            print(
                f"round {round_} {label:11}  ready after {row['ready']:6.1f} s  first token "
                f"{row['ttft']:6.2f} s  whole reply {row['whole']:6.2f} s  "
                f"prompt {row['prompt']} tokens, {row['cached']} cached  "
                f"(load {row['load']})",
                flush=True,
            )
    print(f"after: {uptime()}")
    print(f"\nfirst {args.domain} turn, time to first token (s), side by side:")
    print("round  warming off  warming on")
    for round_ in range(1, args.rounds + 1):
        off, on = (r["ttft"] for r in rows if r["round"] == round_)
        print(f"{round_:5}  {off:11.2f}  {on:10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
