"""vLLM against the embedded engine: N concurrent streamed requests, figures side by side.

    python bench/vllm_vs_embedded.py [--concurrency 1 8 32] [--max-tokens 64] [--lora NAME=PATH]
        [--vllm-url URL] [--embedded-url URL] [--only embedded|vllm] [--temperature 0.7]
        [--beside-busy]

Each engine is started in turn on the prepared base model and stopped after its runs (unless
its URL is given), so the two never compete for the CPU. Decoding is greedy on the same
prompts, and both engines produce the same tokens, so they do the same work; --temperature T
samples instead, as a study arm does (its default is 0.7), each request with its own seed.
With --beside-busy every level is measured twice side by side, quiet and then beside a
CPU-bound neighbour (one busy Python loop, started for that run and stopped after it), with
`uptime` printed beside each, and the busy figures are given as a share of the quiet ones:
the engine shares its cores with the web server, Celery and whatever else runs on a
researcher's laptop (issue 36 point 8). With --lora the
requests go to that adapter on both engines (vLLM then runs uncompiled: LoRA disables its
torch.compile on CPU). Needs `make vllm` (unless --only embedded). Prints figures, then each
engine's tokens/s at every concurrency as a multiple of its one-at-a-time figure (the first
level); asserts nothing.
"""

import argparse
import asyncio
import contextlib
import math
import os
import statistics
import subprocess
import sys
import time

from agents.llm import LLMClient
from agents.serving.adapters import parse_lora_option
from agents.serving.launch import running_engine
from agents.serving.prepare import ensure_base_model
from agents.serving.vllm import VLLMNotInstalled, check_vllm, running_vllm, vllm_python

PROMPTS = [
    "Tell me a short story about a lighthouse keeper.",
    "Explain how a bicycle stays upright.",
    "Describe your ideal weekend in a few sentences.",
    "What should I pack for a week of hiking?",
    "Why do cats purr?",
    "Give me three tips for a job interview.",
    "How does a refrigerator keep food cold?",
    "Write a friendly note asking a neighbour to water my plants.",
]


async def one(
    client: LLMClient, model: str, prompt: str, max_tokens: int, temperature: float, seed: int
) -> dict:
    messages = [{"role": "user", "content": prompt}]
    sampling = {"temperature": temperature}
    if temperature > 0:  # as a study arm's extra_params may; quiet and busy runs alike
        sampling["seed"] = seed
    stream = client.stream_chat(model, messages, max_tokens=max_tokens, **sampling)
    async for _ in stream:
        pass
    result = stream.result
    return {"tokens": result.usage["completion_tokens"], "ttft": result.ttft}


async def level(url: str, model: str, n: int, max_tokens: int, temperature: float = 0) -> dict:
    """n requests at once; aggregate tokens/s over the wall time, and their times to first token."""
    async with LLMClient(url, timeout=1800, max_retries=0) as client:
        await one(client, model, PROMPTS[0], 4, temperature, seed=0)  # warm-up, not counted
        started = time.monotonic()
        rows = await asyncio.gather(
            *(
                one(client, model, PROMPTS[i % len(PROMPTS)], max_tokens, temperature, seed=i)
                for i in range(n)
            )
        )
        wall = time.monotonic() - started
    tokens = sum(row["tokens"] for row in rows)
    ttfts = sorted(row["ttft"] for row in rows)
    return {
        "n": n,
        "tokens": tokens,
        "wall": wall,
        "tps": tokens / wall,
        "per_request": tokens / wall / n,
        "ttft_p50": statistics.median(ttfts),
        "ttft_p95": _percentile(ttfts, 0.95),
        "ttft_max": ttfts[-1],
    }


def _percentile(ordered: list[float], q: float) -> float:
    """The nearest-rank percentile of sorted values (p95 of 32 is the 31st)."""
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def load_average() -> str:
    """The machine's load averages (`uptime`'s three), printed beside every figure: a shared
    CPU skews them."""
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f}, {five:.2f}, {fifteen:.2f} on {os.cpu_count()} cores"


@contextlib.contextmanager
def busy_neighbour():
    """One CPU-bound process beside the engine for the block: a busy Python loop, as a
    training step, a test run or a browser tab keeps a core."""
    loop = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(1)  # running before the level starts
        yield
    finally:
        loop.kill()
        loop.wait()


def measure(
    engine: str,
    starter,
    model: str,
    levels: list[int],
    max_tokens: int,
    temperature: float = 0,
    beside_busy: bool = False,
) -> list[dict]:
    started = time.monotonic()
    with starter() as url:
        print(f"{engine}: ready in {time.monotonic() - started:.0f}s at {url}", flush=True)
        rows = []
        for n in levels:
            settings = [("quiet", contextlib.nullcontext)]
            if beside_busy:
                settings.append(("busy", busy_neighbour))
            for beside, neighbour in settings:
                with neighbour():
                    row = asyncio.run(level(url, model, n, max_tokens, temperature))
                    row = {"engine": engine, "beside": beside, **row, "load": load_average()}
                show(row)
                rows.append(row)
    return rows


HEADER = (
    f"{'engine':<9} {'beside':<6} {'N':>3} {'tokens':>7} {'wall s':>7} {'tok/s':>7} "
    f"{'tok/s/req':>9} {'ttft p50':>9} {'ttft p95':>9} {'ttft max':>9}  load"
)


def show(row: dict):
    print(
        f"{row['engine']:<9} {row['beside']:<6} {row['n']:>3} {row['tokens']:>7} {row['wall']:>7.1f} "
        f"{row['tps']:>7.1f} {row['per_request']:>9.2f} {row['ttft_p50']:>8.2f}s "
        f"{row['ttft_p95']:>8.2f}s {row['ttft_max']:>8.2f}s  {row['load']}",
        flush=True,
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--lora", metavar="NAME=PATH", help="send the requests to this adapter")
    parser.add_argument("--vllm-url", help="a running vLLM (default: start one)")
    parser.add_argument("--embedded-url", help="a running embedded engine (default: start one)")
    parser.add_argument("--only", choices=["embedded", "vllm"], help="measure one engine only")
    parser.add_argument(
        "--embedded-args",
        default="",
        help="extra options for the embedded engine, e.g. '--max-batch 16 --threads 2'",
    )
    parser.add_argument(
        "--temperature",
        type=float,
        default=0,
        help="sample at this temperature, each request with its own seed (default 0: greedy; "
        "a study arm's default is 0.7)",
    )
    parser.add_argument(
        "--beside-busy",
        action="store_true",
        help="measure every level quiet and again beside one busy Python loop",
    )
    args = parser.parse_args()
    engines = [args.only] if args.only else ["embedded", "vllm"]
    if "vllm" in engines and not args.vllm_url:
        try:
            check_vllm(vllm_python())
        except VLLMNotInstalled as error:  # `make bench` goes on without it
            print(f"skipped: {error}")
            return

    model_dir = ensure_base_model()
    lora = parse_lora_option(args.lora) if args.lora else None
    loras = {lora.name: lora.path} if lora else None
    model = lora.name if lora else model_dir.name

    def start_embedded():
        if args.embedded_url:
            return contextlib.nullcontext(args.embedded_url)
        return running_engine(model_dir, loras=loras, extra_args=args.embedded_args.split())

    def start_vllm():
        return (
            contextlib.nullcontext(args.vllm_url)
            if args.vllm_url
            else running_vllm(model_dir, loras=loras)
        )

    decoding = f"temperature {args.temperature}, seeded" if args.temperature else "greedy"
    print(f"model {model}, {args.max_tokens} tokens per request, {decoding}, streamed", flush=True)
    starters = {"embedded": start_embedded, "vllm": start_vllm}
    rows = []
    for engine in engines:
        rows += measure(
            engine,
            starters[engine],
            model,
            args.concurrency,
            args.max_tokens,
            args.temperature,
            args.beside_busy,
        )
    print("\n" + HEADER)
    for n in args.concurrency:
        for row in rows:
            if row["n"] == n:
                show(row)
    print()
    settings = ["quiet", "busy"] if args.beside_busy else ["quiet"]
    for engine in engines:
        for beside in settings:
            alone, *more = [r for r in rows if r["engine"] == engine and r["beside"] == beside]
            for row in more:
                print(
                    f"{engine} ({beside}): {row['n']} concurrent {row['tps']:.1f} tok/s = "
                    f"{row['tps'] / alone['tps']:.1f}x its {alone['n']}-at-a-time "
                    f"{alone['tps']:.1f} tok/s; ttft p50 {row['ttft_p50']:.2f}s "
                    f"(alone {alone['ttft_p50']:.2f}s)"
                )
        if args.beside_busy:  # issue 36's goal: beside one busy loop, half the quiet figure
            for n in args.concurrency:
                quiet, busy = (
                    next(
                        r
                        for r in rows
                        if r["engine"] == engine and r["n"] == n and r["beside"] == b
                    )
                    for b in settings
                )
                print(
                    f"{engine}: {n} concurrent beside a busy neighbour {busy['tps']:.1f} tok/s = "
                    f"{busy['tps'] / quiet['tps']:.2f}x quiet {quiet['tps']:.1f} tok/s; ttft p50 "
                    f"{busy['ttft_p50']:.2f}s (quiet {quiet['ttft_p50']:.2f}s)"
                )
    if len(engines) == 2:  # the targets: the embedded engine as a share of vLLM's
        for n in args.concurrency:
            ours, theirs = (
                next(r for r in rows if r["engine"] == e and r["n"] == n and r["beside"] == "quiet")
                for e in engines
            )
            print(
                f"at {n}: embedded {ours['tps'] / theirs['tps']:.2f}x vLLM's tok/s, "
                f"ttft p95 {ours['ttft_p95'] / theirs['ttft_p95']:.2f}x vLLM's "
                f"({ours['ttft_p95']:.2f}s against {theirs['ttft_p95']:.2f}s)"
            )


if __name__ == "__main__":
    main()
