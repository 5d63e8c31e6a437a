"""The embedded engine's decoding step, by rows and torch threads: where a second thread pays.

    python bench/engine_steps.py [--rows 1 4 8 12 16 20 24 32] [--threads 1 2] [--columns 80]

A step is one forward pass of `rows` running requests, one token each, over a KV cache of
`columns` tokens a row (agents/serving/embedded/engine.py's `_forward`, on the prepared base model with
its weights laid out as the engine serves them), in this process with nothing else running:
the pass alone, without the served engine's sampling, streaming and event loop. Prints ms a
step for each rows x threads, with the machine's load. Asserts nothing.

On 2 cores (2026-12-04 23:10 UTC, load 0.9, commit f3aaed1) a second thread gained nothing below 12 rows here
(1 row 34.0 / 34.5 ms, 8 rows 38.5 / 39.6) and 13% at 32 (81 / 71 ms), while the served engine
(bench/vllm_vs_embedded.py) gained 20-30% from 8 concurrent requests up: the engine's
WIDE_STEP is chosen from the served figures, this table says what the pass alone does.
"""

import argparse
import os
import subprocess
import time

import torch

from agents.serving.embedded.engine import WIDE_STEP, Engine
from agents.serving.prepare import ensure_base_model


def step_ms(engine: Engine, rows: int, columns: int, repeats: int) -> float:
    inputs = torch.randint(0, 1000, (rows, 1))
    positions = torch.full((rows, 1), columns - 1)
    mask = torch.arange(columns) <= positions[:, None, :, None]
    keys = [engine.name] * rows

    def once():
        engine._cache.select(0, positions, columns)
        with torch.inference_mode():
            engine._forward(inputs, keys, position_ids=positions, attention_mask=mask)

    for _ in range(3):
        once()
    started = time.perf_counter()
    for _ in range(repeats):
        once()
    return 1000 * (time.perf_counter() - started) / repeats


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 12, 16, 20, 24, 32])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--columns", type=int, default=80, help="KV-cache tokens a row")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    engine = Engine(ensure_base_model())
    try:
        print(
            f"commit {commit}, {os.cpu_count()} cores, {args.columns} columns, WIDE_STEP "
            f"{WIDE_STEP}",
            flush=True,
        )
        print("rows  " + "  ".join(f"{t} thread(s)" for t in args.threads) + "  load")
        for rows in args.rows:
            figures = []
            for threads in args.threads:
                torch.set_num_threads(threads)
                figures.append(step_ms(engine, rows, args.columns, args.repeats))
            cells = "  ".join(f"{ms:8.1f} ms" for ms in figures)
            print(f"{rows:4d}  {cells}  load {os.getloadavg()[0]:.2f}", flush=True)
    finally:
        engine.close()


if __name__ == "__main__":
    main()
