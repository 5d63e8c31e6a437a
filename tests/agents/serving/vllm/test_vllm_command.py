"""The vLLM launcher without vLLM: its command line, the adapters it serves, its errors."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agents.serving.vllm import VLLMNotInstalled, build_command, max_lora_rank, start_vllm
from tests.support.hermes import HERMES_TEMPLATE


def adapter(folder, r=8, **config):
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"r": r, **config}))
    return folder


@pytest.fixture
def model_dir(tmp_path):
    """A model folder as far as the launcher looks: vLLM itself is never started here."""
    folder = tmp_path / "Tiny-Model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


def option_values(command: list[str], option: str) -> list[str]:
    """The values after `option`, up to the next --flag."""
    start = command.index(option) + 1
    end = next((i for i in range(start, len(command)) if command[i].startswith("--")), None)
    return command[start:end]


@pytest.mark.parametrize(
    "ranks, expected",
    [([8], 8), ([4], 8), ([12], 16), ([8, 64], 64), ([200], 256), ([320], 320)],
)
def test_max_lora_rank_is_the_smallest_vllm_accepts(tmp_path, ranks, expected):
    loras = {f"a{i}": adapter(tmp_path / f"a{i}", r) for i, r in enumerate(ranks)}
    assert max_lora_rank(loras) == expected


def test_rank_pattern_counts(tmp_path):
    loras = {"a": adapter(tmp_path / "a", 8, rank_pattern={"q_proj": 40})}
    assert max_lora_rank(loras) == 64


def test_unusable_ranks_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="above vLLM's largest"):
        max_lora_rank({"big": adapter(tmp_path / "big", 1000)})
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="`broken`: cannot read its rank"):
        max_lora_rank({"broken": broken})


def test_command_serves_base_by_folder_name_and_every_adapter(tmp_path, model_dir):
    loras = {"arm-a": adapter(tmp_path / "a"), "arm-b": adapter(tmp_path / "b", 16)}
    command = build_command(model_dir, 8123, loras, python="/opt/py", extra_args=["--seed", "3"])
    assert command[:3] == ["/opt/py", "-m", "vllm.entrypoints.openai.api_server"]
    assert option_values(command, "--served-model-name") == ["Tiny-Model"]
    assert option_values(command, "--port") == ["8123"]
    assert option_values(command, "--dtype") == ["float32"]
    assert "--enable-lora" in command
    assert option_values(command, "--max-lora-rank") == ["16"]
    assert option_values(command, "--max-loras") == ["2"]
    assert option_values(command, "--lora-modules") == [
        f"arm-a={tmp_path / 'a'}",
        f"arm-b={tmp_path / 'b'}",
    ]
    assert command[-2:] == ["--seed", "3"]  # extra arguments come last, so they win


def test_command_without_adapters_has_no_lora_options(model_dir):
    command = build_command(model_dir, 8123, None, python="/opt/py")
    assert not {"--enable-lora", "--lora-modules", "--max-lora-rank"} & set(command)


def test_native_tool_calls_are_vllms_auto_tool_choice_with_the_parser(model_dir):
    # Qwen-family arms (tool_format "native") need vLLM to parse their calls; others need nothing
    command = build_command(model_dir, 8123, None, python="/opt/py", tool_call_parser="hermes")
    assert "--enable-auto-tool-choice" in command
    assert option_values(command, "--tool-call-parser") == ["hermes"]
    plain = build_command(model_dir, 8123, None, python="/opt/py")
    assert not {"--enable-auto-tool-choice", "--tool-call-parser"} & set(plain)


def test_cli_passes_the_tool_call_parser(model_dir):
    result = run_cli("--model", str(model_dir), "--tool-call-parser", "hermes", "--dry-run")
    assert result.returncode == 0, result.stderr
    command = result.stdout.split()
    assert "--enable-auto-tool-choice" in command
    assert option_values(command, "--tool-call-parser") == ["hermes"]


def test_command_refuses_a_folder_that_is_not_a_model(tmp_path):
    with pytest.raises(ValueError, match="not a Hugging Face model folder"):
        build_command(tmp_path, 8123, None, python="/opt/py")


def test_start_without_vllm_says_make_vllm(tmp_path, model_dir):
    with pytest.raises(VLLMNotInstalled, match="make vllm"):
        start_vllm(model_dir, python=tmp_path / "missing" / "python")
    # a python that exists but has no vLLM (this test's own)
    with pytest.raises(VLLMNotInstalled, match="cannot import vllm"):
        start_vllm(model_dir, python=sys.executable)


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "agents.serving.vllm", *args], capture_output=True, text=True
    )


def test_cli_scans_adapters_like_the_embedded_engine(tmp_path, model_dir):
    root = tmp_path / "runs"
    checkpoint = adapter(root / "run-1" / "checkpoints" / "step-000004")
    (checkpoint / "manifest.json").write_text(json.dumps({"name": "p4g-single-step4", "step": 4}))
    plain = adapter(root / "plain")
    explicit = adapter(tmp_path / "elsewhere", 32)
    result = run_cli(
        "--model",
        str(model_dir),
        "--adapters",
        str(root),
        "--lora",
        f"extra={explicit}",
        "--port",
        "8001",
        "--dry-run",
        "--",
        "--max-num-seqs",
        "8",
    )
    assert result.returncode == 0, result.stderr
    command = result.stdout.split()
    assert sorted(option_values(command, "--lora-modules")) == sorted(
        [f"p4g-single-step4={checkpoint}", f"plain={plain}", f"extra={explicit}"]
    )
    assert option_values(command, "--max-lora-rank") == ["32"]
    assert option_values(command, "--served-model-name") == ["Tiny-Model"]
    assert command[-2:] == ["--max-num-seqs", "8"]


def test_cli_errors_are_clear(tmp_path, model_dir):
    missing = run_cli("--model", str(model_dir), "--python", str(tmp_path / "no-python"))
    assert missing.returncode == 2 and "make vllm" in missing.stderr
    not_model = run_cli("--model", str(tmp_path), "--dry-run")
    assert not_model.returncode == 2 and "not a Hugging Face model folder" in not_model.stderr
    bad_lora = run_cli("--model", str(model_dir), "--lora", "nameonly", "--dry-run")
    assert bad_lora.returncode == 2 and "expected NAME=PATH" in bad_lora.stderr
    no_folder = run_cli("--model", str(model_dir), "--adapters", str(tmp_path / "nope"))
    assert no_folder.returncode == 2 and "is not a folder" in no_folder.stderr


@pytest.fixture
def tokenizer_dir(tmp_path, base_model):
    """SmolLM2's config and tokenizer (its stock template ignores tools), without weights."""
    folder = tmp_path / "SmolLM2"
    folder.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(Path(base_model) / name, folder / name)
    return folder


def test_a_template_with_hermes_tools_is_served_with_the_hermes_parser(tokenizer_dir, tmp_path):
    """tool_call_parser "auto" (the default): the parser when the model's template renders
    tools in the Hermes style (Qwen3's), nothing for SmolLM2's."""
    assert not {"--enable-auto-tool-choice", "--tool-call-parser"} & set(
        build_command(tokenizer_dir, 8123, None, python="/opt/py")
    )
    # the template given to vLLM (--chat-template) is the one that counts
    given = build_command(
        tokenizer_dir, 8123, python="/opt/py", extra_args=["--chat-template", str(HERMES_TEMPLATE)]
    )
    assert "--enable-auto-tool-choice" in given
    assert option_values(given, "--tool-call-parser") == ["hermes"]
    shutil.copy(HERMES_TEMPLATE, tokenizer_dir / "chat_template.jinja")  # the folder's own
    native = build_command(tokenizer_dir, 8123, None, python="/opt/py")
    assert option_values(native, "--tool-call-parser") == ["hermes"]
    off = build_command(tokenizer_dir, 8123, None, python="/opt/py", tool_call_parser="none")
    assert "--tool-call-parser" not in off
    result = run_cli("--model", str(tokenizer_dir), "--dry-run")
    assert result.returncode == 0, result.stderr
    assert option_values(result.stdout.split(), "--tool-call-parser") == ["hermes"]


def test_vllm_caches_prefixes_and_is_sent_each_opening_prompt_once(model_dir):
    """vLLM keeps the prompts it has prefilled (--enable-prefix-caching), and a replica is sent
    each study's opening prompt, one token each, before it counts as up (issue 36, point 4)."""
    from agents.serving.fleet import warm_vllm
    from tests.support.scripted_server import ScriptedServer

    assert "--enable-prefix-caching" in build_command(model_dir, 8123, None, python="/opt/py")
    opening = {
        "model": "SmolLM2-135M-Instruct",
        "messages": [{"role": "system", "content": "Be kind."}],
        "max_tokens": 384,
        "temperature": 0.7,
    }
    with ScriptedServer([{"content": "Hi"}, {"content": "Hi"}]) as server:
        warm_vllm(server.url, [opening, {**opening, "model": "unknown"}])
    assert [r["max_tokens"] for r in server.requests] == [1, 1]
    assert [r["messages"] for r in server.requests] == [opening["messages"]] * 2
    assert not any(r.get("stream") for r in server.requests)
