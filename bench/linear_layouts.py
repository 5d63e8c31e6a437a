"""The embedded engine's linear-weight layouts side by side (agents/serving/embedded/weights.py).

    python bench/linear_layouts.py [--rows 1 8 32 320] [--threads 1]

For SmolLM2-135M's shapes (read from the prepared model's config.json; random weights, as speed
does not depend on the values), the products of every layer's seven projections and of the
output head with N rows, in the three layouts: [out, in] as loaded, stored transposed (what
one row uses), and packed by oneDNN (what two rows and more use). Each layer has its own
weights, so they stream from memory as in a decoding step. Prints milliseconds per step
(layers + head), with the machine's load and the commit; asserts nothing.
"""

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from agents.serving.embedded.weights import PACK_HINT, can_pack
from agents.serving.prepare import ensure_base_model


def timed(fn, reps: int) -> float:
    fn()
    started = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - started) / reps * 1000


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 320])
    parser.add_argument("--threads", type=int, default=1, help="the engine decodes on 1 here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = json.loads((Path(ensure_base_model()) / "config.json").read_text())
    hidden, inner = config["hidden_size"], config["intermediate_size"]
    head_dim = hidden // config["num_attention_heads"]
    kv = config["num_key_value_heads"] * head_dim
    shapes = [(hidden, hidden), (kv, hidden), (kv, hidden), (hidden, hidden)]
    shapes += [(inner, hidden), (inner, hidden), (hidden, inner)]
    layers = [[torch.randn(o, i) for o, i in shapes] for _ in range(config["num_hidden_layers"])]
    head = torch.randn(config["vocab_size"], hidden)
    layouts = {
        "as loaded": (layers, head, F.linear),
        "transposed": (
            [[w.t().contiguous().t() for w in layer] for layer in layers],
            head.t().contiguous().t(),
            F.linear,
        ),
    }
    if can_pack():
        pack = lambda w: torch.ops.mkldnn._reorder_linear_weight(w, PACK_HINT)  # noqa: E731
        packed = lambda x, w: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")  # noqa: E731
        layouts["oneDNN packed"] = (
            [[pack(w) for w in layer] for layer in layers],
            pack(head),
            packed,
        )
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    print(f"load {os.getloadavg()}, commit {commit.stdout.strip()}, {args.threads} thread(s)")
    print("| rows | " + " | ".join(layouts) + " |")
    print("|---|" + "---|" * len(layouts))
    for rows in args.rows:
        x = {hidden: torch.randn(rows, hidden), inner: torch.randn(rows, inner)}
        reps = max(2, 40 // rows)
        cells = []
        for weights, head_weight, product in layouts.values():

            def step(weights=weights, product=product, x=x):
                for layer in weights:
                    for w, (_, i) in zip(layer, shapes, strict=True):
                        product(x[i], w)

            cells.append(
                f"{timed(step, reps):.1f} + "
                f"{timed(lambda h=head_weight, p=product, x=x: p(x[hidden], h), reps):.1f} ms"
            )
        print(f"| {rows} | " + " | ".join(cells) + " |", flush=True)
    print(f"load {os.getloadavg()}")


if __name__ == "__main__":
    main()
