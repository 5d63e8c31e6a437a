"""What the embedded engine holds: its resident memory after start, after a burst of requests
and idle after it.

    python bench/engine_memory.py [--requests 32] [--max-tokens 64] [--idle 4]

Starts the engine (`python -m agents.serving.embedded.server`, as `make demo` does) on the prepared
base model and reads its /proc/PID/status: VmRSS (resident), RssAnon (its own memory: weights,
caches, heap), RssFile (mapped files: libraries, a model file still mapped) and VmHWM (the
peak). Then sends `--requests` concurrent streamed chat requests at temperature 0.7, each with
a system prompt of about 400 tokens (as a study arm's), reads the figures again, waits
`--idle` seconds without a request and reads them a last time. Prints MB with the load and
the commit; asserts nothing.
"""

import argparse
import asyncio
import os
import subprocess
import time

from agents.llm import LLMClient
from agents.serving.launch import start_engine, stop_engine
from agents.serving.prepare import ensure_base_model

SYSTEM = (
    "You are a friendly volunteer for a children's charity. You talk with a visitor about "
    "the charity's work and, when it fits, ask whether they would like to donate part of "
    "their study payment. Be honest, brief and warm; never pressure anyone. "
) * 6


def memory(pid: int) -> dict[str, int]:
    """MB of each of the status fields this bench reports."""
    fields = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                fields[name] = int(value.split()[0]) // 1024
    return fields


async def burst(url: str, model: str, requests: int, max_tokens: int) -> int:
    async def one(i: int) -> int:
        messages = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Hello! I am visitor {i}. What does the charity do?"},
        ]
        stream = client.stream_chat(model, messages, temperature=0.7, max_tokens=max_tokens, seed=i)
        async for _ in stream:
            pass
        return stream.result.usage["completion_tokens"]

    async with LLMClient(url, timeout=1800, max_retries=0) as client:
        return sum(await asyncio.gather(*(one(i) for i in range(requests))))


def show(what: str, pid: int):
    figures = "  ".join(f"{name} {mb:5d} MB" for name, mb in memory(pid).items())
    one, five, fifteen = os.getloadavg()
    print(f"{what:<28} {figures}  load {one:.2f}, {five:.2f}, {fifteen:.2f}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--idle", type=float, default=4.0, help="seconds idle before the last read")
    args = parser.parse_args()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    model_dir = ensure_base_model()
    print(f"commit {commit}, {os.cpu_count()} cores, {model_dir.name}, {args.requests} requests")
    url, process = start_engine(model_dir)
    try:
        show("after start", process.pid)
        tokens = asyncio.run(burst(url, model_dir.name, args.requests, args.max_tokens))
        show(f"after the burst ({tokens} tokens)", process.pid)
        time.sleep(args.idle)
        show(f"idle {args.idle:.0f} s after it", process.pid)
    finally:
        stop_engine(process)


if __name__ == "__main__":
    main()
