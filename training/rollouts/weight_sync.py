"""A fully fine-tuned speaker sampled on vLLM: after each optimizer step the trainer pushes its
updated weights into the served model through vLLM's weight-transfer API, so every rollout of a
step is sampled from the weights that step starts from, and each sample says which weights
those were (the version the server stamped on it).

The round, once per step, rank 0 alone (the others wait at a barrier, then sample):

    POST /pause?mode=wait             no request is half on the old weights, half on the new;
                                      the prefix cache, built by the old weights, is dropped
    POST /start_weight_update         the transfer itself: vLLM's own trainer engine for
    POST /update_weights              "nccl" (a broadcast from the trainer's GPU into the
    POST /finish_weight_update        server's), parley's files in /dev/shm for "parley_shm"
    POST /update_weight_version       the version every token sampled from now on carries
    POST /resume

(/init_weight_transfer_engine once, before the first round.) Turns are sampled through vLLM's
token-in/token-out route, /inference/v1/generate, whose every choice lists the weight versions
that sampled its tokens (`weight_versions`: spans over the output); a turn whose tokens came
from more than one version, or from another version than the one pushed for the step, is an
error, and a step whose transcripts mix versions is refused by the update
(training/rl/tokens.py's one_weight_version).

Backends (vLLM's --weight-transfer-config, set by agents.serving.vllm's start_vllm(...,
weight_transfer=...); RunConfig.weight_sync_backend, "auto" by the trainer's device): "nccl"
when the trainer is on cuda (vLLM's NCCLTrainerWeightTransferEngine, the server on other GPUs;
vllm must import in the trainer's environment, as in TRL's vllm mode), "ipc" for a server on
the trainer's own GPU (vLLM's CUDA IPC engine), "parley_shm" on CPU (the plugin in
agents/serving/vllm-plugin, registered through vLLM's entry points; vLLM 0.32 has no CPU
backend of its own: docs/training.md says why this one).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import torch

from agents.serving.vllm import IPC, NCCL, PARLEY_SHM, WEIGHT_TRANSFER_BACKENDS
from training.rollouts.served import Endpoint, SampledIds

SHM_DIR = "/dev/shm"  # memory, not disk, where the host has it


class WeightSyncError(RuntimeError):
    """The server did not take the weights, or sampled from others than the step's."""


def transfer_backend(device: str, setting: str = "auto") -> str:
    """The backend a trainer on `device` pushes through (RunConfig.weight_sync_backend):
    "auto" is NCCL from a GPU, shared memory from the CPU."""
    if setting != "auto":
        return setting
    return NCCL if torch.device(device).type == "cuda" else PARLEY_SHM


class WeightSyncClient:
    """vLLM's weight-sync control plane over HTTP (its VLLMWeightSyncClient protocol: the
    four transfer calls, with which vLLM's own trainer engines drive a round), and the pause,
    resume and version routes beside them (vllm/entrypoints/rl/online/api_router.py, served
    under VLLM_SERVER_DEV_MODE=1)."""

    def __init__(self, base_url: str, timeout: float = 600.0, api_key: str | None = None):
        self.root = base_url.rstrip("/").removesuffix("/v1")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(timeout=timeout, headers=headers)

    def _post(self, path: str, json: Any = None, params: dict | None = None) -> Any:
        response = self.http.post(f"{self.root}/{path}", json=json, params=params)
        if response.status_code == 404:
            raise WeightSyncError(
                f"{self.root}/{path} is not served: start vLLM with VLLM_SERVER_DEV_MODE=1 and"
                " --weight-transfer-config (start_vllm(..., weight_transfer=...))"
            )
        if response.is_error:
            raise WeightSyncError(f"{path}: {response.status_code} {response.text[:500]}")
        return response.json() if response.content else None

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self._post("init_weight_transfer_engine", {"init_info": init_info})

    def start_weight_update(self) -> None:
        self._post("start_weight_update")

    def update_weights(self, update_info: dict[str, Any] | list[dict[str, Any]]) -> None:
        infos = update_info if isinstance(update_info, list) else [update_info]
        infos = [_json_safe(info) for info in infos]
        self._post(
            "update_weights", {"update_info": infos if isinstance(update_info, list) else infos[0]}
        )

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        body = {"weight_version": weight_version} if weight_version is not None else None
        self._post("finish_weight_update", body)

    def pause(self) -> None:
        # wait: a request in flight finishes on the weights it began with; the caches go
        self._post("pause", params={"mode": "wait", "clear_cache": "true"})

    def resume(self) -> None:
        self._post("resume")

    def update_weight_version(self, version: str) -> None:
        self._post("update_weight_version", {"new_version": version})

    def weight_version(self) -> str:
        return self.http.get(f"{self.root}/weight_info").raise_for_status().json()["weight_version"]

    def world_size(self) -> int:
        """The server's workers (tensor x pipeline x data parallel): NCCL's group is they and
        the trainer."""
        response = self.http.get(f"{self.root}/get_world_size").raise_for_status()
        return int(response.json()["world_size"])

    def close(self) -> None:
        self.http.close()


def _json_safe(update_info: dict[str, Any]) -> dict[str, Any]:
    """CUDA IPC handles are not JSON: over HTTP they travel pickled, in base64, as vLLM's own
    HTTP client sends them (the server unpickles them with VLLM_ALLOW_INSECURE_SERIALIZATION=1,
    which start_vllm sets for the ipc backend)."""
    if update_info.get("ipc_handles") is None:
        return update_info
    import base64
    import pickle

    out = {k: v for k, v in update_info.items() if k != "ipc_handles"}
    out["ipc_handles_pickled"] = base64.b64encode(pickle.dumps(update_info["ipc_handles"])).decode()
    return out


class SharedMemoryTransfer:
    """CPU: the weights written once into a safetensors file under /dev/shm, each worker
    loading it by path (the parley_shm backend); the file is gone when the round ends."""

    backend = PARLEY_SHM

    def __init__(self, client: WeightSyncClient):
        self.client = client
        client.init_weight_transfer_engine({})

    def send(self, weights: dict[str, torch.Tensor]) -> None:
        from safetensors.torch import save_file

        folder = SHM_DIR if os.path.isdir(SHM_DIR) else None
        handle, path = tempfile.mkstemp(prefix="parley-weights-", suffix=".safetensors", dir=folder)
        os.close(handle)
        try:
            # contiguous host copies: FSDP's gathered weights are views of one flat buffer
            tensors = {k: v.detach().to("cpu").contiguous() for k, v in weights.items()}
            save_file(tensors, path, metadata={"format": "pt"})
            del tensors
            self.client.start_weight_update()
            self.client.update_weights({"path": path, "names": list(weights)})
            self.client.finish_weight_update()
        finally:
            Path(path).unlink(missing_ok=True)

    def close(self) -> None:
        pass


class VllmEngineTransfer:
    """GPUs: one of vLLM's own trainer-side engines, driving the round through our client.
    "nccl": a broadcast from the trainer's GPU (rank 0 of a group with the server's workers,
    which reach `host` for the rendezvous) into the server's, which must be other GPUs (NCCL
    refuses two ranks on one device); "ipc": CUDA IPC handles of the trainer's tensors, for a
    server on the trainer's own GPU (one trainer process: the engine gathers handles over
    every rank of a process group). The trainer's process needs vllm importable; the server
    runs with --weight-transfer-config naming the same backend. Each round sends the weights
    as `weights()` gives them then (the gathered ones under FSDP)."""

    def __init__(
        self,
        backend: str,
        client: WeightSyncClient,
        weights: Callable[[], dict[str, torch.Tensor]],
        host: str,
    ):
        try:
            from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource
            from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
        except ImportError as error:
            raise WeightSyncError(
                f"the {backend!r} weight transfer is vLLM's own engine, which needs vllm in"
                f" the trainer's environment ({error}); install it there, or sample in"
                ' process (rollout_endpoint = "")'
            ) from error

        class PolicySource(WeightSource):
            """The policy's weights by their Hugging Face names, as they are when a round
            runs."""

            def metadata(self) -> list[Any]:
                return [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in weights().items()]

            def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
                yield from weights().items()

        if backend == NCCL:
            from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

            from agents.serving.process import free_port

            info: Any = NCCLTrainerInitInfo(
                master_address=host,
                master_port=free_port(host),
                world_size=1 + client.world_size(),
                rank=0,
            )
        else:
            from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

            info = IPCTrainerInitInfo(rank=0)
        self.backend = backend
        self.engine = WeightTransferTrainerFactory.trainer_init(
            info, client=client, source=PolicySource()
        )

    def send(self, weights: dict[str, torch.Tensor]) -> None:
        self.engine.send_weights()  # its source reads the same weights

    def close(self) -> None:
        self.engine.shutdown()


class ServedWeights:
    """A fully fine-tuned speaker's weights on a vLLM server, kept equal to the trainer's: the
    counterpart of served.py's ServedAdapter (same `publish`, `sample`, `close`), with whole
    weights pushed where an adapter is hot-loaded. The agent (EndpointAgent) and a co-trained
    simulator (ServedUser) sample through it under finetune = "full"."""

    def __init__(
        self,
        base_url: str,
        lm: Any,
        temperature: float,
        max_new_tokens: int,
        api_key: str | None = None,
        *,
        model: str = "",
        backend: str = "auto",
        nccl_host: str = "127.0.0.1",
    ):
        self.base_url, self.lm = base_url, lm
        self.temperature, self.max_new_tokens = temperature, max_new_tokens
        self.api_key, self.nccl_host = api_key, nccl_host
        self.backend = transfer_backend(str(lm.device), backend)
        self.model = model  # the served model's name: "" = the server's only one
        self.version = ""  # the weights' version the server holds, once pushed
        self.client = WeightSyncClient(base_url, api_key=api_key)
        self.transfer: SharedMemoryTransfer | VllmEngineTransfer | None = None
        self._pushing: dict[str, torch.Tensor] = {}  # the round's weights (NCCL's source)
        self.endpoint = Endpoint(lambda: httpx.AsyncClient(timeout=600, headers=self._headers()))

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def publish(self, policy: Any, folder: Path, name: str, ranks: Any = None) -> None:
        """The weights `policy` holds now, pushed into the served model as version `name`
        (`folder`, where an adapter would be saved, is not used: nothing touches disk). With
        several ranks rank 0 alone pushes (inside the gathering every rank entered); the
        others wait for it, then sample from that version."""
        if ranks is None or ranks.main:
            self.push(policy._weights(), name)
        if ranks is not None:
            ranks.barrier()
            self.version = name

    def push(self, weights: dict[str, torch.Tensor], version: str) -> None:
        """One round: pause, transfer, version, resume. A failure leaves the server paused
        on weights of no known version, and says so."""
        self._pushing = weights
        if self.transfer is None:
            self.transfer = self._open(weights)
        self.client.pause()
        try:
            self.transfer.send(weights)
            self.client.update_weight_version(version)
        except Exception as error:
            raise WeightSyncError(
                f"pushing weights version {version!r} to {self.client.root} failed: {error}."
                " The server stays paused on weights of no known version; a resumed run pushes"
                " again at its next step"
            ) from error
        self.client.resume()
        self.version = version

    def _open(self, weights: dict[str, torch.Tensor]) -> SharedMemoryTransfer | VllmEngineTransfer:
        if self.backend == PARLEY_SHM:
            return SharedMemoryTransfer(self.client)
        if self.backend in (NCCL, IPC):
            # the engine's source reads the weights each round: the ones `push` is given
            return VllmEngineTransfer(
                self.backend, self.client, lambda: self._pushing, self.nccl_host
            )
        raise ValueError(
            f"weight transfer backend {self.backend!r}: one of {WEIGHT_TRANSFER_BACKENDS}"
        )

    def sample(self, prompts: list[list[int]]) -> list[SampledIds]:
        """Each prompt's turn as the server sampled it (ids ending with the stop token that
        ended it), carrying the weight version that sampled it."""
        if not self.version:
            raise RuntimeError(f"{type(self).__name__}.publish() must push the weights first")
        return self.endpoint.run(
            lambda http: asyncio.gather(*(self._generate(http, p) for p in prompts))
        )

    async def _generate(self, http: httpx.AsyncClient, prompt: list[int]) -> SampledIds:
        body = {
            "token_ids": prompt,
            "sampling_params": {
                "max_tokens": self.max_new_tokens,
                "temperature": self.temperature,
                "top_p": 1.0,
                "top_k": -1,
                "stop_token_ids": self.lm.stop_ids,
                "skip_special_tokens": False,
            },
        }
        if self.model:
            body["model"] = self.model
        response = await http.post(f"{self.client.root}/inference/v1/generate", json=body)
        if response.is_error:
            raise WeightSyncError(f"generate: {response.status_code} {response.text[:500]}")
        (choice,) = response.json()["choices"]
        ids = list(choice["token_ids"])
        if choice.get("finish_reason") == "stop" and (not ids or ids[-1] not in self.lm.stop_ids):
            reason = choice.get("stop_reason")  # as served.turn_ids: the stop token put back
            ids.append(reason if isinstance(reason, int) else self.lm.stop_ids[0])
        versions = {span["version"] for span in choice.get("weight_versions") or []}
        if versions != {self.version}:
            raise WeightSyncError(
                f"the server sampled a turn from weight versions {sorted(versions)}, not"
                f" {self.version!r}, the one pushed for this step: another trainer pushing to"
                " the same server, or a server that is not this run's"
            )
        return SampledIds(ids, weight_version=self.version)

    def close(self) -> None:
        self.endpoint.close()
        with contextlib.suppress(Exception):
            if self.transfer is not None:
                self.transfer.close()
        self.client.close()
