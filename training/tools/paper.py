"""The paper's results, declared once: which config reproduces each, from which released launcher,
and where parley's run differs from it and why.

    python -m training paper [--json]     every result: config, 8-GPU command, memory per GPU

The release is the authors' public repository CHATS-lab/scope_usim; `cmd/slime/README.md` there
lists one launcher per paper result. Every launcher cited below was read at commit RELEASE_COMMIT
(the held-out panels, `eval_configs/*_6model.yaml`, at EVAL_COMMIT). A config's comments give the
launcher each value comes from; this registry says, per result, what parley cannot or does not do
as the launcher does. SHARED holds the differences every paper config has.

release_launchers.csv beside this file is the launchers' flags as data: launcher, commit, line,
flag, value, one row per `--flag value` line of each launcher at RELEASE_COMMIT (the tau2 job of
eval_base.sh; p4g/eval_base.sh holds P4G's). tests/training/tools/test_paper_release.py compares
every config with it, number by number.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

RELEASE = "CHATS-lab/scope_usim"
RELEASE_COMMIT = "1470e27a7c026b22cbd28031f6f865689990cedc"
EVAL_COMMIT = "6218b97532dd1c726746840486ef31801ce110e8"
LOOP_COMMIT = "0a0747d97c3cb711f27e35d77398a7ae017e97a2"  # usim/slime/cotrain_loop.py
REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "training" / "configs" / "paper"
ACCELERATE = "training/accelerate/one_node_8gpu_fsdp.yaml"
DOMAINS = ("p4g", "retail", "airline", "cooperbench")

# What every paper config does otherwise than every released Qwen3-4B launcher.
SHARED = (
    "Trainer: Slime + Megatron (TP/CP, full recompute) with SGLang rollouts on one 8-GPU node;"
    " parley trains with torch FSDP on 8 processes (training/accelerate/one_node_8gpu_fsdp.yaml)"
    " and samples in-process unless rollout_endpoint / simulator.endpoint name vLLM servers.",
    "Batch: Slime's --rollout-batch-size 16 x --n-samples-per-prompt 8 = --global-batch-size 128"
    " is batch_tasks 16 x group_size 8, one optimizer step per rollout (ppo_epochs 1).",
    "Token caps: Slime caps a whole rollout's response (--rollout-max-response-len 32768 or"
    " 16384) and an agent turn at 8192 tokens in training, 16384 at tau2 evaluation and 2048 at"
    " P4G evaluation (the co-trained tau2 user 1024); parley caps each agent turn at"
    " max_new_tokens, 256 in the chat configs, in training and on the panel alike, sized so the"
    " dry run's memory estimate (every turn at its cap, tau2's tool results at their measured"
    " size, gradient checkpointing on as the release's full recompute) fits an 80 GiB GPU in"
    " every phase; rollouts_at_once bounds the conversations a rank holds open (SGLang pages"
    " its KV cache instead). Effect: a turn longer than 256 tokens is cut there, kept as the"
    " message and trained as sampled; a tool call cut before its JSON closes is no call"
    " (agents/llm/tool_format.py keeps a malformed block as text; training/rollouts/agent.py"
    " add_agent_reply): no tool runs, the cut text, tag included, goes to the user as the"
    " agent's message and the user's turn follows, so a tau2 action that needs a longer turn"
    " (a long preface, large arguments) fails in parley where the release's 8192 would let it"
    " through; P4G's 50-word messages fit 256 tokens.",
    "Turns: the release's --max-turns counts agent actions (a message or one tool call, each"
    " answered by the user or the tool; usim/core/orchestrator.py); parley's max_turns counts"
    " user and agent messages and bounds tool calls per agent turn (max_tool_rounds).",
    "Held-out panel: the release's 6-model panel includes the run's training simulator(s);"
    " parley keeps them, marked `seen = true`, so heldout/success and heldout/reward are the"
    " release's whole-panel means, and adds heldout/unseen_* over the members the agent never"
    " met (training/measures/held_out.py).",
    "Held-out sampling: the release's eval configs (eval_configs/*_6model.yaml) set"
    " temperature 0.7, top_p 0.95 for the AGENT's sampling only; parley's agent samples at"
    " `temperature` (0.7) with top_p 1 in training and evaluation alike (the release's agent:"
    " top_p 1, Slime's --rollout-top-p default, in training; 0.95 at evaluation).",
    "Hosted users on tau2 (training users and panel members): the release sends them no"
    " temperature or top_p (its tau2 environment passes only the API key as user_llm_args, and"
    " tau2's gym then uses that dict), so they sample at the provider's defaults (1.0); the"
    ' tau2 configs do the same (sampling = "provider": the requests carry neither).',
    "P4G's hosted persuadee (training users and panel members): the release samples it at"
    " temperature 0.7 with no top_p (core/environment/p4g/environment.py@1d1253b); the P4G"
    " configs send temperature 0.7 and leave top_p at 1.0, which is not sent.",
    "Hosted training users: capped at 512 tokens a message on tau2 (a Verbalized reply 2560, five"
    ' candidates) and 2048 on P4G, and GPT-5-mini trains at reasoning_effort "low" on tau2:'
    " the dry run counts every user turn at its cap, and GPT-5's reasoning counts against it;"
    " the release sends no cap and the provider's default effort (medium). The panel's users"
    " keep 4096 tokens and the default effort.",
    "Gradient clipping: Megatron's default clip-grad 1.0 is parley's grad_clip 1.0 (not set in"
    " the launchers).",
    "KL: Slime clamps the low_var_kl (k3) estimate of each token to [-10, 10]; the configs set"
    " kl_clamp = 10 (training/rl/grpo.py: the clamped token adds at most 10 x beta and no KL"
    " gradient).",
    "Weight decay: Megatron's optimizer decays neither biases nor 1-D parameters (norm"
    " weights); the configs set weight_decay_skip_1d = true (Qwen3's norms keep their values"
    " under the 0.1 decay).",
    "Evaluation schedule: Slime evaluates after steps 16, 32, ... (992 of 1000, 96 of 100) and"
    " not after the last step; the configs set eval_at_end = false, so the last held-out"
    " figure of a run is the step-992 (or 96, 496) one, as the release's.",
    "Checkpoints: the release keeps every one (about 1.5 TB for a 1000-step run saved every 32"
    " steps); so do the configs (keep_checkpoints = 0); keep_checkpoints = N keeps the last N"
    " and the best by heldout/success, never the one a resume needs.",
    "GPT-5 behind another host: the release recognises GPT-5 by the model id alone"
    " (usim/core/api_model_adapter.py@ff06bcd2) and sends it no temperature or top_p; parley's"
    ' provider = "auto" does the same on any host no provider claims (a gateway, a proxy,'
    " Azure), so such a user is not refused at its first request; an id that does not name"
    ' GPT-5 needs provider = "openai-reasoning", which the online dry run\'s refusal names.',
)


@dataclasses.dataclass(frozen=True)
class Result:
    """One paper result for one domain: its config is training/configs/paper/<key>.toml."""

    key: str
    name: str  # the paper's name for the result
    domain: str
    launcher: str  # path@commit in the release, or "none: ..." with the launcher followed
    differences: tuple[str, ...] = ()

    @property
    def config(self) -> Path:
        return CONFIGS / f"{self.key}.toml"

    @property
    def command(self) -> str:
        relative = self.config.relative_to(REPO)
        return f"accelerate launch --config_file {ACCELERATE} -m training run {relative}"


def _at(path: str, commit: str = RELEASE_COMMIT) -> str:
    return f"cmd/slime/{path}@{commit}"


# The launcher of each result per release domain ("tau2" is retail in the release).
_LAUNCHERS = {
    ("p4g", "base"): "p4g/eval_base.sh",
    ("tau2", "base"): "eval_base.sh",
    ("p4g", "single-gpt5mini"): "p4g/rl_single_gpt5mini.sh",
    ("p4g", "single-haiku"): "p4g/rl_single_haiku.sh",
    ("p4g", "single-gemini"): "p4g/rl_single_gemini.sh",
    ("tau2", "single-gpt5mini"): "tau2/rl_single_gpt5mini.sh",
    ("tau2", "single-haiku"): "tau2/rl_single_haiku.sh",
    ("tau2", "single-gemini"): "tau2/rl_single_gemini.sh",
    ("tau2", "persona"): "tau2/persona_guided.sh",
    ("p4g", "ensemble"): "p4g/ensemble.sh",
    ("tau2", "ensemble"): "tau2/ensemble.sh",
    ("p4g", "verbalized"): "p4g/vs_gpt5mini.sh",
    ("tau2", "verbalized"): "tau2/vs_gpt5mini.sh",
    ("p4g", "verbalized-prob"): "p4g/vs_gpt5mini.sh",
    ("tau2", "verbalized-prob"): "tau2/vs_gpt5mini.sh",
    ("p4g", "selfplay"): "p4g/self_play.sh",
    ("tau2", "selfplay"): "tau2/self_play.sh",
    ("p4g", "population"): "p4g/population_self_play.sh",
    ("tau2", "population"): "tau2/population_self_play.sh",
    ("tau2", "cooperative"): "ablations/sim_reward_cooperative_tau2.sh",
    ("cooperbench", "coop"): "cooperbench/train_qwen3_5_27b.sh",
}

_NAMES = {
    "base": "Base (untrained)",
    "single-gpt5mini": "RL (Single), GPT-5-mini simulator",
    "single-haiku": "RL (Single), Claude Haiku 4.5 simulator (single-simulator collapse)",
    "single-gemini": "RL (Single), Gemini 3 Flash simulator (single-simulator collapse)",
    "persona": "Persona-Guided",
    "ensemble": "Ensemble, K=3",
    "verbalized": "Verbalized Sampling, GPT-5-mini (uniform draw, as released)",
    "verbalized-prob": "Verbalized Sampling, GPT-5-mini, probability draw (ablation)",
    "selfplay": "Self-Play (simulator reward: curriculum on tau2, adversarial on P4G)",
    "population": "Population Self-Play",
    "cooperative": "Simulator reward ablation: cooperative (Self-Play)",
    "coop": "CooperBench, cooperative: Qwen3.5-27B coding agent, hosted partner",
}

# Differences of one result, whatever its domain.
_OWN: dict[str, tuple[str, ...]] = {
    "base": (
        "The release measures Base as the evaluation at rollout 0 of a 1000-rollout training job"
        " stopped by hand (--eval-interval 1 without --skip-eval-before-train); parley's"
        " `steps = 0` evaluates the starting policy on the panel and stops (training/trainer/loop.py).",
        "The base job's training simulator (gpt-5-mini) never acts before the rollout-0"
        " evaluation; the config keeps the in-process default simulator, which a base evaluation"
        " never loads, so the whole 6-model panel is held out.",
    ),
    "single-haiku": (
        "Claude Haiku 4.5 trains through the OpenRouter gateway as released; it stays in the"
        " panel as a seen member (see SHARED).",
    ),
    "single-gemini": (
        "Gemini 3 Flash (google/gemini-3-flash-preview) trains through OpenRouter as released;"
        " a seen panel member.",
    ),
    "single-gpt5mini": (
        "GPT-5-mini trains through OpenAI's API as released; a seen panel member.",
    ),
    "persona": (
        "The guidelines are the release's --usim-user-prompt-prefix, parley's default"
        " SimulatorSpec.guidelines; GPT-5-mini is a seen panel member.",
    ),
    "ensemble": (
        "The three ensemble members are seen panel members; heldout/unseen_* are GLM-5,"
        " Qwen3-30B-A3B and DeepSeek-V3.2.",
    ),
    "verbalized": (
        '--usim-vs-method random is parley\'s draw = "uniform" (k = 5, --usim-vs-num-samples 5);'
        " the release's `random` prompt asks for candidates without probabilities, parley's asks"
        " for probabilities and ignores them.",
    ),
    "verbalized-prob": (
        "The release has no GPT-5-mini `prob` launcher: its `prob` ablations are"
        f" {_at('ablations/vs_haiku_tau2.sh')} and vs_gpt4o_tau2.sh (Haiku 4.5 / GPT-4o users,"
        " a 3-model panel); this is vs_gpt5mini.sh with --usim-vs-method prob (draw ="
        ' "probability").',
    ),
    "selfplay": (
        "The release trains the user as a second full Qwen3-4B on 4 of the node's GPUs and the"
        " agent on the other 4 (dual_cotrain); parley fully fine-tunes both (finetune = full"
        " applies to the co-trained simulator too), sharded together over all 8 GPUs.",
        "The release sends the user no top_p (tau2_cotrain_rollout.py@6218b97"
        " opp_sampling_params sets none, so it samples at Slime's --rollout-top-p default, 1.0),"
        " as parley samples a co-trained model in process: from its whole distribution, the one"
        " whose log-probs the loss uses.",
        "The release's tau2 user trains on its generated ids alone, without the conversation"
        " around them (tau2_cotrain_rollout.py@6218b97); parley's co-trained simulator trains"
        " on its turns in their conversation, as it sampled them.",
        "The release's KL 0.005 applies to both roles: beta = simulator_beta = 0.005.",
    ),
    "population": (
        "The release loads ONE pool checkpoint as the user for each rollout batch (random"
        " selection, the pool seeded with the initial model, --pool-size 10, a snapshot of the"
        f" user every 16 rollouts; usim/slime/cotrain_loop.py@{LOOP_COMMIT} dual_selfplay);"
        " parley's population gives half of each group the current simulator and the other half"
        " a uniformly drawn snapshot (training/regimes/regime.py).",
        "--no-agent-kl: the agent trains without KL (beta = 0); the user keeps KL 0.01"
        " (simulator_beta = 0.01), as dual_selfplay does.",
        "The release's user is reloaded from the drawn pool checkpoint before every rollout"
        " batch and trained on that checkpoint's tokens, off-policy (cotrain_loop.py@0a0747d);"
        " every pool entry is the launcher's one --save-hf folder, rewritten at each save"
        " (checkpoint_pool.py@4951e76), so its pool is in effect {initial model, latest export}."
        " Parley's population keeps distinct snapshots and trains its current simulator on its"
        " own on-policy tokens. The release's pool is not offered as an option: its two"
        " effective members come from every entry naming one rewritten folder, not from a"
        " method the paper describes (a pool of past snapshots), and its update trains the"
        " current user on an older checkpoint's tokens (off-policy), which parley's on-policy"
        " GRPO step (training/rl/grpo.py) does not"
        " model; read these population results as {initial, latest} self-play.",
        "--trainable-role agent: dual_selfplay still trains the user's group every step"
        " (cotrain_loop.py), as parley's population trains its simulator.",
        "The co-trained simulator is fully fine-tuned and sampled without top_p (see selfplay).",
    ),
    "cooperative": (
        "--trainable-role agent with dual_cotrain: the release README reads it as only the agent"
        " trainable, but dual_cotrain trains the user's group every step on tokens whose loss"
        f" mask is 1 (cotrain_loop.py, tau2_cotrain_rollout.py @ {LOOP_COMMIT}), rewarded with"
        " the agent's reward; parley's cotrain with simulator_reward = cooperative does that.",
        "--no-agent-kl: beta = 0; the user keeps KL 0.01 (simulator_beta = 0.01); 100 rollouts;"
        " lr 1e-6.",
        "The co-trained simulator is fully fine-tuned and sampled without top_p (see selfplay).",
    ),
}

_P4G_VS_PANEL = (
    'P4G Verbalized Sampling panel: plain (heldout_users = "plain"). The P4G rollout files the'
    " index holds from the launchers' time (usim/p4g/rollout.py @ 1c2c23a, @ 9d3a41e) read no"
    " --usim-verbalized-sampling, in training or evaluation, and a later version seen in the"
    " index turns it off for evaluation; which version ran the paper's P4G VS rows is not"
    " recorded, and with the first two its persuadee was not Verbalized at all.",
)
_DOMAIN_OWN: dict[tuple[str, str], tuple[str, ...]] = {
    ("p4g", "verbalized"): _P4G_VS_PANEL,
    ("p4g", "verbalized-prob"): _P4G_VS_PANEL,
    ("retail", "selfplay"): (
        "--tau2-tool-error-penalty -0.1 (a tax on the user's reward per tau2 tool error) is"
        " not in parley's curriculum reward.",
    ),
    ("airline", "selfplay"): ("--tau2-tool-error-penalty -0.1: as retail.",),
    ("retail", "population"): (
        "The tau2 population launcher sets no --tau2-user-reward-mode, so its user gets the"
        " agent's reward (its own comment): simulator_reward = cooperative here, not tau2's"
        " curriculum default.",
    ),
    ("airline", "population"): ("simulator_reward = cooperative: as retail's launcher.",),
    ("cooperbench", "coop"): (
        "Model: Qwen3.5-27B; the release fully fine-tunes it with Megatron TP 4 x PP 2, full"
        " recompute and Adam offloaded to CPU. Parley's FSDP full fine-tuning of 27B does not"
        " fit 80 GiB (its weights gathered for sampling alone take 85 GiB in float32), so this"
        " run trains a LoRA adapter (r 8) at lr 1e-5, ten times the release's 1e-6 as LoRA's best"
        " rate is (Schulman et al. 2025), with gradient checkpointing on (the release's full"
        " recompute).",
        "Steps: 50 each and 4096 tokens a step in the release (its context capped at 65,536);"
        " here 40 steps of both speakers together (20 each) and 512 tokens a step, so the dry"
        " run's estimate fits 80 GiB. The estimate counts Qwen3.5-27B as dense attention layers"
        " of its published sizes, about 24.4B of its 27B parameters (training/tools/dryrun.py"
        " APPROXIMATE): it is low by about a tenth.",
        "Turns: the release runs the two agents at once, the partner in a thread, messages over"
        " Redis; parley's episode has them take steps in turn (agents/domains/cooperbench), the"
        " partner a simulator like any other, so every regime applies to it.",
        "Partner: Gemini 3 Flash through Gemini's OpenAI-compatible endpoint as released; it"
        " calls its tools in the JSON text format its system prompt describes.",
        "Sandboxes: Modal in the release (--cooperbench-backend modal); parley runs each task's"
        " own image with Docker (PARLEY_SANDBOX=docker) or a bubblewrap copy of a local checkout.",
        "Reward: --cooperbench-partial-reward, 0.5 when only the agent's own feature passes, as"
        " the Domain gives by default. The release also gives 0.1 for a non-empty failing patch"
        " in its baseline setting only; not here.",
        "No evaluation during training (EVAL_ARGS empty) and no held-out panel.",
        "Pairs: the release trains on data/cooperbench/train_pairs.json (587 pairs) and holds"
        ' out test_pairs.json (65); the config does the same (train_split = "train", read'
        ' beside domain_data; "all" would train on the 65 held-out pairs too).',
    ),
}

_TAU2 = (
    "tau2 task version: which version the release scored is unknown (its tau2-bench pin could"
    " not be read). Its tau2 environment imports tau2.gym (added after the v0.2.0 tag, on"
    " 2025-11-10) and every tau2-bench commit until v1.0.0 (2026-03-18) serves v0.2.0's task"
    " files, but its dated launcher folders run from 0206 to 0417, across v1.0.0's release. The"
    ' config scores v0.2.0\'s tasks (tau2_version, default "v0.2.0", DB x COMMUNICATE:'
    " agents/domains/tau2/versions.py). v1.0.0 changed 10 retail tasks' gold actions, added"
    " get_item_details and scores 112 of 114 retail tasks as DB x NL_ASSERTION (LLM-judged);"
    ' parley runs it with tau2_version = "v1.0.0" and a judge model in [nl_judge], and refuses'
    " to start such a run without one (an unjudged NL assertion is never counted).",
)
_AIRLINE = (
    "The release has no airline launcher (every tau2 launcher sets --usim-domain retail); this"
    " config is retail's with the official airline data (/data/tau2, split 30 train / 20 test).",
)
_P4G = (
    'P4G task: the release\'s protocol (domain_protocol = "release"; agents/domains/p4g/release.py'
    " follows usim/p4g/prompts.py @ 1c2c23a, persona.py @ e348b9f, core/environment/p4g/"
    "environment.py @ 1d1253b and reward.py @ 2762e9b: persuader persona and bonus, 50 words,"
    " the policy writes the first message, [DONATE $N] or [GIVE $N], a free last reply, $0 does"
    " not end the episode, the release's donation reader). parley's own protocol (honest"
    " persuader, fixed greeting, a forced final marker) stays the studies' default.",
    "P4G data: read from domain_data (/data/p4g): the corpus's full_info.csv with the release's"
    " data/p4g/train and test folders beside it, whose file names are its split (739 / 200,"
    " data/README.md @ 06aface); the run and the online dry run stop when it is absent. The"
    " persona text is built from full_info.csv's survey answers (the release reads the same"
    " answers from its ConvoKit users.json), numbers written as full_info.csv gives them.",
    'P4G evaluation: as the release draws it (tasks.eval_draw = "training_cursor"): each panel'
    " member plays the next 16 training dialogues after those the steps and earlier members"
    " took, 8 x 4 conversations each (usim/p4g/rollout.py @ 9d3a41e, get_samples(16) on the"
    " training source; the usim://p4g/test paths are not read). parley draws its training"
    " dialogues at random each step where the release's source reads them in file order, so"
    " the dialogues behind one evaluation are the release's by position, not the same ones"
    " trained on before.",
)

# What the release's tau2 runs trained on (training/vocabulary.py TASK_DRAWS "release"): its data
# source fell back to index-only samples (usim/slime/data_source.py@1c268eb0), so each step
# played the same 16 groups. Checked against the official retail data by tests/training/tools/
# test_paper.py. The held-out tasks are the release's `max_tasks: 8` of the test split.
RELEASE_TRAIN_TASKS = (
    "0",
    "1",
    "2",
    "3",
    "4",
    "6",
    "7",
    "8",
    "10",
    "11",
    "13",
    "14",
    "15",
    "16",
    "19",
    "20",
)
RELEASE_COTRAIN_TASKS = tuple(str(i) for i in range(16))
RELEASE_HELD_OUT = ("5", "9", "12", "17", "18", "26", "27", "32")
_FROZEN_DRAW = (
    "the release played the first 16 retail train tasks (ids {ids}) every step, of 74"
    " (its data source's fallback; usim/slime/rollout.py@9d3a41e2 plays train task number"
    " sample.index)"
)
_COTRAIN_DRAW = (
    "the release played task ids 0-15 of all 114 every step (task_id = str(sample.index),"
    " tau2_cotrain_rollout.py@6218b975), held-out tasks {seen} among them: its held-out"
    " numbers were partly measured on tasks it trained on ({n} of the 8)"
)


def task_draws(result: Result) -> dict[str, str] | None:
    """For a tau2 result: what the release trained on, and what this config does; None else."""
    from agents.domains.tau2.taskset import TAU2_DOMAINS
    from training.config import load_config

    if result.domain not in TAU2_DOMAINS:
        return None
    config = load_config(result.config)
    if config.steps == 0:
        return {"release": "no training (an evaluation at rollout 0)", "parley": "no training"}
    if config.trains_simulator:
        seen = [t for t in RELEASE_COTRAIN_TASKS if t in RELEASE_HELD_OUT]
        release = _COTRAIN_DRAW.format(seen=", ".join(seen), n=len(seen))
    else:
        release = _FROZEN_DRAW.format(ids=" ".join(RELEASE_TRAIN_TASKS))
        if config.regime == "ensemble":
            release += "; each task always met one member (sample.index % 3)"
    if result.domain == "airline":
        release = "none: the release has no airline run; on retail, " + release
    if config.task_draw == "release":
        parley = 'the same (task_draw = "release")'
    else:
        parley = (
            f"{config.batch_tasks} tasks drawn from the {result.domain} train split each step"
            ' (task_draw = "split", what the release intended)'
        )
    return {"release": release, "parley": parley}


# Results the release does not cover for a domain, and why.
NOT_COVERED = (
    ("p4g", "persona", "the release's README: not applicable, P4G tasks already carry personas"),
    ("p4g", "cooperative", "a tau2 ablation in the release; P4G's user opposes the agent"),
    (
        "all",
        "adversarial simulator reward on tau2",
        "none in the release: its tau2 rollout has no adversarial mode",
    ),
    (
        "all",
        "Verbalized Sampling with Haiku 4.5 / GPT-4o",
        "ablations/vs_haiku_tau2.sh and"
        " vs_gpt4o_tau2.sh: not in this registry (their 3-model panel)",
    ),
    ("all", "Qwen3-8B rows, pool size K in {1,3,5,10}", "none in the release"),
)

_RESULTS = {
    "p4g": (
        "base",
        "single-gpt5mini",
        "single-haiku",
        "single-gemini",
        "ensemble",
        "verbalized",
        "verbalized-prob",
        "selfplay",
        "population",
    ),
    "retail": (
        "base",
        "single-gpt5mini",
        "single-haiku",
        "single-gemini",
        "persona",
        "ensemble",
        "verbalized",
        "verbalized-prob",
        "selfplay",
        "population",
        "cooperative",
    ),
}
_RESULTS["airline"] = _RESULTS["retail"]
_RESULTS["cooperbench"] = ("coop",)


def _result(domain: str, result: str) -> Result:
    release = domain if domain in ("p4g", "cooperbench") else "tau2"
    launcher = _at(_LAUNCHERS[(release, result)])
    differences = _OWN.get(result, ()) + _DOMAIN_OWN.get((domain, result), ())
    if release == "tau2":
        differences = _TAU2 + differences
    if domain == "airline":
        launcher = f"none: retail's {launcher}"
        differences = _AIRLINE + differences
    elif domain == "p4g":
        differences = _P4G + differences
    return Result(f"{domain}-{result}", _NAMES[result], domain, launcher, differences)


RESULTS: tuple[Result, ...] = tuple(_result(d, r) for d in DOMAINS for r in _RESULTS[d])


def by_key() -> dict[str, Result]:
    return {r.key: r for r in RESULTS}


def describe(result: Result) -> dict[str, Any]:
    """A result with its config's offline dry run: the command, the memory per GPU, the checks."""
    from training.config import load_config
    from training.tools.dryrun import dry_run

    run = dry_run(str(result.config), offline=True, accelerate_config=str(REPO / ACCELERATE))
    memory = run["memory"]
    failed = [f"{c['name']}: {c['detail']}" for c in run["checks"] if not c["ok"]]
    return {
        "key": result.key,
        "name": result.name,
        "domain": result.domain,
        "config": str(result.config.relative_to(REPO)),
        "command": result.command,
        "launcher": result.launcher,
        "memory_gib": memory.get(
            "total_checkpointing_on_gib"
            if load_config(result.config).gradient_checkpointing
            else "total_checkpointing_off_gib"
        ),
        "memory": memory,
        "ready": run["ok"],
        "failed_checks": failed,
        "differences": list(result.differences),
        "tasks": task_draws(result),
    }


def table() -> dict[str, Any]:
    return {
        "release": RELEASE,
        "commit": RELEASE_COMMIT,
        "shared_differences": list(SHARED),
        "results": [describe(r) for r in RESULTS],
        "not_covered": [{"domain": d, "result": r, "why": w} for d, r, w in NOT_COVERED],
    }


def render(data: dict[str, Any]) -> str:
    """The table for a terminal: one line per result, then its differences."""
    lines = [f"The paper's results ({data['release']}@{data['commit'][:10]}); one 8-GPU node each."]
    for row in data["results"]:
        memory = f"{row['memory_gib']:.1f} GiB/GPU" if row["memory_gib"] is not None else "?"
        state = "ready" if row["ready"] else "NOT READY: " + "; ".join(row["failed_checks"])
        lines += [
            "",
            f"{row['key']}  {row['name']}  [{memory}, {state}]",
            f"  config:   {row['config']}",
            "  memory:   per GPU by phase: "
            + (
                ", ".join(f"{k} {v:.1f}" for k, v in row["memory"].get("phases_gib", {}).items())
                or "?"
            )
            + " GiB",
            f"  command:  {row['command']}",
            f"  launcher: {row['launcher']}",
        ]
        if row.get("tasks"):
            lines += [
                f"  tasks:    release: {row['tasks']['release']}",
                f"            parley:  {row['tasks']['parley']}",
            ]
        lines += [f"  - {d}" for d in row["differences"]]
    lines += ["", "Every config also differs from the release in:"]
    lines += [f"  - {d}" for d in data["shared_differences"]]
    lines += ["", "Not covered:"]
    lines += [f"  - {n['domain']}: {n['result']}: {n['why']}" for n in data["not_covered"]]
    return "\n".join(lines)
