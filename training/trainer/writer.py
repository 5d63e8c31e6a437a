"""What a run writes and tells after each step, in one place: metrics.jsonl, samples.jsonl, the
collapse warnings, checkpoints with the plots beside them, the progress bar and the progress
callbacks. Rank 0 alone writes; another rank only takes its part in gathering a checkpoint, so
the loop (training/trainer/loop.py) has no rank guard of its own.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm import tqdm

from training.config_schema import RunConfig
from training.layout import METRICS_FILE, RUN_CONFIG_FILE, SAMPLES_FILE
from training.measures.breaker import EVENTS, STATE, Breaker, Verdict
from training.measures.diversity import Warnings
from training.measures.metrics import MetricsLog, plot
from training.rl.distributed import Ranks
from training.rollouts.rollout import Rollout
from training.trainer import checkpoint

Progress = Callable[[dict[str, Any]], None]
Phase = Callable[..., None]  # (phase, rollouts done, rollouts total[, turns taken in them])


class RunWriter:
    def __init__(
        self,
        config: RunConfig,
        run_dir: Path,
        start: int,
        ranks: Ranks,
        agent: Any,
        regime: Any,
        progress_callback: Progress | None,
        within_step: Progress | None,
        show_progress: bool,
        breaker: Breaker | None = None,
    ):
        self.config, self.run_dir, self.start, self.ranks = config, run_dir, start, ranks
        self.agent, self.regime = agent, regime
        self.main = ranks.main  # rank 0 alone writes the run's files
        self.breaker = breaker  # [breaker]: its state goes into every checkpoint
        # its events, one a line; a resume sets aside those of the steps it replays
        self.events = MetricsLog(run_dir / EVENTS, resume_step=start) if self.main else None
        self.progress_callback = progress_callback
        self.within_step = within_step if self.main else None
        self.show_progress = show_progress and self.main
        self.log = MetricsLog(run_dir / METRICS_FILE, resume_step=start) if self.main else None
        self.samples = MetricsLog(run_dir / SAMPLES_FILE, resume_step=start) if self.main else None
        if self.main:
            (run_dir / RUN_CONFIG_FILE).write_text(_json(config.to_dict()))
        rows = self.log.rows() if self.main else []
        self.warnings = Warnings(config.collapse, rows)  # a resumed run keeps the warnings it gave
        self.heldout: dict[str, float] | None = _last_heldout(rows)
        self.optimizer_steps = int(sum(r.get("optimizer_step", 0) for r in rows))
        self.last: dict[str, Any] = {"total_steps": config.steps}  # the last step's, as sent

    def begin(self) -> None:
        """The clock the ETA is measured from starts here, just before the first step."""
        self.started, self.saved = time.monotonic(), checkpoint.list_checkpoints(self.run_dir)
        self.bar = tqdm(
            total=self.config.steps,
            initial=self.start,
            desc=self.config.name,
            disable=not self.show_progress,
        )

    def phase(
        self, step: int, phase: str, rollouts_done: int, rollouts_total: int, turns_done: int = 0
    ) -> None:
        """Sends the last step's progress with where this step is (`current`). The last step's
        checkpoint stays in it: a reader of the progress file may not have seen it."""
        if self.within_step is not None:
            current = {
                "step": step,
                "phase": phase,
                "rollouts_done": rollouts_done,
                "rollouts_total": rollouts_total,
                "turns_done": turns_done,
            }
            self.within_step({**self.last, "current": current})

    def record(
        self,
        step: int,
        row: dict[str, Any],
        rollouts: list[Rollout],
        verdict: Verdict | None = None,
    ) -> Path | None:
        """The step's row and samples, its warnings and breaker events, the checkpoint when due
        (and when the breaker stops the run), the progress. Returns the checkpoint written."""
        config = self.config
        save = due(step, config.save_every, config.steps) or bool(verdict and verdict.stop)
        files = {STATE: self.breaker.state()} if self.breaker is not None else None
        if not self.main:
            if save:  # its part of the gathering
                checkpoint.save(
                    self.run_dir,
                    step,
                    config,
                    self.agent,
                    self.regime,
                    row,
                    ranks=self.ranks,
                    files=files,
                )
            return None
        self.log.write(row)
        for event in verdict.events if verdict else []:  # each with the measures that caused it
            self.note(event)
        for warning in self.warnings.check(row):  # once per threshold, when first crossed
            tqdm.write(f"collapse warning: {warning['message']}", file=sys.stderr)
        self.samples.write_many(
            {
                "step": step,
                "task": r.scenario.id,
                "reward": r.reward,
                "end_reason": r.end_reason,
                "conversation": r.conversation,
            }
            for r in rollouts[:: config.group_size]
        )
        self.heldout = _last_heldout([row]) or self.heldout

        # 5. checkpoint every save_every steps and at the end, with the plots beside it
        folder = None
        if save:
            folder = checkpoint.save(
                self.run_dir,
                step,
                config,
                self.agent,
                self.regime,
                row,
                ranks=self.ranks,
                files=files,
            )
            # retention (keep_checkpoints): the last N and the best; the one a resume loads
            # (the newest, just written) is always among the last N
            self.saved = checkpoint.prune(
                self.run_dir, config.keep_checkpoints, config.keep_best_by
            )
            plot(self.log.rows(), self.run_dir)

        self.bar.update(1)
        self.bar.set_postfix(reward=f"{row['reward_mean']:.3f}", entropy=f"{row['entropy']:.2f}")
        if self.progress_callback is not None:
            eta = (time.monotonic() - self.started) / (step - self.start) * (config.steps - step)
            self.last = {
                "step": step,
                "total_steps": config.steps,
                "reward": row["reward_mean"],
                "heldout_success": _heldout_summary(self.heldout),
                "eta_seconds": eta,
                "metrics": row,
                "checkpoint": str(folder) if folder else None,
                "warnings": list(self.warnings.seen),
            }
            if self.breaker is not None:  # the run page's breaker line
                self.last["breaker"] = {
                    "level": self.breaker.level,
                    "share": self.breaker.share,
                    "stop": verdict.stop if verdict else "",
                }
            self.progress_callback(self.last)
        return folder

    def note(self, event: dict[str, Any]) -> None:
        """A breaker event: into <run>/breaker.jsonl and said on stderr (rank 0)."""
        if self.main:
            self.events.write(event)
            tqdm.write(event["message"], file=sys.stderr)

    def close(self) -> list[Path]:
        """The run's complete checkpoints, oldest first."""
        self.bar.close()
        return self.saved


def due(step: int, every: int, last: int) -> bool:
    return step == last or (every > 0 and step % every == 0)


def evaluation_due(step: int, config: Any) -> bool:
    """The held-out panel runs after this step: every eval_every steps, and after the last one
    unless eval_at_end is false (the release's schedule: 16, 32, ... 992 of 1000)."""
    return due(step, config.eval_every, config.steps if config.eval_at_end else -1)


def _last_heldout(rows: list[dict[str, Any]]) -> dict[str, float] | None:
    for row in reversed(rows):
        if "heldout/success" in row:
            return {k: v for k, v in row.items() if k.startswith("heldout/")}
    return None


def _heldout_summary(heldout: dict[str, Any] | None) -> dict[str, float] | None:
    """{simulator name: success rate} from the last evaluation."""
    if not heldout:
        return None
    return {
        k.split("/")[1]: v
        for k, v in heldout.items()
        if k.endswith("/success") and k.count("/") == 2
    }


def _json(data: Any) -> str:
    return json.dumps(data, indent=2, default=str)
