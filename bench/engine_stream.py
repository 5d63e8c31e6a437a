"""Streaming speed of the embedded engine, through agents.llm (figures printed, no assertions).

    python bench/engine_stream.py [--url http://127.0.0.1:8001/v1] [--requests 3] [--max-tokens 64]

Without --url it starts an engine on the prepared base model and stops it afterwards.
"""

import argparse
import asyncio
import contextlib
import time

from agents.llm import LLMClient
from agents.serving.launch import running_engine
from agents.serving.prepare import ensure_base_model

PROMPTS = [
    "Tell me a short story about a lighthouse keeper.",
    "Explain how a bicycle stays upright.",
    "Describe your ideal weekend in a few sentences.",
    "What should I pack for a week of hiking?",
]


async def one(client: LLMClient, model: str, prompt: str, max_tokens: int) -> dict:
    messages = [{"role": "user", "content": prompt}]
    stream = client.stream_chat(model, messages, temperature=0.7, seed=1, max_tokens=max_tokens)
    pieces = [piece async for piece in stream]
    result = stream.result
    tokens = result.usage["completion_tokens"]
    decode = max(result.latency - result.ttft, 1e-9)
    return {
        "tokens": tokens,
        "pieces": len(pieces),
        "ttft": result.ttft,
        "latency": result.latency,
        "decode_tps": (tokens - 1) / decode if tokens > 1 else 0.0,
        "overall_tps": tokens / result.latency,
    }


def show(label: str, row: dict):
    print(
        f"{label:<14} {row['tokens']:>4} tokens  {row['pieces']:>4} pieces  "
        f"ttft {row['ttft']:.2f}s  total {row['latency']:.2f}s  "
        f"decode {row['decode_tps']:.1f} tok/s  overall {row['overall_tps']:.1f} tok/s"
    )


async def bench(url: str, requests: int, max_tokens: int):
    async with LLMClient(url, timeout=600) as client:
        model = (await client.list_models())[0]
        print(f"engine {url}, model {model}")
        show("single", await one(client, model, PROMPTS[0], max_tokens))
        started = time.monotonic()
        rows = []
        for i in range(requests):
            rows.append(await one(client, model, PROMPTS[i % len(PROMPTS)], max_tokens))
            show(f"sequential {i + 1}", rows[-1])
        elapsed = time.monotonic() - started
        total = sum(row["tokens"] for row in rows)
        print(
            f"{requests} sequential requests: {total} tokens in {elapsed:.1f}s = "
            f"{total / elapsed:.1f} tok/s, mean ttft {sum(r['ttft'] for r in rows) / len(rows):.2f}s"
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running engine (default: start one)")
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    engine = contextlib.nullcontext(args.url) if args.url else running_engine(ensure_base_model())
    with engine as url:
        asyncio.run(bench(url, args.requests, args.max_tokens))


if __name__ == "__main__":
    main()
