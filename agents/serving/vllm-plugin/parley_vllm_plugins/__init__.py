"""parley's plugins for vLLM, found through vLLM's own plugin mechanism: the entry point group
`vllm.general_plugins` (parley_vllm_plugins-0.1.dist-info/entry_points.txt beside this package).
Nothing is installed: agents.serving.vllm puts this folder on the server's PYTHONPATH, where
importlib.metadata finds the dist-info, and vLLM calls `register` in every process it starts
(the API server, the engine core and its workers).

This package runs inside vLLM's own venv: it imports vLLM and torch, never parley.
"""

SHM_BACKEND = "parley_shm"


def register() -> None:
    """Register the CPU weight-transfer backend with vLLM's factory (lazily: the engine's
    module is imported only by a server started with --weight-transfer-config naming it).
    vLLM may call this more than once in one process; a second registration is skipped."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if SHM_BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(
            SHM_BACKEND, "parley_vllm_plugins.shm_engine", "SharedMemoryWeightTransferEngine"
        )
