"""`python -m training run CONFIG --dry-run`: the checks against real HTTP servers (the embedded
engine serving SmolLM2; the scripted server where only the wiring matters), every shipped config
offline, and the memory estimate's parameter count against SmolLM2's weights on disk."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from safetensors import safe_open

from agents.serving.process import free_port
from tests.support.processes import REPO
from tests.support.scripted_server import ScriptedServer
from training.__main__ import main
from training.tools.dryrun import (
    PUBLISHED,
    TOOL_RESULT_TOKENS,
    Architecture,
    architecture,
    dry_run,
    memory,
)

CONFIGS = sorted((REPO / "training" / "configs").rglob("*.toml"))
ACCELERATE = REPO / "training" / "accelerate"


def write_config(tmp_path: Path, base_model, heldout: str = "", extra: str = "") -> Path:
    path = tmp_path / "run.toml"
    path.write_text(
        f'name = "wiring"\ndomain = "p4g"\nbase_model = "{base_model}"\n{extra}\n'
        f'[simulator]\nname = "smollm2"\n{heldout}'
    )
    return path


def endpoint_heldout(url: str, model: str, key_env: str = "") -> str:
    key = f'api_key_env = "{key_env}"\n' if key_env else ""
    return f'[[heldout]]\nname = "remote"\nendpoint = "{url}"\nmodel = "{model}"\n{key}'


def fsdp(config: Path) -> bool:
    return 'strategy = "fsdp"' in config.read_text()


def assert_ready(result, config):
    """Every check passes, FSDP configs included (the launch shards their models)."""
    failed = [c for c in result["checks"] if not c["ok"]]
    assert result["ok"], failed
    strategy = next(c for c in result["checks"] if c["name"] == "data-parallel strategy")
    if fsdp(config):
        assert strategy["detail"].startswith("fsdp x "), strategy


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_shipped_config_passes_offline(config, capsys):
    code = main(["run", str(config), "--dry-run", "--offline", "--json"])
    assert_ready(json.loads(capsys.readouterr().out), config)
    assert code == 0


@pytest.mark.parametrize(
    ("config", "settings"),
    [
        (
            c,
            "one_node_8gpu_fsdp.yaml"
            if 'strategy = "fsdp"' in c.read_text()
            else "one_node_8gpu.yaml",
        )
        for c in CONFIGS
        if c.parent.name == "paper"
    ],
    ids=lambda v: getattr(v, "name", v),
)
def test_paper_configs_agree_with_their_accelerate_settings(config, settings):
    result = dry_run(str(config), offline=True, accelerate_config=str(ACCELERATE / settings))
    assert_ready(result, config)
    two = "two_nodes_fsdp.yaml" if "fsdp" in settings else "two_nodes.yaml"
    result = dry_run(
        str(config),
        {"distributed.processes": 16},
        offline=True,
        accelerate_config=str(ACCELERATE / two),
    )
    if "batch_tasks = 8 " in config.read_text():  # CooperBench's 8 prompts: 16 ranks idle some
        split = next(c for c in result["checks"] if c["name"] == "tasks split across ranks")
        assert not split["ok"] and "some ranks would have no task" in split["detail"]
        return
    assert_ready(result, config)


def test_accelerate_settings_that_disagree_fail(tmp_path, base_model):
    config = write_config(tmp_path, base_model)
    result = dry_run(
        str(config), offline=True, accelerate_config=str(ACCELERATE / "one_node_8gpu_fsdp.yaml")
    )
    check = next(c for c in result["checks"] if c["name"] == "accelerate settings")
    assert not check["ok"]
    assert "distributed_type = FSDP but the config's distributed.strategy = ddp" in check["detail"]


def test_accelerate_process_count_wins_as_in_the_launch(tmp_path, base_model):
    """One task for 8 processes: the launch gives 7 ranks nothing, whatever the config says."""
    config = write_config(tmp_path, base_model)
    result = dry_run(
        str(config), offline=True, accelerate_config=str(ACCELERATE / "one_node_8gpu.yaml")
    )
    checks = {c["name"]: c for c in result["checks"]}
    assert checks["accelerate settings"]["ok"]
    assert "wins over distributed.processes = 1" in checks["accelerate settings"]["detail"]
    assert not checks["tasks split across ranks"]["ok"]
    assert result["memory"]["processes"] == 8


def test_invalid_config_fails_with_its_key(tmp_path, base_model, capsys):
    config = write_config(tmp_path, base_model, extra="group_sise = 4")
    assert main(["run", str(config), "--dry-run", "--offline", "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert not result["ok"] and "group_sise" in result["checks"][0]["detail"]


def test_memory_that_does_not_fit_fails(tmp_path, base_model, capsys):
    config = write_config(tmp_path, base_model)
    assert main(["run", str(config), "--dry-run", "--offline", "--device-memory", "0.5"]) == 1
    assert "FAIL  memory per device" in capsys.readouterr().out


def test_estimate_counts_smollm2_parameters_as_its_weights_do(base_model):
    with safe_open(Path(base_model) / "model.safetensors", "pt") as weights:
        actual = 0
        for name in weights.keys():
            n = 1
            for size in weights.get_slice(name).get_shape():
                n *= size
            actual += n
    from_disk, source = architecture(base_model)
    assert source.endswith("config.json")
    assert from_disk.parameters() == actual
    assert PUBLISHED["SmolLM2-135M-Instruct"][0].parameters() == actual


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_architectures_give_the_published_counts(name):
    arch, published = PUBLISHED[name]
    assert arch.parameters() == published


def test_lora_and_shards_in_the_estimate(tmp_path, base_model):
    from training.config import load_config

    config = load_config(write_config(tmp_path, base_model))
    arch = Architecture.from_config_json(Path(base_model) / "config.json")
    # r (fan_in + fan_out) per targeted projection per layer: q, k, v, o of SmolLM2 at r = 8
    assert memory(config)["lora_parameters"] == 30 * 8 * ((576 + 576) * 2 + (576 + 192) * 2)
    assert arch.lora_parameters(8, ["q_proj"]) == 30 * 8 * (576 + 576)
    ddp = memory(load_config(write_config(tmp_path, base_model), {"distributed.processes": 4}))
    fsdp = memory(
        load_config(
            write_config(tmp_path, base_model),
            {"distributed.processes": 4, "distributed.strategy": "fsdp"},
        )
    )
    # the agent's weights are sharded; the in-process simulator's frozen copy is whole on each
    assert fsdp["weights"] == pytest.approx(ddp["weights"] / 2 / 4 + ddp["weights"] / 2)
    # the same passes; FSDP's logits keep 12 bytes a trained position's logit, the plain head's
    # chunks 8 (logprobs.token_logprobs)
    s, t, v = fsdp["sequence_length"], fsdp["trained_tokens"], 49152
    logits = fsdp["micro_batch"] * min(s, fsdp["micro_batch"] * t) * v
    gap = fsdp["activations_checkpointing_off"] - ddp["activations_checkpointing_off"]
    assert gap == logits * 4


def test_full_fine_tuning_under_fsdp_shards_weights_gradients_adam_and_reference(
    tmp_path, base_model
):
    from training.config import load_config

    path = write_config(tmp_path, base_model, extra="beta = 0.01")
    b, p = 4, PUBLISHED["SmolLM2-135M-Instruct"][1]
    full = {"finetune": "full", "distributed.processes": 4}
    ddp = memory(load_config(path, full))
    fsdp = memory(load_config(path, {**full, "distributed.strategy": "fsdp"}))
    # gradient + AdamW m, v + the reference copy (beta > 0), in float32, per rank
    assert ddp["trainable_state"] == 4 * p * b
    assert fsdp["trainable_state"] == 4 * p * b / 4
    assert fsdp["gathered"] == p * b  # summon_full_params: the whole weights beside the shard
    no_kl = memory(load_config(path, {**full, "distributed.strategy": "fsdp", "beta": 0.0}))
    assert no_kl["trainable_state"] == 3 * p * b / 4


def test_mixed_precision_counts_float32_master_state_and_a_16_bit_compute_copy(
    tmp_path, base_model
):
    """Trained weights, gradients and AdamW m, v at 4 + 4 + 8 bytes (sharded), the frozen
    reference copy in bf16, FSDP's bf16 units (root + one layer) or one process's bf16 copy of
    every weight, and summon_full_params' float32 gathered weights."""
    from training.config import load_config

    path = write_config(tmp_path, base_model, extra="beta = 0.01")
    arch, p = PUBLISHED["SmolLM2-135M-Instruct"]
    full = {"finetune": "full", "distributed.processes": 4, "dtype": "bfloat16"}
    fsdp = {**full, "distributed.strategy": "fsdp"}
    plain = memory(load_config(path, fsdp))
    mixed = memory(load_config(path, {**fsdp, "mixed_precision": True}))
    assert plain["compute_copy"] == 0 and mixed["mixed_precision"]
    frozen = plain["weights"] - p * 2 / 4  # the in-process simulator's bf16 copy, whole
    assert mixed["weights"] == pytest.approx(p * 4 / 4 + frozen)
    assert mixed["trainable_state"] == (3 * p * 4 + p * 2) / 4  # + the bf16 reference copy
    root = arch.vocab * arch.hidden + arch.hidden  # tied embeddings and the final norm
    assert mixed["compute_copy"] == (root + (p - root) // arch.layers) * 2
    assert mixed["gathered"] == p * 4
    assert mixed["activations_checkpointing_off"] == plain["activations_checkpointing_off"]
    update = mixed["activations_checkpointing_off"] + mixed["compute_copy"]
    phases = mixed["phases_checkpointing_off"]
    assert phases["update"] == pytest.approx(mixed["weights"] + mixed["trainable_state"] + update)
    assert mixed["total_checkpointing_off"] == max(phases.values())
    one = memory(load_config(path, {**full, "distributed.processes": 1, "mixed_precision": True}))
    assert one["compute_copy"] == p * 2 and one["trainable_state"] == 3 * p * 4 + p * 2
    # float32 has nothing to mix
    same = memory(load_config(path, {**fsdp, "dtype": "float32", "mixed_precision": True}))
    assert same == {
        **memory(load_config(path, {**fsdp, "dtype": "float32"})),
        "mixed_precision": False,
    }


def test_a_cotrained_simulator_is_counted_once_and_a_population_its_swap(tmp_path, base_model):
    """A co-trained simulator is its trainable copy only (no frozen copy beside it); Population
    copies the live simulator's weights aside while a pool snapshot samples, on the gathered
    weights."""
    from training.config import load_config

    path = write_config(tmp_path, base_model)
    p = PUBLISHED["SmolLM2-135M-Instruct"][1]
    fsdp = {"finetune": "full", "distributed.processes": 4, "distributed.strategy": "fsdp"}
    single = memory(load_config(path, fsdp))  # the agent sharded, its simulator a frozen copy
    cotrain = memory(load_config(path, {**fsdp, "regime": "cotrain"}))
    assert cotrain["weights"] == single["weights"] - p * 4 + p * 4 / 4
    population = memory(load_config(path, {**fsdp, "regime": "population"}))
    assert population["pool_swap"] == p * 4 and cotrain["pool_swap"] == 0
    assert population["gathered"] == cotrain["gathered"] + p * 4


def test_full_fine_tuning_in_bfloat16_at_a_small_rate_fails_the_dry_run(tmp_path, base_model):
    path = write_config(tmp_path, base_model, extra='finetune = "full"\nlr = 1e-6')
    lost = dry_run(str(path), {"dtype": "bfloat16"}, offline=True)
    [check] = [c for c in lost["checks"] if c["name"] == "full fine-tuning precision"]
    assert not lost["ok"] and not check["ok"] and "set mixed_precision = true" in check["detail"]
    kept = dry_run(str(path), {"dtype": "float32"}, offline=True)
    assert [c["ok"] for c in kept["checks"] if c["name"] == "full fine-tuning precision"] == [True]
    # float32 master weights under bf16 passes keep the steps
    mixed = dry_run(str(path), {"dtype": "bfloat16", "mixed_precision": True}, offline=True)
    [check] = [c for c in mixed["checks"] if c["name"] == "full fine-tuning precision"]
    assert check["ok"] and "float32 master weights" in check["detail"]
    lora = dry_run(str(path), {"dtype": "bfloat16", "finetune": "lora"}, offline=True)
    assert [c["ok"] for c in lora["checks"] if c["name"] == "full fine-tuning precision"] == [True]


def test_served_model_on_the_real_engine_is_ready(tmp_path, base_model, engine_url, capsys):
    served = httpx.get(f"{engine_url}/models", timeout=30).json()["data"][0]["id"]
    config = write_config(tmp_path, base_model, endpoint_heldout(engine_url, served))
    assert main(["run", str(config), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"ok    held-out remote model: {served} is served" in out


def test_unserved_model_fails_with_the_served_list(tmp_path, base_model, monkeypatch, capsys):
    monkeypatch.setenv("PANEL_KEY", "sk-secret-value")
    with ScriptedServer([], models=["qwen3-8b", "sim-adapter"]) as server:
        config = write_config(
            tmp_path, base_model, endpoint_heldout(server.url, "gpt-5-mini", "PANEL_KEY")
        )
        assert main(["run", str(config), "--dry-run"]) == 1
    out = capsys.readouterr().out
    assert (
        "FAIL  held-out remote model: gpt-5-mini is not served (served: qwen3-8b, sim-adapter)"
        in out
    )
    assert server.model_list_headers[-1]["authorization"] == "Bearer sk-secret-value"
    assert "sk-secret-value" not in out


def test_missing_key_variable_fails_without_asking(tmp_path, base_model, monkeypatch):
    monkeypatch.delenv("PANEL_KEY", raising=False)
    config = write_config(
        tmp_path, base_model, endpoint_heldout("http://127.0.0.1:9/v1", "m", "PANEL_KEY")
    )
    result = dry_run(str(config))
    assert {
        "name": "held-out remote endpoint",
        "ok": False,
        "detail": "environment variable PANEL_KEY is not set",
    } in result["checks"]


def test_unreachable_endpoint_fails_with_its_url(tmp_path, base_model):
    url = f"http://127.0.0.1:{free_port()}/v1"
    config = write_config(tmp_path, base_model, endpoint_heldout(url, "gpt-5-mini"))
    result = dry_run(str(config), timeout=2)
    check = next(c for c in result["checks"] if c["name"] == "held-out remote endpoint")
    assert not check["ok"] and f"GET {url}/models failed" in check["detail"]
    assert not result["ok"]
    # offline, the endpoint is not asked and the rest holds
    assert dry_run(str(config), offline=True)["ok"]


def test_agent_sampler_serves_the_base_model(tmp_path, base_model):
    """vLLM lists the base model under the path it was started with; the adapter is loaded at
    run time, so only the base is asked for."""
    with ScriptedServer([], models=[str(base_model)]) as server:
        config = write_config(tmp_path, base_model, extra=f'rollout_endpoint = "{server.url}"')
        assert dry_run(str(config))["ok"]
    with ScriptedServer([], models=["Qwen3-8B"]) as server:
        config = write_config(tmp_path, base_model, extra=f'rollout_endpoint = "{server.url}"')
        result = dry_run(str(config))
    assert {
        "name": "agent sampler model",
        "ok": False,
        "detail": f"{base_model} is not served (served: Qwen3-8B)",
    } in result["checks"]


def test_cotrained_simulator_sampler_serves_its_base_model(tmp_path, base_model):
    """A co-trained simulator on vLLM: its server must serve the simulator's base model (its
    adapters are loaded at run time), and its base must be a folder here (it learns here)."""
    extra = 'regime = "cotrain"\n'
    sim = f'endpoint = "URL"\nmodel = "{base_model}"\n'
    for served, ok in ((str(base_model), True), ("Qwen3-8B", False)):
        with ScriptedServer([], models=[served]) as server:
            config = write_config(tmp_path, base_model, sim.replace("URL", server.url), extra)
            result = dry_run(str(config))
        check = next(c for c in result["checks"] if c["name"] == "simulator sampler model")
        assert (check["ok"], result["ok"]) == (ok, ok), result["checks"]
    assert {"name": "simulator model", "ok": True, "detail": str(base_model)} in result["checks"]


def test_missing_domain_data_fails_online_only(tmp_path, base_model):
    config = write_config(tmp_path, base_model, extra=f'domain_data = "{tmp_path / "absent"}"')
    assert not dry_run(str(config))["ok"]
    assert dry_run(str(config), offline=True)["ok"]


def test_a_missing_embedding_model_fails_online_only(tmp_path, base_model):
    absent = tmp_path / "absent"
    config = write_config(tmp_path, base_model, heldout=f'[collapse]\nembedding_model = "{absent}"')
    result = dry_run(str(config))
    assert {
        "name": "embedding model",
        "ok": False,
        "detail": f"{absent}: no config.json there",
    } in result["checks"]
    assert dry_run(str(config), offline=True)["ok"]


def test_dry_run_flags_without_dry_run_are_refused(tmp_path, base_model, capsys):
    config = write_config(tmp_path, base_model)
    assert main(["run", str(config), "--offline"]) == 2
    assert "need --dry-run" in capsys.readouterr().err


def test_every_phase_is_counted_and_one_that_does_not_fit_is_named(tmp_path, base_model, capsys):
    """Rollout, update, checkpoint and evaluation each get a figure; the check fails naming the
    phase that does not fit (here the rollout: 64 conversations open at once)."""
    from training.config import load_config

    config = write_config(tmp_path, base_model, extra="group_size = 64\nmax_new_tokens = 256")
    wide = memory(load_config(config))["phases_checkpointing_off"]
    bounded = memory(load_config(config, {"rollouts_at_once": 8}))["phases_checkpointing_off"]
    # a device between: room for every other phase and for 8 open conversations, not for 64
    room = max(bounded.values()) * 1.05
    assert wide["rollout"] > room and max(v for k, v in wide.items() if k != "rollout") < room
    gib = f"{room / 2**30:.3f}"
    args = ["run", str(config), "--dry-run", "--offline", "--json", "--device-memory", gib]
    assert main(args) == 1
    result = json.loads(capsys.readouterr().out)
    check = next(c for c in result["checks"] if c["name"] == "memory per device")
    assert check["detail"].startswith("the rollout phase does not fit")
    assert set(result["memory"]["phases_gib"]) == {"rollout", "update", "checkpoint"}
    # bounded by rollouts_at_once: 8 open conversations fit where 64 did not
    assert main([*args, "--set", "rollouts_at_once=8"]) == 0


def test_rollout_kv_is_the_open_transcripts_in_the_compute_dtype(tmp_path, base_model):
    """Each open conversation's carried caches (agent and in-process user) and a turn's prefill
    and decoding buffers, at 2 * layers * kv_heads * head_dim per token in the compute dtype:
    bfloat16 under mixed precision (sampling.kv_dtype), half of float32's; rollouts_at_once
    divides it."""
    from training.config import load_config

    path = write_config(tmp_path, base_model, extra="group_size = 8\nmax_new_tokens = 64")
    arch = PUBLISHED["SmolLM2-135M-Instruct"][0]
    token = 2 * arch.layers * arch.kv_heads * arch.head_dim
    mixed = memory(load_config(path, {"dtype": "bfloat16", "mixed_precision": True}))
    s = mixed["sequence_length"]
    assert mixed["rollout_kv"] == 8 * (s * 2 * token * 2 + (2 * s + 64) * token * 2)
    plain = memory(load_config(path))
    assert plain["rollout_kv"] == 2 * mixed["rollout_kv"]  # float32
    four = memory(
        load_config(path, {"dtype": "bfloat16", "mixed_precision": True, "rollouts_at_once": 2})
    )
    assert four["open_conversations"] == 2 and four["rollout_kv"] == mixed["rollout_kv"] / 4


def test_tau2_tool_results_count_at_their_measured_size(tmp_path, base_model):
    """A tau2 conversation may hold max_tool_rounds tool calls per agent turn, each with its
    result (TOOL_RESULT_TOKENS, bench/tool_result_tokens.py), within the Domain's max_steps."""
    from training.config import load_config
    from training.tools.dryrun import sequence_length

    path = tmp_path / "retail.toml"
    path.write_text(write_config(tmp_path, base_model).read_text().replace("p4g", "retail"))
    one = load_config(path, {"max_turns": 10, "max_tool_rounds": 1, "max_new_tokens": 100})
    prompt, turns = 4096, 5 * 100 + 5 * one.simulator.max_new_tokens
    assert sequence_length(one) == prompt + turns + 5 * (100 + TOOL_RESULT_TOKENS["retail"])
    # 30 messages and up to 4 rounds per agent turn: tau2's 100 messages leave 35 rounds
    many = load_config(path, {"max_turns": 30, "max_tool_rounds": 4, "max_new_tokens": 100})
    tools = sequence_length(many) - 4096 - 15 * 100 - 15 * many.simulator.max_new_tokens
    assert tools == 35 * (100 + TOOL_RESULT_TOKENS["retail"])


def test_a_vllm_server_on_the_same_gpus_leaves_less_room(tmp_path, base_model):
    """distributed.colocated_server_share: a vLLM server holding that share of each GPU (its
    --gpu-memory-utilization) leaves the rest to every phase."""
    config = write_config(tmp_path, base_model, extra='device = "cuda"')
    alone = dry_run(str(config), offline=True, device_gib=4)
    need = alone["memory"]["total_checkpointing_off_gib"]
    assert alone["ok"] and need < 4
    share = 1 - need / 4 / 2  # leaves half of what the run needs
    shared = dry_run(
        str(config), {"distributed.colocated_server_share": share}, offline=True, device_gib=4
    )
    check = next(c for c in shared["checks"] if c["name"] == "memory per device")
    assert not check["ok"] and "beside a vLLM server holding" in check["detail"]
