"""A parley checkpoint (LoRA adapter + manifest.json) served by vLLM and by the embedded engine.

The vLLM suite needs `make vllm` (its own venv, minutes to install): skipped without it, failed
under CI (PARLEY_CI=1), which installs it (tests/conftest.py's vllm_ready).
"""

import pytest

from agents.serving.adapters import find_adapters
from agents.serving.launch import start_engine, stop_engine
from agents.serving.vllm import start_vllm


# module-scoped: no server outlives test_vllm_lora.py (test_vllm_study.py starts two more)
@pytest.fixture(scope="module")
def vllm_url(vllm_ready, base_model, checkpoints):
    """vLLM serving the base model and every checkpoint found as the embedded engine finds them."""
    loras = {name: adapter.path for name, adapter in find_adapters(checkpoints).items()}
    url, process = start_vllm(base_model, loras=loras, python=vllm_ready)
    yield url
    stop_engine(process, timeout=20)


@pytest.fixture(scope="module")
def embedded_url(base_model, checkpoints):
    url, process = start_engine(base_model, adapters=checkpoints)
    yield url
    stop_engine(process)
