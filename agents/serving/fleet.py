"""Several replicas of one engine on consecutive ports, started side by side and stopped together.

    replicas = start_replicas("vllm", model_dir, count=2, port=8001, loras={"arm-a": folder})
    [r.url for r in replicas]          # http://127.0.0.1:8001/v1, http://127.0.0.1:8002/v1
    ...
    stop_replicas(replicas)            # every replica's process group, vLLM's engine cores too

vLLM replicas serve every adapter given as --lora-modules and accept more at run time
(/v1/load_lora_adapter, up to `max_lora_rank`); the embedded engine serves the given adapters
and rescans `adapters_root` on every request. Each replica leads its own process group, so a
Ctrl-C meant for the launcher reaches only the launcher, which then stops them all. A
replica that stops can be started again as it was (`restart_replica`; serve_agents does so).
With `warm` (chat completion requests: the studies' opening prompts) a replica reports ready
only once their prompts are prefilled and cached: the embedded engine prefills them itself
before it answers /health (--warm), vLLM (--enable-prefix-caching) gets one request each.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from agents.environment import setting
from agents.serving.adapters import find_adapters
from agents.serving.process import group_alive, port_is_free, stop
from agents.serving.vllm import launch_vllm, wait_vllm

ENGINES = ("vllm", "embedded")
RUNTIME_LORA_RANK = 16  # adapters loaded later may have up to this rank (training's use r=8)


@dataclass
class Replica:
    url: str  # base URL, ending in /v1
    process: subprocess.Popen
    launch: Callable[[], Replica] | None = field(default=None, repr=False)  # the same again
    startup_timeout: float = 900.0
    restarts: int = 0
    warm: list[dict] = field(default_factory=list)  # vLLM: requests sent once it answers


def replica_ports(port: int, count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` consecutive ports from `port`, each free now; ValueError naming a taken one."""
    if count < 1:
        raise ValueError(f"at least one replica is needed, not {count}")
    ports = list(range(port, port + count))
    taken = [p for p in ports if not port_is_free(host, p)]
    if taken:
        raise ValueError(
            f"port {taken[0]} on {host} is taken; stop what runs there or choose another --port"
        )
    return ports


VLLM_CPU_OMP_THREADS_BIND = setting(
    "VLLM_CPU_OMP_THREADS_BIND",
    "str",
    None,
    help="vLLM-CPU's own: the cores its compute threads bind to. Set, every replica is left to "
    "it; unset, `serve --replicas N` gives each replica its share of this process's cores",
)


def cpu_binds(count: int) -> list[dict[str, str]]:
    """Each replica's share of this process's CPU cores for vLLM-CPU's compute threads: left
    to itself every vLLM-CPU process binds to the same first cores. Nothing when there is one
    replica or the environment already says (VLLM_CPU_OMP_THREADS_BIND); a GPU build ignores it."""
    if count < 2 or VLLM_CPU_OMP_THREADS_BIND.is_set():
        return [{} for _ in range(count)]
    cores = sorted(os.sched_getaffinity(0))
    size = max(1, len(cores) // count)
    shares = [cores[i * size : (i + 1) * size] or [cores[i % len(cores)]] for i in range(count)]
    return [{"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, share))} for share in shares]


def start_replicas(
    engine: str,
    model_dir: Path | str,
    *,
    count: int = 1,
    port: int = 8001,
    host: str = "127.0.0.1",
    loras: dict[str, Path | str] | None = None,
    adapters_root: Path | str | None = None,
    max_lora_rank: int = RUNTIME_LORA_RANK,
    log_dir: Path | str | None = None,
    startup_timeout: float = 900.0,
    warm: list[dict] = (),
    **options,
) -> list[Replica]:
    """Start `count` replicas of `engine` on ports port, port+1, ...; return once every one
    answers /health (if one cannot start, all are stopped and its StartError is raised).
    `options` go to the engine's launcher (vLLM: max_model_len, max_loras, extra_args...).
    Each replica can be started again on its port, as it was (`restart_replica`). `warm`:
    chat completion requests whose prompts each replica has cached before it counts as up."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    if engine == "vllm" and adapters_root is not None:
        # the embedded engine's folder scan, done once: vLLM serves names given at start
        found = find_adapters(Path(adapters_root))
        loras = {**{a.name: a.path for a in found.values()}, **(loras or {})}
    # the embedded engine's launcher imports torch: only when it is the engine asked for
    from agents.serving.launch import launch_engine

    def launcher(replica_port: int, bind: dict[str, str]) -> Callable[[], Replica]:
        log_path = Path(log_dir) / f"{engine}-{replica_port}.log" if log_dir else None
        if engine == "vllm":

            def launch() -> Replica:
                url, process = launch_vllm(
                    model_dir,
                    replica_port,
                    loras,
                    host=host,
                    log_path=log_path,
                    env=bind,
                    runtime_lora_rank=max_lora_rank,
                    **options,
                )
                return Replica(url, process, launch, startup_timeout, warm=list(warm))

            return launch

        engine_options = dict(options)
        if warm:
            engine_options["extra_args"] = [
                *engine_options.get("extra_args", ()),
                "--warm",
                str(warm_file(warm, log_dir, replica_port)),
            ]

        def launch() -> Replica:
            process = launch_engine(
                model_dir,
                replica_port,
                adapters_root,
                loras=loras,
                host=host,
                log_path=log_path,
                own_group=True,
                **engine_options,
            )
            return Replica("", process, launch, startup_timeout)

        return launch

    replicas = []
    try:
        ports = replica_ports(port, count, host)
        for replica_port, bind in zip(ports, cpu_binds(count), strict=True):
            replicas.append(launcher(replica_port, bind)())
        for replica in replicas:
            _wait(replica)
    except BaseException:
        stop_replicas(replicas)
        raise
    return replicas


def restart_replica(replica: Replica) -> None:
    """Start a replica that stopped again, on its port and as it was, and return once it
    answers /health (StartError if it cannot). Each instance's log is kept: the one that
    stopped is renamed NAME.stopped-N.log, N counting the replica's instances from 1, so a
    replica restarted again and again keeps the log of every crash."""
    stop(replica.process)  # reaps it, and ends what is left of its process group
    log = Path(replica.process.log_path)
    if not getattr(replica.process, "own_log", False) and log.exists():
        log.replace(stopped_log(log, replica.restarts + 1))
    started, url = replica.launch(), replica.url
    replica.process, replica.restarts = started.process, replica.restarts + 1
    replica.url = started.url  # vLLM's, known at once; the embedded engine's once it is ready
    try:
        _wait(replica)
    except BaseException:
        replica.url = url  # its port's, which the next start has again
        raise


def stopped_log(log: Path, instance: int) -> Path:
    """Where the log of a replica's `instance`-th start goes once it stopped; one already there
    (an earlier serve_agents on the same port) is not written over either."""
    path = log.with_suffix(f".stopped-{instance}.log")
    while path.exists():
        instance += 1
        path = log.with_suffix(f".stopped-{instance}.log")
    return path


def warm_file(requests: list[dict], log_dir: Path | str | None, port: int) -> Path:
    """The embedded engine's --warm file of these requests (beside the logs, else temporary)."""
    if log_dir is None:
        import tempfile

        handle, path = tempfile.mkstemp(prefix=f"parley-warm-{port}-", suffix=".json")
        os.close(handle)
        path = Path(path)
    else:
        path = Path(log_dir) / f"warm-{port}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(list(requests)))
    return path


def warm_vllm(base_url: str, requests: list[dict], timeout: float = 600.0) -> None:
    """One request of one token per prompt, so vLLM's prefix cache holds it; a request it
    refuses (a model it does not serve) is skipped: the first conversation prefills it."""
    for body in requests:
        body = {k: v for k, v in body.items() if k not in ("max_completion_tokens", "stream")}
        body["max_tokens"] = 1
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(f"{base_url}/chat/completions", json=body, timeout=timeout)


def _wait(replica: Replica) -> None:
    if replica.url:  # vLLM: its URL is known from the start
        wait_vllm(replica.url, replica.process, replica.startup_timeout)
        warm_vllm(replica.url, replica.warm)
    else:  # the embedded engine writes its address on its ready line
        from agents.serving.launch import wait_engine

        replica.url = wait_engine(replica.process, replica.startup_timeout)


def stop_replicas(replicas: list[Replica], timeout: float = 20.0) -> None:
    """SIGTERM to every replica's process group, SIGKILL to what is left after `timeout`;
    returns once every group is gone (vLLM's engine core, killed with its group, is not our
    child: its end is seen by polling, not waited for)."""
    stop(*(replica.process for replica in replicas), timeout=timeout)
    deadline = time.monotonic() + timeout
    while any(group_alive(r.process.pid) for r in replicas) and time.monotonic() < deadline:
        time.sleep(0.1)
