"""A parley checkpoint (LoRA adapter + manifest.json) served by vLLM and by the embedded engine.

The vLLM suite needs `make vllm` (its own venv, minutes to install) and is skipped without it.
"""

import json
from pathlib import Path

import pytest

from agents.serving.adapters import find_adapters
from agents.serving.launch import start_engine, stop_engine
from agents.serving.vllm import VLLMNotInstalled, check_vllm, start_vllm, vllm_python

CHECKPOINT_NAME = "p4g-single-cpu-step4"  # from its manifest, as training writes it


@pytest.fixture(scope="session")
def vllm_ready():
    try:
        return check_vllm(vllm_python())
    except VLLMNotInstalled as error:
        pytest.skip(str(error))


@pytest.fixture(scope="session")
def checkpoints(base_model, tmp_path_factory) -> Path:
    """A run folder holding one checkpoint shaped like training.checkpoint's: the LoRA of
    training/configs/*.toml (r=8 on q, k, v and o) with random, large B weights, so the
    adapter's greedy reply cannot be the base model's."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    model = get_peft_model(model, config)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "lora_B" in name:
                weight.normal_(0.0, 0.05)  # peft starts B at zero: the adapter would be a no-op
    root = tmp_path_factory.mktemp("runs")
    folder = root / "p4g-single-cpu" / "checkpoints" / "step-000004"
    model.save_pretrained(folder)
    manifest = {
        "name": CHECKPOINT_NAME,
        "kind": "agent",
        "adapter": True,
        "base_model": str(base_model),
        "domain": "p4g",
        "regime": "single",
        "step": 4,
        "metrics": {"reward_mean": 0.0},
        "config": {"lora": {"r": 8, "alpha": 16}},
    }
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return root


@pytest.fixture(scope="session")
def vllm_url(vllm_ready, base_model, checkpoints):
    """vLLM serving the base model and every checkpoint found as the embedded engine finds them."""
    loras = {name: adapter.path for name, adapter in find_adapters(checkpoints).items()}
    url, process = start_vllm(base_model, loras=loras, python=vllm_ready)
    yield url
    stop_engine(process, timeout=20)


@pytest.fixture(scope="session")
def embedded_url(base_model, checkpoints):
    url, process = start_engine(base_model, adapters=checkpoints)
    yield url
    stop_engine(process)
