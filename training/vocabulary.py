"""training's vocabularies, each declared once: the config's validation, the admin's choices and
filters, the CLI's help and the trainer all read them from here.

Regime (and SimulatorKind) are str-valued enums: a member equals its string, so TOML configs,
stored TrainingRun rows and manifests keep the plain names ("single", "plain") they always had.
The run config's other closed sets are a dict of name -> help (the config's field help is
written from it) or a tuple of names; a table keyed by one elsewhere (grpo.REDUCERS,
grpo.KL_ESTIMATORS, policy.TORCH_DTYPES, dryrun.BYTES) is held to it by
tests/training/test_vocabularies.py.
"""

from __future__ import annotations

from enum import StrEnum

# declared with the simulator spec, below training (a regime names the kind it is made of)
from agents.serving.vllm import IPC, NCCL, PARLEY_SHM
from agents.simulators.spec import SimulatorKind


class Regime(StrEnum):
    """Where the agent's simulator comes from and whether it learns. Each member carries its
    label (the paper's name; its release keeps "cotrain" in its identifiers for Self-Play:
    CHATS-lab/scope_usim cmd/slime/README.md), whether it trains the simulator, and the simulator
    kind it is made of (None: the config's own). training/regimes/regime.py has one class per
    member, each naming its member."""

    label: str
    trains_simulator: bool
    simulator_kind: SimulatorKind | None

    SINGLE = "single", "RL single simulator"
    PERSONA = "persona", "Persona-Guided"
    ENSEMBLE = "ensemble", "Ensemble"
    VERBALIZED = "verbalized", "Verbalized Sampling", False, SimulatorKind.VERBALIZED
    COTRAIN = "cotrain", "Self-Play (co-training)", True
    POPULATION = "population", "Population Self-Play", True

    def __new__(
        cls,
        value: str,
        label: str,
        trains_simulator: bool = False,
        simulator_kind: SimulatorKind | None = None,
    ):
        member = str.__new__(cls, value)
        member._value_ = value
        member.label = label
        member.trains_simulator = trains_simulator
        member.simulator_kind = simulator_kind
        return member

    @classmethod
    def choices(cls) -> list[tuple[str, str]]:
        """(name, label) of every regime, in declaration order (Django choices, the CLI's help)."""
        return [(r.value, r.label) for r in cls]


# -- the run config's closed sets (training/config_schema.py validates with them) --------

# how an Ensemble run picks the member that plays a rollout's user (training/regimes/regime.py Ensemble)
ENSEMBLE_DRAWS = {
    "rollout": "round-robin over the run's rollouts, as the release's P4G (each group meets"
    ' every member; its tau2 ran per task: task_draw = "release")',
    "task": "round-robin over the run's tasks (a task's whole group meets one member)",
}
# which tasks a step plays (training/trainer/loop.py step_tasks). The release's tau2 data source
# (CHATS-lab/scope_usim usim/slime/data_source.py; read at 16f3ec27, a plain loader without
# Slime's get_samples, at b6bab9af and at 1c268eb0, the newest the index holds) imports
# tau2.data_model.tasks.get_tasks, which no tau2 version defines; both Slime versions then fall
# back to index-only samples Sample(group_index=i, index=i), i = 0..15 every step:
# usim/slime/rollout.py@9d3a41e2 plays train task number sample.index and picks the user
# sample.index % K; tau2_cotrain_rollout.py@6218b975 plays task id str(sample.index)
TASK_DRAWS = {
    "split": "each step draws batch_tasks distinct tasks of the train split at random (seeded by"
    " seed and step); an Ensemble's member per ensemble_draw: what the release intended",
    "release": "the release's tau2 draws as they ran: frozen-user regimes play the first"
    " batch_tasks train tasks, in the data's order, every step, and an Ensemble's member is the"
    " task's position mod K (each task always meets the same member); cotrain and population"
    ' play the tasks with ids "0" .. batch_tasks - 1 of the whole task set, test tasks included',
}
# how a step's per-token losses become one number (training/rl/grpo.py REDUCERS)
LOSS_REDUCTIONS = {
    "token": "one token mean over the global batch: a long conversation weighs more",
    "sample": "each sequence's token mean, then the mean over the global batch's sequences:"
    " Slime's default sum_of_sample_mean (no --calculate-per-token-loss), the release's",
}
# how a co-trained simulator learns from a step (training/regimes/exact_update.py for "exact")
SIMULATOR_UPDATES = {
    "sampled": "GRPO on its own sampled tokens, advantages relative to the task's group (which"
    " mixes the agent's different asks), the KL to its base estimated on those tokens"
    " (kl_estimator)",
    "exact": "on an exact decision (a Domain whose simulator answers one opening ask with one of"
    " fixed texts: P4G's five markers), the exact expected advantage over every text for each"
    " ask played, baseline the ask's own expected reward, plus simulator_beta x the exact"
    " reverse KL(pi || base) over the texts (kl_estimator and kl_clamp do not apply)",
}
# a co-trained simulator's reward, r the agent's (formulas and sources: training/regimes/sim_rewards.py)
SIMULATOR_REWARDS = {
    "auto": "the Domain's own (its simulator_reward attribute)",
    "curriculum": "exp(-(var - 0.25)^2 / 0.02), var the variance of the agent's rewards over"
    " the task's group: highest when they split evenly (the release's tau2 default)",
    "cooperative": "r (the release's tau2 ablation)",
    "adversarial": "1 - r (the release's p4g; it has no adversarial mode for tau2)",
}
FINETUNE = ("lora", "full")
DTYPES = ("float32", "bfloat16", "float16")

# How the held-out panel's tasks are drawn at each evaluation (training/measures/held_out.py).
EVAL_DRAWS = {
    "split": "every panel member plays each eval-side task eval_samples times, the same tasks"
    " at every evaluation",
    "training_cursor": "the release's P4G draw (CHATS-lab/scope_usim usim/p4g/rollout.py @"
    " 9d3a41e, _p4g_eval_single_dataset: get_samples(16) on the training data source): each"
    " member in turn takes the next 16 tasks of the training order (sorted ids, cycling) after"
    " those the steps (batch_tasks each) and earlier members and evaluations took, each task"
    " played group_size x eval_samples times; needs eval_split = train_split",
}

# Which users make up the held-out panel of a Persona-Guided or Verbalized Sampling run.
HELDOUT_USERS = {
    "like_training": "as the release's tau2 evaluation (usim/slime/rollout.py @ e2110a1 copies"
    " the run's args, --usim-user-prompt-prefix and --usim-verbalized-sampling included, into"
    " every panel user): each member gets the training simulator's guidelines (regime"
    " persona) or Verbalized Sampling k and draw (regime verbalized), written heldout/...;"
    " the plain panel is evaluated too, written heldout_plain/...",
    "plain": "the members as their [[heldout]] tables give them, written heldout/...",
}

# how the training processes share the model (config: distributed.strategy)
DISTRIBUTED_STRATEGIES = ("ddp", "fsdp")

# what the curation's quality gate drops a rollout for (training/measures/curation.py GATES)
CURATION_GATES = {
    "fallback": "a Verbalized simulator's reply (or an endpoint's choice turn) fell back to raw"
    " text",
    "empty": "a simulator turn with no text and no tool call",
    "cut": "a simulator turn cut off at its max_new_tokens (sampled in this process or by vLLM)",
    "parse": "a simulator turn holding a tool-call block that did not parse (left as text)",
}

# per-token estimators of KL(pi || pi_ref) (their formulas: training/rl/grpo.py KL_ESTIMATORS)
KL_ESTIMATOR_NAMES = ("k1", "k2", "k3")

# how a full fine-tuning run's weights reach its vLLM server: "auto" (by the trainer's device,
# training/rollouts/weight_sync.py) or one of vLLM's backends, named in agents/serving/vllm.py
WEIGHT_SYNC_BACKENDS = ("auto", NCCL, IPC, PARLEY_SHM)
