"""`python -m training run CONFIG --dry-run [--offline] [--json]`: check a run's wiring in seconds,
before a node's GPUs wait on a typo. Each check is one `Check` (ok or not, with the reason); the
run is ready when every check holds.

Offline (no network, no weights): the config is valid, the accelerate settings file (if given)
is one accelerate reads and agrees with the config (its num_processes, when given, is the count
the rest is checked for, as the launch uses it), every rank gets at least one task,
and the memory per device (below) fits. Online, in addition: every OpenAI-compatible endpoint
the config names answers GET /v1/models (with the key from the variable it names; the key is
never printed) and serves the named model or adapter; every frozen simulator on an endpoint
(the training simulator, the held-out panel) answers one tiny chat request shaped exactly as
its turns will be (its provider's shaping, agents/llm/providers.py, its temperature, top_p,
token cap, reasoning effort, Verbalized Sampling's response_format), so a parameter the
provider refuses is reported with the provider's own message before any step is taken; in-process
models and adapters are folders on disk.

Memory per device, by phase (bytes; b = bytes per weight of `dtype`, P = a model's parameters,
N = `distributed.processes`, shard = N under FSDP else 1; w = the trained models' bytes per
weight: 4 under mixed_precision (float32 master weights), else b; U = a model's largest FSDP
unit, the root: embeddings, output head, final norm). The check fails naming every phase that
does not fit the device (less a colocated vLLM server's share):

    resident     = weights + LoRA or full state, held in every phase:
      weights    = P_trained * w / shard + P_frozen * b   trained models sharded, frozen copies whole
      LoRA       = 16 * P_lora / shard        fp32 adapter 4 + gradient 4 + AdamW m, v 8
      full       = 3 * P_trained * w / shard  gradient + AdamW m, v (+ P * b / shard per reference
                                              copy: the agent's when beta > 0, a co-trained
                                              simulator's when simulator_beta > 0)
    gather(P)    = FSDP: P * w (summon_full_params: the whole weights beside the shard); else 0
    staging(U)   = FSDP: U * w (a unit's all-gather, while it lasts)
    cast(P)      = mixed precision: P * b (autocast's 16-bit copies while a trained model samples)
    KV(n, s)     = n * (s * (k_agent + k_user) + (2 s + max_new_tokens) * max(k_agent, k_user))
                   k = 2 * layers * kv_heads * head_dim * b per token, in the compute dtype; every
                   open conversation's carried caches, and a turn's prefill and decoding buffers

    rollout      = resident + sum gather(P) over the in-process samplers + max (staging + cast)
                   + KV(rollouts_at_once, s) + Population's swap (a LoRA copy; a full model's goes
                   to host memory)
    update       = resident + activations + compute, or a full reference copy gathered (the larger)
      activations= off: L * s * m * h * 34 * b/2;  on: L * s * m * h * b + s * m * h * 34 * b/2
                   + m * min(s, m * T) * V * 12   (logits at the trained positions only: the fp32
                                                   log-softmax, its incoming and outgoing gradient;
                                               8 in one process, whose head runs in chunks)
      compute    = mixed_precision: the 16-bit weights of one FSDP unit (root + one layer), or of
                   the whole model in one process
    checkpoint   = resident + max(gather(P) + staging(U), 2 * U * w)   (the weights gathered to
                   write them; the optimizer state gathered one unit's m and v at a time to rank 0's
                   host memory, where the whole m and v and a copy of the weights wait for the file)
    evaluation   = resident + gather(P_agent) + staging + cast + KV(min(rollouts_at_once,
                   eval_samples), s): every rank plays its share of the panel's (member, task) units

L layers, h hidden size, V vocabulary, m = `micro_batch`, T = trained_tokens (the most tokens of
one conversation a model trains on), P_lora = r * (fan_in + fan_out) over the targeted
projections of every layer. 34 s m h (16-bit) is one transformer layer's saved activations
without the attention matrix (Korthikanti et al. 2022, with fused attention as SDPA/flash
gives); checkpointing keeps only each layer's input and recomputes one layer at a time. s is
sequence_length: the longest conversation the config allows (PROMPT_TOKENS, every turn at its
cap, tau2's tool calls with results of TOOL_RESULT_TOKENS). P_trained is the models that learn
(the agent; a co-trained simulator), P_frozen every other in-process model copy, one per
distinct (model, adapter) among the frozen in-process simulators (training and held-out). The
staging, cast and logit terms were measured (bench/phase_memory.py: 2 FSDP processes on CPU,
each phase within 20% of these formulas; docs/results/phase_memory.md). The figure checked is
the one with the run's `gradient_checkpointing`; docs/paper.md has the same text.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any

from agents.domains.tau2.taskset import TAU2_DOMAINS
from agents.simulators.spec import SimulatorKind, SimulatorSpec
from training.config import load_config
from training.config_keys import ConfigError
from training.config_schema import RunConfig, simulator_api_key
from training.vocabulary import Regime

BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
GIB = 1024**3
# Assumed device size when no GPU is visible (offline, or a login node): an 80 GB A100/H100.
DEFAULT_GPU_GIB = 80.0


@dataclasses.dataclass(frozen=True)
class Architecture:
    """What the memory estimate needs of a decoder-only transformer (Llama/Qwen layout)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    qk_norm: bool = False  # Qwen3 normalises q and k per head (2 * head_dim weights per layer)

    @classmethod
    def from_config_json(cls, path: Path) -> Architecture:
        c = json.loads(path.read_text())
        heads = c["num_attention_heads"]
        return cls(
            hidden=c["hidden_size"],
            layers=c["num_hidden_layers"],
            heads=heads,
            kv_heads=c.get("num_key_value_heads", heads),
            head_dim=c.get("head_dim") or c["hidden_size"] // heads,
            intermediate=c["intermediate_size"],
            vocab=c["vocab_size"],
            tied=bool(c.get("tie_word_embeddings", False)),
            qk_norm=c.get("model_type") == "qwen3",
        )

    def projections(self) -> dict[str, tuple[int, int]]:
        """(fan_in, fan_out) of each linear layer of one block, by its module name."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        h, i = self.hidden, self.intermediate
        return {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def parameters(self) -> int:
        block = sum(a * b for a, b in self.projections().values()) + 2 * self.hidden
        block += 2 * self.head_dim if self.qk_norm else 0
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return embeddings + self.layers * block + self.hidden  # + the final norm

    def lora_parameters(self, r: int, targets: list[str]) -> int:
        shapes = self.projections()
        return self.layers * sum(r * sum(shapes[t]) for t in targets if t in shapes)


# Published architectures (each model's config.json on the Hugging Face Hub) of the models the
# shipped configs name, used when the weights are not on this machine; `published` is the
# parameter count the model card states, which `parameters()` reproduces (tests check).
PUBLISHED: dict[str, tuple[Architecture, int]] = {
    "Qwen3-4B-Instruct-2507": (
        Architecture(2560, 36, 32, 8, 128, 9728, 151936, tied=True, qk_norm=True),
        4_022_468_096,
    ),
    "Qwen3-8B": (
        Architecture(4096, 36, 32, 8, 128, 12288, 151936, tied=False, qk_norm=True),
        8_190_735_360,
    ),
    "SmolLM2-135M-Instruct": (Architecture(576, 30, 9, 3, 64, 1536, 49152, tied=True), 134_515_008),
}

# Models whose published layout the Architecture above does not describe: an approximation of
# each, with what it leaves out. Qwen3.5-27B (the release's CooperBench agent) has the sizes of
# THUDM/slime scripts/models/qwen3.5-27B.sh (64 layers, hidden 5120, 24 heads of 256, 4 KV
# groups, FFN 17408, vocabulary 248,320, untied) but puts Gated DeltaNet in three of every four
# layers and an output gate on attention; counted as dense attention layers it has 24.4B of the
# card's 27B parameters, so its memory estimate is low by about a tenth (the config says so).
APPROXIMATE: dict[str, tuple[Architecture, str]] = {
    "Qwen3.5-27B": (
        Architecture(5120, 64, 24, 4, 256, 17408, 248320, tied=False, qk_norm=True),
        "approximate size of Qwen3.5-27B (dense layers of its published sizes: about 24.4B of"
        " its 27B parameters; training/tools/dryrun.py APPROXIMATE)",
    ),
}

# Tool results' size in tokens per Domain: the 90th percentile of every result of a read tool
# that returns a record, over the Domain's bundled data, with SmolLM2's tokenizer (bench/
# tool_result_tokens.py prints them: retail's order 413 / product 348 / user 240 at the median,
# 499 over all; airline's user 314 / reservation 284 / one-stop search 301 at p90, 305 over all).
# The official tau2 data's records are of the same shapes; Qwen3's tokenizer counts JSON alike.
TOOL_RESULT_TOKENS = {"retail": 499, "airline": 305}

# Rough prompt length (system prompt with the policy and tool schemas, in tokens) per Domain.
PROMPT_TOKENS = {
    "p4g": 512,
    "p4g-decision": 512,
    "retail": 4096,
    "airline": 4096,
    "cooperbench": 2048,  # the instructions, a feature request and six tool schemas
}
DEFAULT_PROMPT_TOKENS = 2048


@dataclasses.dataclass
class Check:
    name: str
    ok: bool
    detail: str


def architecture(model: Path | str) -> tuple[Architecture, str]:
    """A model's architecture and where it came from: its config.json on disk, else the table
    (by folder name, as the Hub names it). KeyError when neither knows it."""
    path = Path(model).expanduser()
    if (path / "config.json").is_file():
        return Architecture.from_config_json(path / "config.json"), str(path / "config.json")
    if path.name in PUBLISHED:
        return PUBLISHED[path.name][0], f"published size of {path.name}"
    if path.name in APPROXIMATE:
        return APPROXIMATE[path.name]
    known = ", ".join([*PUBLISHED, *APPROXIMATE])
    raise KeyError(f"{model}: no config.json there and not a model of known size ({known})")


def sequence_length(config: RunConfig) -> int:
    """The longest conversation the config allows, in tokens: the prompt, every agent and user
    turn at its cap, and on a Domain with measured tool results (TOOL_RESULT_TOKENS) up to
    max_tool_rounds tool calls per agent turn, each at the agent's cap with its result, as
    many as the Domain's own message limit (max_steps) leaves."""
    from agents.domains import domain_class

    cls = domain_class(config.domain)
    turns = min(config.max_turns, cls.max_turns)
    agent_turns, user_turns = math.ceil(turns / 2), turns // 2
    prompt = PROMPT_TOKENS.get(config.domain, DEFAULT_PROMPT_TOKENS)
    # the longest reply of any simulator the agent trains against (an Ensemble has K)
    user = max(
        # the conversation keeps one of a Verbalized simulator's k candidates
        math.ceil(s.max_new_tokens / s.k)
        if s.kind == SimulatorKind.VERBALIZED
        else s.max_new_tokens
        for s in config.training_simulators()
    )
    tools = 0
    if config.domain in TOOL_RESULT_TOKENS:
        rounds = agent_turns * config.max_tool_rounds
        steps = getattr(cls, "max_steps", None)
        if steps:  # a call and its result are two of the conversation's messages
            rounds = min(rounds, max(0, steps - turns) // 2)
        tools = rounds * (config.max_new_tokens + TOOL_RESULT_TOKENS[config.domain])
    return prompt + agent_turns * config.max_new_tokens + user_turns * user + tools


def trained_tokens(config: RunConfig) -> int:
    """The most tokens of one conversation a model trains on: the agent's turns and tool calls
    at its cap (sequence_length's counts), or a co-trained simulator's turns at its cap."""
    from agents.domains import domain_class

    cls = domain_class(config.domain)
    turns = min(config.max_turns, cls.max_turns)
    agent_turns, user_turns = math.ceil(turns / 2), turns // 2
    rounds = 0
    if config.domain in TOOL_RESULT_TOKENS:
        rounds = agent_turns * config.max_tool_rounds
        steps = getattr(cls, "max_steps", None)
        if steps:
            rounds = min(rounds, max(0, steps - turns) // 2)
    agent = (agent_turns + rounds) * config.max_new_tokens
    user = user_turns * config.simulator.max_new_tokens if config.trains_simulator else 0
    return max(agent, user)


def _in_process(spec: SimulatorSpec) -> bool:
    return spec.kind != SimulatorKind.SCRIPTED and not spec.endpoint


def mixed(config: RunConfig) -> bool:
    """Whether the trained models keep float32 master weights under 16-bit passes."""
    return config.mixed_precision and config.dtype != "float32"


def kv_bytes_per_token(arch: Architecture, b: int) -> int:
    """One token's keys and values over every layer, in the compute dtype (b bytes):
    training/rl/sampling.py keeps them so (kv_dtype)."""
    return 2 * arch.layers * arch.kv_heads * arch.head_dim * b


def open_conversations(config: RunConfig) -> int:
    """How many conversations a rank plays at once in training: rollouts_at_once, at most G."""
    return min(config.rollouts_at_once or config.group_size, config.group_size)


def evaluation_conversations(config: RunConfig) -> int:
    """How many held-out conversations a rank plays at once: the panel's (member, task) units
    are shared across the ranks and each plays eval_samples conversations of one task
    (training/measures/held_out.py), at most rollouts_at_once at a time."""
    return min(config.rollouts_at_once or config.eval_samples, config.eval_samples)


def memory(config: RunConfig, sequence: int | None = None) -> dict[str, Any]:
    """The estimate of the module docstring, in bytes and GiB, per device: each phase's figure
    (`phases`), the largest of them (`total_checkpointing_*`), and the terms they sum."""
    b = BYTES[config.dtype]
    w = BYTES["float32"] if mixed(config) else b  # the trained models' weights
    n = config.distributed.processes
    shard = n if config.distributed.strategy == "fsdp" else 1
    agent, source = architecture(config.base_model_path())
    p_agent = agent.parameters()
    # a co-trained simulator is its trainable Policy (counted below), not a frozen copy too
    frozen = [] if config.trains_simulator else config.training_simulators()
    copies = {
        (str(s.model or config.base_model_path()), s.adapter)
        for s in [*frozen, *config.heldout]
        if _in_process(s)
    }
    p_frozen = 0
    for model, _adapter in sorted(copies):
        p_frozen += architecture(model)[0].parameters()
    trainable = [(agent, config.beta)]  # each learning model and its KL weight
    sim = None
    if config.trains_simulator:
        sim = architecture(config.simulator_model_path())[0]
        trainable.append((sim, config.simulator_beta))
    p_trained = sum(a.parameters() for a, _ in trainable)
    out: dict[str, Any] = {
        "model": str(config.base_model_path()),
        "source": source,
        "parameters": p_agent,
        "processes": n,
        "strategy": config.distributed.strategy,
        "sequence_length": sequence or sequence_length(config),
        "tool_result_tokens": TOOL_RESULT_TOKENS.get(config.domain, 0),
        "micro_batch": config.micro_batch,
        "mixed_precision": mixed(config),
        "weights": p_trained * w / shard + p_frozen * b,
    }
    if config.finetune == "lora":
        p_lora = sum(a.lora_parameters(config.lora.r, config.lora.targets) for a, _ in trainable)
        out["lora_parameters"] = p_lora
        out["trainable_state"] = 16 * p_lora / shard
    else:
        p_ref = sum(a.parameters() for a, beta in trainable if beta > 0)
        out["trainable_state"] = (3 * p_trained * w + p_ref * b) / shard
    resident = out["weights"] + out["trainable_state"]
    s, m = out["sequence_length"], config.micro_batch
    # logits only where a row of the micro-batch has a token it trains on (logprobs.token_logprobs):
    # the union of the rows' trained positions, for each row; the fp32 log-softmax kept for the
    # backward pass, its incoming and its outgoing gradient (12 B a logit); one process's plain
    # head runs the trained positions in chunks (8 B, an upper bound there)
    trained = trained_tokens(config)
    out["trained_tokens"] = trained
    logits = m * min(s, m * trained) * agent.vocab * (12 if shard > 1 else 8)
    layer = s * m * agent.hidden * 34 * b / 2
    out["activations_checkpointing_off"] = agent.layers * layer + logits
    out["activations_checkpointing_on"] = agent.layers * s * m * agent.hidden * b + layer + logits
    out["compute_copy"] = 0
    if mixed(config):  # the update's 16-bit weights, one model's update at a time
        unit = lambda a: a.parameters() if shard == 1 else _root_and_layer(a)  # noqa: E731
        out["compute_copy"] = max(unit(a) for a, _ in trainable) * b
    # FSDP's summon_full_params: a model's whole float32 weights beside its own shard
    gather = (lambda p: p * w) if shard > 1 else (lambda p: 0)  # noqa: E731
    # while a unit is gathered, the all-gather's staging copy of it (measured on gloo: entering
    # summon_full_params peaks one unit above the whole weights)
    staging = (lambda a: _unit(a) * w) if shard > 1 else (lambda a: 0)  # noqa: E731
    # autocast's cache of 16-bit copies of float32 weights that require grad, while a trained
    # model samples under mixed precision (kept for one sample() call's autocast block: one
    # model's at a time)
    cast = (lambda a: a.parameters() * b) if mixed(config) else (lambda a: 0)  # noqa: E731
    out["gathered"] = gather(p_trained)
    out["pool_swap"] = 0
    # the live simulator, copied aside while a snapshot samples
    if config.regime == Regime.POPULATION:
        lora = sim.lora_parameters(config.lora.r, config.lora.targets) * 4
        # a full model is copied aside to host memory (Policy.adapter_state), an adapter on
        # the device; on a CPU run host memory is the device's
        on_device = config.finetune != "full" or not config.device.startswith("cuda")
        out["pool_swap"] = (sim.parameters() * w if config.finetune == "full" else lora) * on_device
        out["gathered"] += out["pool_swap"]

    # rollout: the in-process samplers' gathered weights and every open transcript's KV cache
    samplers = [] if config.rollout_endpoint else [agent]
    user = None  # the architecture sampling the user's turns in this process, if any
    if config.trains_simulator:
        user = sim
        if not config.simulator.endpoint:
            samplers.append(sim)
    elif any(_in_process(spec) for spec in config.training_simulators()):
        spec = next(spec for spec in config.training_simulators() if _in_process(spec))
        user = architecture(spec.model or config.base_model_path())[0]
    rows = open_conversations(config)
    out["open_conversations"] = rows
    out["rollout_kv"] = _kv(
        None if config.rollout_endpoint else agent, user, rows, s, config.max_new_tokens, b
    )
    out["rollout_gathered"] = (
        sum(gather(a.parameters()) for a in samplers)
        + max((staging(a) + cast(a) for a in samplers), default=0)
        + out["pool_swap"]
    )
    out["rollout_logits"] = _sampling_logits(agent, rows)
    rollout = resident + out["rollout_gathered"] + out["rollout_kv"] + out["rollout_logits"]

    # update: one model's passes at a time; the reference copy gathered for its own pass
    reference = max(
        (
            gather(a.parameters()) * b / w
            for a, beta in trainable
            if beta > 0 and config.finetune == "full"
        ),
        default=0,
    )
    # checkpoint: a model's whole weights gathered to write them, and its AdamW m and v
    # gathered one FSDP unit at a time to rank 0's host memory (optimizer_state)
    largest = max(a.parameters() for a, _ in trainable)
    # optimizer_state: one unit's m and v gathered on every rank at a time (rank0_only drops
    # them on the others)
    big = max((a for a, _ in trainable), key=lambda a: a.parameters())
    optimizer_unit = 0 if config.finetune == "lora" or shard == 1 else 2 * _unit(big) * w
    out["checkpoint_gathered"] = max(gather(largest) + staging(big), optimizer_unit)
    # host memory on rank 0 (the device's own on a CPU run): the whole m and v of the model
    # being saved and the copy of its weights written to disk (a full model)
    p_state = (
        sum(a.lora_parameters(config.lora.r, config.lora.targets) for a, _ in trainable[-1:])
        if config.finetune == "lora"
        else largest
    )
    # every trained model's m and v stay in host memory until the state file is written
    p_all = p_state * len(trainable) if config.finetune == "full" else p_state
    out["checkpoint_host"] = (2 * p_all * 4 + p_state * w) if shard > 1 else 0
    # evaluation: every rank plays its share of the panel on the agent's gathered weights; its
    # open conversations' KV caches, a frozen panel member's own
    heldout_user = next(
        (
            architecture(spec.model or config.base_model_path())[0]
            for spec in config.heldout
            if _in_process(spec)
        ),
        None,
    )
    eval_rows = evaluation_conversations(config) if config.heldout else 0
    out["evaluation_conversations"] = eval_rows
    out["evaluation_kv"] = _kv(agent, heldout_user, eval_rows, s, config.max_new_tokens, b)
    out["evaluation_logits"] = _sampling_logits(agent, eval_rows)
    out["evaluation_cast"] = cast(agent)
    evaluation = (
        resident
        + gather(p_agent)
        + staging(agent)
        + out["evaluation_cast"]
        + out["evaluation_kv"]
        + out["evaluation_logits"]
        if config.heldout
        else 0
    )
    on_cpu = not config.device.startswith("cuda")
    checkpoint = resident + out["checkpoint_gathered"] + (out["checkpoint_host"] if on_cpu else 0)
    for flag in ("off", "on"):
        passes = out[f"activations_checkpointing_{flag}"] + out["compute_copy"]
        phases = {
            "rollout": rollout,
            "update": resident + max(passes, reference),
            "checkpoint": checkpoint,
            "evaluation": evaluation,
        }
        if config.steps == 0:  # a base evaluation: no rollout, update or checkpoint
            phases = {k: v if k == "evaluation" else 0 for k, v in phases.items()}
        out[f"phases_checkpointing_{flag}"] = phases
        total = max(out[f"phases_checkpointing_{flag}"].values())
        out[f"total_checkpointing_{flag}"] = total
        out[f"total_checkpointing_{flag}_gib"] = round(total / GIB, 2)
        if flag == ("on" if config.gradient_checkpointing else "off"):  # the run's own
            out["phases"] = {k: round(v / GIB, 2) for k, v in phases.items() if v}
    return out


def _kv(
    agent: Architecture | None, user: Architecture | None, rows: int, s: int, room: int, b: int
) -> float:
    """The KV caches of `rows` open conversations of up to s tokens: each in-process speaker's
    carried cache per conversation, plus, while one speaker takes its turn, its batch's
    prefilled keys and values (up to s) and the decoding buffers (s + room tokens) before
    they replace its carried caches (training/rl/sampling.py)."""
    sizes = [kv_bytes_per_token(a, b) for a in (agent, user) if a is not None]
    if not sizes:
        return 0
    return rows * (s * sum(sizes) + (2 * s + room) * max(sizes))


def _sampling_logits(arch: Architecture, rows: int) -> float:
    """A decoding step's float32 logits, softmax and scores over the vocabulary per row."""
    return rows * arch.vocab * 4 * 3


def _unit(arch: Architecture) -> int:
    """The parameters of FSDP's largest unit (the root: embeddings, output head, final norm)."""
    return max(
        arch.vocab * arch.hidden * (1 if arch.tied else 2) + arch.hidden,
        (arch.parameters() - arch.vocab * arch.hidden) // arch.layers,
    )


def _root_and_layer(arch: Architecture) -> int:
    """FSDP's largest gathered units at once: the root (embeddings, output head, final norm)
    and one decoder layer (training/rl/distributed.py: a unit per decoder layer)."""
    root = arch.vocab * arch.hidden * (1 if arch.tied else 2) + arch.hidden
    return root + (arch.parameters() - root) // arch.layers


def device_memory(config: RunConfig, offline: bool, given_gib: float | None) -> tuple[float, str]:
    """The memory of one device in GiB and where that figure comes from."""
    if given_gib:
        return given_gib, "--device-memory"
    if config.device.startswith("cuda"):
        if not offline:
            try:
                import torch

                if torch.cuda.is_available():
                    free, total = torch.cuda.mem_get_info()
                    return total / GIB, f"{torch.cuda.get_device_name()} (this machine)"
            except Exception:  # noqa: BLE001 - no usable CUDA: fall back to the assumption
                pass
        return DEFAULT_GPU_GIB, f"assumed {DEFAULT_GPU_GIB:.0f} GiB GPU (--device-memory to change)"
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return pages / GIB, "this machine's RAM"


# -- the checks ---------------------------------------------------------------------------------


def check_accelerate(config: RunConfig, path: str) -> tuple[list[Check], int]:
    """The accelerate settings file, read by accelerate itself, whether it agrees with the
    config's `distributed` table (FSDP exactly when strategy = fsdp), and the process count the
    launch will have: accelerate's `num_processes` wins over `distributed.processes`, as in
    the trainer."""
    from accelerate.commands.config.config_args import load_config_from_file

    processes = config.distributed.processes
    try:
        settings = load_config_from_file(path)
    except Exception as exc:  # noqa: BLE001 - any reason accelerate refuses the file is the answer
        return [Check("accelerate settings", False, f"{path}: {exc}")], processes
    problems = []
    kind = str(getattr(settings.distributed_type, "value", settings.distributed_type))
    machines = settings.num_machines
    if settings.num_processes >= 1:
        processes = settings.num_processes
    if (kind == "FSDP") != (config.distributed.strategy == "fsdp"):
        problems.append(
            f"distributed_type = {kind} but the config's distributed.strategy ="
            f" {config.distributed.strategy}"
        )
    if machines < 1 or processes % machines:
        problems.append(f"num_processes = {processes} does not split over {machines} machines")
    if not 0 <= settings.machine_rank < machines:
        problems.append(f"machine_rank = {settings.machine_rank} is not in 0..{machines - 1}")
    if machines > 1 and not (settings.main_process_ip and settings.main_process_port):
        problems.append("several machines need main_process_ip and main_process_port")
    detail = (
        "; ".join(problems) or f"{path}: {kind}, {processes} processes on {machines} machine(s)"
    )
    if not problems and processes != config.distributed.processes:
        detail += (
            f" (its num_processes wins over distributed.processes = {config.distributed.processes})"
        )
    return [Check("accelerate settings", not problems, detail)], processes


def check_strategy(config: RunConfig) -> Check:
    """What the launch does with several processes: DDP (whole model on each rank) or FSDP
    (sharded; a model that needs it should sample on an endpoint, see docs/paper.md)."""
    strategy, n = config.distributed.strategy, config.distributed.processes
    detail = f"{strategy} x {n}" if n > 1 else "one process"
    if config.trains_simulator and n > 1:
        detail += " (the co-trained simulator data-parallel too)"
    if strategy == "fsdp" and n > 1 and not config.rollout_endpoint:
        detail += "; the agent samples in-process, on its whole weights gathered on every rank"
    return Check("data-parallel strategy", True, detail)


def check_batch(config: RunConfig) -> Check:
    """Every rank rolls out at least one task's group (the trainer refuses fewer tasks)."""
    n, tasks = config.distributed.processes, config.batch_tasks
    ok = tasks >= n
    shares = f"{tasks // n}" + ("" if tasks % n == 0 else f" or {tasks // n + 1}") if ok else "0"
    return Check(
        "tasks split across ranks",
        ok,
        f"batch_tasks {tasks} over {n} process(es): {shares} each"
        + ("" if ok else "; some ranks would have no task"),
    )


# the relative spacing of a dtype's numbers (its machine epsilon)
EPSILON = {"float32": 2.0**-23, "bfloat16": 2.0**-7, "float16": 2.0**-10}
TYPICAL_WEIGHT = 0.02  # the initialisation scale of Llama/Qwen linear layers


def check_precision(config: RunConfig) -> Check:
    """Full fine-tuning without mixed_precision keeps its weights in `dtype` (no fp32 master
    copy): an AdamW step moves a weight by about the learning rate, and one smaller than half
    the spacing of the dtype's numbers near a typical weight rounds away, so the run would not
    learn. With mixed_precision the weights are float32 and only the passes are 16-bit."""
    if config.finetune != "full":
        return Check("full fine-tuning precision", True, "LoRA: the adapter trains in float32")
    if mixed(config):
        return Check(
            "full fine-tuning precision",
            True,
            f"float32 master weights, gradients and AdamW state (mixed_precision), passes in"
            f" {config.dtype}: steps of about lr = {config.agent_lr:g} are kept",
        )
    spacing = EPSILON[config.dtype] * 2.0 ** math.floor(math.log2(TYPICAL_WEIGHT))
    lost = config.agent_lr < spacing / 2
    detail = (
        f"{config.dtype} weights near {TYPICAL_WEIGHT} are {spacing:.1e} apart; steps of about lr"
        f" = {config.agent_lr:g} "
        + (
            "round away (no fp32 master copy is kept): set mixed_precision = true (or dtype ="
            ' "float32")'
            if lost
            else "are kept"
        )
    )
    return Check("full fine-tuning precision", not lost, detail)


def check_memory(config: RunConfig, offline: bool, device_gib: float | None) -> tuple[Check, dict]:
    """Each phase's memory per device against the device, less what a vLLM server on the same
    GPUs holds (distributed.colocated_server_share); fails naming every phase that does not
    fit, the largest first."""
    try:
        estimate = memory(config)
    except KeyError as exc:
        return Check("memory per device", False, str(exc.args[0])), {}
    size, where = device_memory(config, offline, device_gib)
    share = config.distributed.colocated_server_share if config.device.startswith("cuda") else 0
    room = size * (1 - share)
    flag = "on" if config.gradient_checkpointing else "off"
    phases = estimate[f"phases_checkpointing_{flag}"]
    need = estimate[f"total_checkpointing_{flag}_gib"]
    estimate["device_gib"], estimate["device"] = round(size, 2), where
    estimate["available_gib"] = round(room, 2)
    estimate["phases_gib"] = {k: round(v / GIB, 2) for k, v in phases.items() if v}
    over = sorted((k for k, v in phases.items() if v / GIB > room), key=lambda k: -phases[k])
    server = f", {room:.1f} GiB beside a vLLM server holding {share:.0%}" if share else ""
    listed = ", ".join(f"{k} {v / GIB:.1f}" for k, v in phases.items() if v)
    other = "off" if flag == "on" else "on"
    detail = (
        f"{need:.1f} GiB of {size:.0f} GiB ({where}{server}); by phase (GiB): {listed}; "
        f"{estimate['sequence_length']} tokens x micro_batch {config.micro_batch}, "
        f"{estimate['open_conversations']} conversations open per rank (rollouts_at_once), "
        f"{config.finetune if config.finetune == 'full' else f'lora r={config.lora.r}'},"
        f" {config.dtype}{' mixed (float32 master weights)' if mixed(config) else ''}, "
        f"{estimate['strategy']} x {estimate['processes']}, gradient checkpointing {flag}; "
        f"with it {other} {estimate[f'total_checkpointing_{other}'] / GIB:.1f} GiB"
    )
    if over:
        detail = (
            f"the {', '.join(over)} phase{'s' if len(over) > 1 else ''} do{'' if len(over) > 1 else 'es'} not fit: "
            + detail
        )
    return Check("memory per device", not over, detail), estimate


def endpoints(config: RunConfig) -> list[tuple[str, str, str, str]]:
    """(role, base URL, served model, key variable) of every endpoint the config names."""
    out = []
    if config.rollout_endpoint:
        out.append(("agent sampler", config.rollout_endpoint, str(config.base_model_path()), ""))
    specs = []
    if not config.trains_simulator:
        role = "ensemble {}" if config.regime == Regime.ENSEMBLE else "simulator"
        specs = [(role.format(s.name), s) for s in config.training_simulators()]
    if config.trains_simulator and config.simulator.endpoint:  # serves its base, loads adapters
        model, key = str(config.simulator_model_path()), config.simulator.api_key_env
        out.append(("simulator sampler", config.simulator.endpoint, model, key))
    specs += [(f"held-out {s.name}", s) for s in config.heldout]
    for role, spec in specs:
        if spec.endpoint:
            out.append((role, spec.endpoint, spec.model, spec.api_key_env))
    if config.nl_judge.endpoint:  # tau2: the model that judges NL assertions
        judge = config.nl_judge
        out.append(("NL judge", judge.endpoint, judge.model, judge.api_key_env))
    return out


def _serves(ids: list[str], model: str, base: bool) -> bool:
    """Whether /v1/models lists `model` (Gemini prefixes ids with "models/"); the agent's and a
    co-trained simulator's samplers serve their base model under its path or its folder name."""
    names = {i.removeprefix("models/") for i in ids}
    if model in names:
        return True
    return base and Path(model).name in {Path(i).name for i in names}


def check_endpoint(role: str, url: str, model: str, key_env: str, timeout: float) -> list[Check]:
    import httpx

    from agents.paths import secret

    headers = {}
    if key_env:
        key = secret(key_env)
        if not key:
            return [Check(f"{role} endpoint", False, f"environment variable {key_env} is not set")]
        headers["Authorization"] = f"Bearer {key}"
    address = url.rstrip("/") + "/models"
    try:
        response = httpx.get(address, headers=headers, timeout=timeout)
        response.raise_for_status()
        ids = [m["id"] for m in response.json()["data"]]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        reason = (
            f"HTTP {exc.response.status_code}" if isinstance(exc, httpx.HTTPStatusError) else exc
        )
        return [Check(f"{role} endpoint", False, f"GET {address} failed: {reason}")]
    reached = Check(f"{role} endpoint", True, f"{address} answers")
    served = _serves(ids, model, base=role.endswith("sampler"))
    detail = f"{model} is served" if served else f"{model} is not served (served: {', '.join(ids)})"
    return [reached, Check(f"{role} model", served, detail)]


# The tiny request each endpoint simulator is sent: a few words back cost a few tokens.
PROBE = [
    {"role": "system", "content": "You are a user in a short chat."},
    {"role": "user", "content": "Hello! Please answer in a few words."},
]


def endpoint_simulators(config: RunConfig) -> list[tuple[str, SimulatorSpec]]:
    """(role, spec) of every frozen simulator on an endpoint: each is sent one request."""
    specs = [] if config.trains_simulator else [("simulator", config.simulator)]
    # the panel as the run builds it (a Persona-Guided or VS run's members like its simulator)
    specs += [(f"held-out {s.name}", s) for s in config.panel_readouts()["heldout"]]
    return [(role, s) for role, s in specs if s.endpoint and s.kind != SimulatorKind.SCRIPTED]


def check_request(role: str, spec: SimulatorSpec, timeout: float) -> Check:
    """One chat request to an endpoint simulator, shaped as its turns are (training/rollouts/simulator.py
    EndpointUser: the same client, provider and parameters), and what came back."""
    import asyncio

    from agents.llm import LLMClient, LLMError
    from agents.simulators import VerbalizedSampling

    provider = spec.provider_spec()
    params = spec.request_params()
    if spec.kind == SimulatorKind.VERBALIZED:  # every Verbalized turn carries its schema
        params["response_format"] = VerbalizedSampling(
            spec.k, spec.draw, spec.retries
        ).response_format()
    _, notes = provider.shape(params)
    shaped = f"{provider.name}" + (f": {'; '.join(notes)}" if notes else "")

    async def ask():
        client = LLMClient(
            spec.endpoint,
            api_key=simulator_api_key(spec),
            provider=spec.provider,
            timeout=timeout,
            max_retries=1,
        )
        async with client:
            return await client.chat(spec.model, PROBE, **params)

    name = f"{role} request"
    try:
        result = asyncio.run(ask())
    except LLMError as exc:  # the provider's own status and message (never the key)
        hint = ""
        if provider.name == "generic" and getattr(exc, "status", None) == 400:
            # a reasoning model whose id does not say so (an Azure deployment name, a proxy's
            # alias) is shaped as generic by "auto" and refuses temperature and max_tokens
            hint = (
                f" (a GPT-5-family or o-series model behind another host: set provider ="
                f' "openai-reasoning" on {spec.name})'
            )
        return Check(name, False, f"{exc} [sent as {shaped}]{hint}")
    if not result.content.strip() and result.finish_reason == "length":
        return Check(
            name,
            False,
            f"{spec.model} used all max_new_tokens = {spec.max_new_tokens} before any text"
            " (a reasoning model's hidden reasoning counts against the cap: raise max_new_tokens"
            f" or set reasoning_effort) [sent as {shaped}]",
        )
    return Check(name, True, f"{spec.model} answers [sent as {shaped}]")


def check_local(config: RunConfig) -> list[Check]:
    """In-process models and adapters are folders on disk (weights are needed: online only)."""
    checks = []
    folders = {"agent model": str(config.base_model_path())}
    if config.trains_simulator and config.simulator.endpoint:  # sampled there, learns here
        folders["simulator model"] = str(config.simulator_model_path())
    for spec in [*config.training_simulators(), *config.heldout]:
        if _in_process(spec):
            folders[f"{spec.name} model"] = spec.model or str(config.base_model_path())
            if spec.adapter:
                folders[f"{spec.name} adapter"] = str(spec.adapter_path())
    if config.collapse.embedding_model:  # sim/embedding_dispersion's model: loaded, never fetched
        folders["embedding model"] = config.collapse.embedding_model
    if config.behaviour.reference:  # the behaviour space's embedder: loaded, never fetched
        folders["behaviour embedder"] = config.behaviour.embedder or str(config.base_model_path())
    for name, folder in folders.items():
        path = Path(folder).expanduser()
        marker = "adapter_config.json" if name.endswith("adapter") else "config.json"
        ok = (path / marker).is_file()
        checks.append(Check(name, ok, f"{path}" + ("" if ok else f": no {marker} there")))
    return checks


def check_domain_data(config: RunConfig, offline: bool) -> Check:
    """The Domain's official data (domain_data) and the tasks it gives under the run's protocol.
    A path that is absent is said plainly: the run stops there (it never falls back to the
    bundled data); offline that is a note, since the data lives on the training machine."""
    data = Path(config.domain_data).expanduser()
    protocol = config.domain_protocol or "default"
    if config.domain in TAU2_DOMAINS:
        protocol += f", tau2 {config.tau2_version or 'v0.2.0 (default)'}"
    if not data.exists():
        where = "the online dry run and the run fail on it" if offline else "the run fails here"
        return Check(
            "domain data",
            offline,
            f"ABSENT: {data} does not exist on this machine; {where}, never falling back to"
            f" {config.domain}'s bundled data (protocol {protocol})",
        )
    from training.trainer.loop import select_scenarios  # torch: only when the data is there

    try:
        domain = config.build_domain()
        train = select_scenarios(domain, config.tasks, "train")
        held = select_scenarios(domain, config.tasks, "eval")
    except (OSError, ValueError, KeyError) as error:
        return Check("domain data", False, f"{data} (protocol {protocol}): {error}")
    return Check(
        "domain data",
        True,
        f"{data} (protocol {protocol}): {len(train)} training and {len(held)} evaluation tasks"
        f" (eval_draw {config.tasks.eval_draw})",
    )


def check_tool_format(config: RunConfig) -> Check:
    """The agent's tool format for its base model's chat template (needs the model's folder)."""
    from agents.llm.native_tools import model_tool_style, resolve_tool_format

    folder = config.base_model_path()
    try:
        style = model_tool_style(folder)
        chosen = resolve_tool_format(config.tool_format, style)
    except (OSError, ValueError) as error:
        return Check("tool format", False, f"{config.tool_format}: {error}")
    served = " (served with vLLM --tool-call-parser hermes)" if chosen == "native" else ""
    return Check("tool format", True, f"{config.tool_format} -> {chosen}{served}")


def dry_run(
    path: str,
    overrides: dict[str, Any] | None = None,
    *,
    offline: bool = False,
    accelerate_config: str = "",
    device_gib: float | None = None,
    timeout: float = 5.0,
    request_timeout: float = 60.0,
) -> dict[str, Any]:
    """Every check for the run `path` describes: {"ok", "checks": [...], "memory": {...}}.
    `timeout`: for each GET /v1/models; `request_timeout`: for each simulator's one request."""
    checks: list[Check] = []
    try:
        config = load_config(path, overrides)
    except ConfigError as exc:
        checks.append(Check("config", False, str(exc)))
        return _result(checks, {})
    checks.append(Check("config", True, f"{path}: {config.name}, {config.regime}"))
    if accelerate_config:
        found, processes = check_accelerate(config, accelerate_config)
        checks += found
        distributed = dataclasses.replace(config.distributed, processes=processes)
        config = dataclasses.replace(config, distributed=distributed)  # the launch's count
    checks.append(check_strategy(config))
    checks.append(check_batch(config))
    checks.append(check_precision(config))
    mem_check, estimate = check_memory(config, offline, device_gib)
    checks.append(mem_check)
    if config.domain_data:
        checks.append(check_domain_data(config, offline))
    if not offline:
        checks += check_local(config)
        checks.append(check_tool_format(config))
        reached: dict[str, bool] = {}
        for role, url, model, key_env in endpoints(config):
            found = check_endpoint(role, url, model, key_env, timeout)
            reached[role] = all(c.ok for c in found)
            checks += found
        for role, spec in endpoint_simulators(config):
            if reached.get(role):  # not reached, or not serving the model: already said
                checks.append(check_request(role, spec, request_timeout))
    return _result(checks, estimate)


def _result(checks: list[Check], estimate: dict[str, Any]) -> dict[str, Any]:
    return {
        "ok": all(c.ok for c in checks),
        "checks": [dataclasses.asdict(c) for c in checks],
        "memory": estimate,
    }


def render(result: dict[str, Any]) -> str:
    lines = [
        f"{'ok  ' if c['ok'] else 'FAIL'}  {c['name']}: {c['detail']}" for c in result["checks"]
    ]
    lines.append("ready" if result["ok"] else "not ready")
    return "\n".join(lines)
