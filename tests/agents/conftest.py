"""An embedded engine serving SmolLM2 plus two tiny LoRA adapters, shared by this folder.

The adapters are made here with peft from the real base model: random, non-zero LoRA weights,
so an adapter's greedy reply differs from the base model's.
"""

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from agents.serving.launch import start_engine, stop_engine
from tests.support.engine import Peer

MANIFEST_NAME = "tiny-lora"  # served by the name in its manifest.json
PLAIN_NAME = "plain"  # served by its folder name
EXPLICIT_NAME = "explicit"  # served through --lora NAME=PATH


@dataclass
class Served:
    url: str  # base URL ending in /v1
    base: str  # the base model's served name
    process: object

    def post(self, body, timeout=120.0) -> httpx.Response:
        return httpx.post(f"{self.url}/chat/completions", json=body, timeout=timeout)

    def chat(self, content: str, **params) -> dict:
        """A whole (non-streamed) reply; greedy and short unless told otherwise."""
        body = {
            "model": self.base,
            "messages": [{"role": "user", "content": content}],
            "temperature": 0,
            "max_tokens": 8,
            **params,
        }
        response = self.post(body)
        assert response.status_code == 200, response.text
        return response.json()


@pytest.fixture(scope="session")
def adapters_root(base_model, tmp_path_factory) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("adapters")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base_model)
    config = LoraConfig(
        r=4, lora_alpha=32, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    checkpoint = root / "run-1" / "step-2"
    get_peft_model(model, config).save_pretrained(checkpoint)
    (checkpoint / "manifest.json").write_text(json.dumps({"name": MANIFEST_NAME, "step": 2}))
    shutil.copytree(checkpoint, root / PLAIN_NAME, ignore=shutil.ignore_patterns("manifest.json"))
    return root


@pytest.fixture(scope="session")
def served(base_model, adapters_root):
    url, process = start_engine(
        base_model,
        adapters=adapters_root,
        loras={EXPLICIT_NAME: adapters_root / PLAIN_NAME},
        extra_args=["--max-loras", "2"],
    )
    yield Served(url=url, base=Path(base_model).name, process=process)
    stop_engine(process)


@pytest.fixture
async def peer():
    peers = []

    async def make(*replies, port=0):
        server = Peer(*replies)
        peers.append(server)
        return server, await server.start(port)

    yield make
    for server in peers:
        await server.stop()
