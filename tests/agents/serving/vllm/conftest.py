"""A parley checkpoint (LoRA adapter + manifest.json) served by vLLM and by the embedded engine.

The vLLM suite needs `make vllm` (its own venv, minutes to install): skipped without it, failed
under CI (PARLEY_CI=1), which installs it (tests/conftest.py's vllm_ready).
"""

import pytest

from agents.serving.launch import start_engine, stop_engine


# vllm_url: the suite's one vLLM server (tests/conftest.py)
@pytest.fixture(scope="module")
def embedded_url(base_model, checkpoints):
    url, process = start_engine(base_model, adapters=checkpoints)
    yield url
    stop_engine(process)
