"""Held-out evaluation: the agent against each simulator of a panel none of which it trained
against, on held-out tasks. Reports per simulator the success rate and mean reward, and the
policy's entropy on its own held-out tokens (a collapsing policy's entropy falls).

With several ranks every rank plays its share of the panel's (member, task) pairs and the
results are gathered, so no rank waits in a collective while another plays the whole panel
(a tau2 panel of 6 members x 8 tasks x 4 samples would outlast NCCL's 10-minute timeout). Each
pair's conversations are seeded from (seed, step, member, task), so the figures are the same at
any process count.

A Persona-Guided or Verbalized Sampling run's panel is, by default (heldout_users =
"like_training"), built as the release built it: every member with the run's guidelines or its
Verbalized Sampling setting (CHATS-lab/scope_usim usim/slime/rollout.py @
e2110a13e24b57113066d85a85a6680ba8bfba31: `_usim_eval_single_dataset` copies the training args,
`--usim-user-prompt-prefix` and `--usim-verbalized-sampling` included, and overrides only the
model, base URL and key). The plain panel is evaluated beside it on the same tasks, written
under `heldout_plain/`, so both read-outs exist."""

from __future__ import annotations

import random
import statistics
from typing import Any

import torch

from agents.domains.base import Domain, Scenario
from training.config_schema import EVAL_DRAW_WINDOW, RunConfig
from training.regimes.regime import ModelCache, frozen_simulator
from training.rl.distributed import Ranks
from training.rl.logprobs import TokenBatch, token_logprobs
from training.rl.policy import LocalModel
from training.rollouts.agent import LocalAgent, agent_tool_format
from training.rollouts.rollout import Rollout, play


def cursor_tasks(
    tasks: list[Scenario], config: RunConfig, step: int, member: int, members: int
) -> list[tuple[Scenario, int]]:
    """eval_draw = "training_cursor": the tasks panel member `member` (of `members`) plays at
    the evaluation after `step`, as the release's P4G evaluation draws them: its data source's
    one cursor over the training files (sorted, cycling) has moved batch_tasks per step and
    EVAL_DRAW_WINDOW per member at each earlier evaluation; each task drawn is a group of
    group_size samples, each played eval_samples times (usim/p4g/rollout.py @ 9d3a41e,
    usim/p4g/data_source.py @ 1c2c23a). Parley's training draw itself is its own (random per
    step): the cursor counts what the release's would have taken."""
    every = config.eval_every  # evaluations before this one: every eval_every steps
    earlier = (step - 1) // every if every and step > 0 else 0
    start = step * config.batch_tasks + (earlier * members + member) * EVAL_DRAW_WINDOW
    window = [tasks[(start + i) % len(tasks)] for i in range(EVAL_DRAW_WINDOW)]
    return [(t, config.group_size * config.eval_samples) for t in window]


class HeldOutPanel:
    def __init__(
        self, config: RunConfig, domain: Domain, tasks: list[Scenario], models: ModelCache
    ):
        self.config, self.domain, self.tasks = config, domain, tasks
        # the read-outs' members, by metrics prefix, then name (RunConfig.panel_readouts)
        self.readouts = {
            prefix: {spec.name: frozen_simulator(spec, models, config.seed) for spec in specs}
            for prefix, specs in config.panel_readouts().items()
        }
        self.simulators = self.readouts["heldout"]

    def __bool__(self) -> bool:
        return bool(self.simulators and self.tasks)

    def scenarios(self, member: int, step: int) -> list[tuple[Scenario, int]]:
        """The tasks panel member number `member` plays at the evaluation after `step`, each
        with how many conversations it gets."""
        cfg = self.config
        if cfg.tasks.eval_draw == "training_cursor":
            return cursor_tasks(self.tasks, cfg, step, member, len(self.simulators))
        return [(t, cfg.eval_samples) for t in self.tasks]

    def evaluate(self, agent: LocalModel, step: int, ranks: Ranks | None = None) -> dict[str, Any]:
        """The panel's figures at `step`, on every rank (each plays its share: the module's
        docstring); every rank must call it, on the agent's full weights under FSDP."""
        cfg, ranks = self.config, ranks or Ranks()
        tool_format = agent_tool_format(cfg.tool_format, agent)
        speaker = LocalAgent(agent, cfg.temperature, cfg.max_new_tokens, tool_format)
        # every (read-out, member, task) the evaluation plays, shared out across the ranks
        units = [
            ((prefix, name, index), (task, times))
            for prefix, simulators in self.readouts.items()
            for member, name in enumerate(simulators)
            for index, (task, times) in enumerate(self.scenarios(member, step))
        ]
        mine = [
            (unit, self._play(speaker, *unit, *work, step)) for unit, work in ranks.share(units)
        ]
        played = dict(ranks.gather(mine))  # every unit's rollouts, on every rank
        row: dict[str, Any] = {}
        every: list[Rollout] = []
        for prefix, simulators in self.readouts.items():
            for name in simulators:
                rollouts = [
                    r for (p, n, _), rs in played.items() if (p, n) == (prefix, name) for r in rs
                ]
                row[f"{prefix}/{name}/success"] = statistics.fmean(
                    bool(r.outcome.success) for r in rollouts
                )
                row[f"{prefix}/{name}/reward"] = statistics.fmean(r.reward for r in rollouts)
                if prefix == "heldout":
                    every += rollouts
            unseen = [s.name for s in cfg.heldout if not s.seen]
            row.update(panel_means(prefix, row, list(simulators), unseen))
        row["heldout/entropy"] = mean_entropy(agent, every, cfg.micro_batch, cfg.temperature, ranks)
        return row

    def _play(
        self,
        speaker: LocalAgent,
        prefix: str,
        name: str,
        index: int,
        task: Scenario,
        times: int,
        step: int,
    ) -> list[Rollout]:
        """Member `name`'s (of read-out `prefix`) `times` conversations on its task number
        `index`, seeded from the unit alone (torch's generator for both speakers' sampling, the
        member's own for its draws), so they do not depend on which rank plays them or what it
        played before."""
        cfg, user = self.config, self.readouts[prefix][name]
        seed = f"{cfg.seed}-{step}-eval-{name}-{index}"
        if prefix != "heldout":  # a second read-out's member has a seed of its own
            seed = f"{prefix}-{seed}"
        torch.manual_seed(random.Random(seed).getrandbits(63))
        user.rng.seed(seed)
        # at most rollouts_at_once conversations open at once, as in training (0: all `times`)
        at_once = cfg.rollouts_at_once or times
        played: list[Rollout] = []
        for first in range(0, times, at_once):
            played += play(
                self.domain,
                [task] * min(at_once, times - first),
                speaker,
                user,
                max_turns=cfg.max_turns,
                max_tool_rounds=cfg.max_tool_rounds,
                first=first,
            )
        return played


def panel_means(
    prefix: str, row: dict[str, Any], names: list[str], unseen: list[str]
) -> dict[str, float]:
    """A read-out's means over its members `names` (row's `<prefix>/<name>/...` entries)."""
    means = {
        f"{prefix}/success": statistics.fmean(row[f"{prefix}/{n}/success"] for n in names),
        f"{prefix}/reward": statistics.fmean(row[f"{prefix}/{n}/reward"] for n in names),
        f"{prefix}/worst_reward": min(row[f"{prefix}/{n}/reward"] for n in names),
    }
    # The release's means span its whole panel, training simulators included; the unseen
    # means are the held-out ones proper (written only when the panel has a seen member)
    if unseen and len(unseen) < len(names):
        for measure in ("success", "reward"):
            means[f"{prefix}/unseen_{measure}"] = statistics.fmean(
                row[f"{prefix}/{n}/{measure}"] for n in unseen
            )
        means[f"{prefix}/unseen_worst_reward"] = min(row[f"{prefix}/{n}/reward"] for n in unseen)
    return means


ENTROPY_ROLLOUTS = 32  # the token entropy is a mean: a sample of the panel's conversations


@torch.no_grad()
def mean_entropy(
    agent: LocalModel,
    rollouts: list[Rollout],
    micro_batch: int,
    temperature: float = 1.0,
    ranks: Ranks | None = None,
) -> float:
    """Mean per-token entropy of the agent's distribution at the tokens it sampled, at the
    sampling temperature (on choice turns, of the restricted distribution). With `ranks`
    (every rank holding the same `rollouts`), each rank scores its share of the sample."""
    ranks = ranks or Ranks()
    total, tokens = 0.0, 0.0
    step = max(1, len(rollouts) // ENTROPY_ROLLOUTS)
    rollouts = ranks.share(rollouts[::step][:ENTROPY_ROLLOUTS])
    for i in range(0, len(rollouts), micro_batch):
        chunk = rollouts[i : i + micro_batch]
        batch = TokenBatch.from_lists(
            [r.agent.ids for r in chunk],
            [r.agent.mask for r in chunk],
            agent.pad_id,
            [r.agent.allowed for r in chunk],
        )
        with agent.compute():  # mixed precision: the dtype its turns were sampled in
            _, entropy = token_logprobs(
                agent.model, batch, with_entropy=True, temperature=temperature
            )
        total += float((entropy * batch.mask).sum())
        tokens += float(batch.mask.sum())
    total, tokens = ranks.total(total), ranks.total(tokens)
    return total / tokens if tokens else 0.0
