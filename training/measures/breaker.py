"""COLLAPSE-AWARE's breaker: a two-level alarm on the behaviour measures, fed one metrics row a
step ([breaker], training/config_schema.py BreakerSpec; docs/training.md, "The breaker").

    green    nothing to do
    yellow   a measure is above its yellow threshold: the synthesis share (the part of the
             simulator supply that is anti-collapse synthesis, regime.synthesis_share) goes up
             by yellow_step when the breaker leaves green, and down by as much when it is back
    red      a measure is above its red threshold (or yellow lasted red_after steps): training
             stops after a resumable checkpoint, and the resumed run re-diversifies the
             simulators (regime.rediversify()) before its next step; red_stops = false
             re-diversifies at once instead

The thresholds are the run's own, never constants: each measure's values over the first
`warmup` steps (its own, so PSOD's come from the evaluation steps among them) fit

    yellow(m) = Q(x_m, yellow_quantile)
    red(m)    = Q(x_m, red_quantile) + red_margin * (max x_m - min x_m)

Q the sample quantile (Hyndman and Fan's type 7, numpy's default: `quantile` below). A level is
entered at the first step a measure is above its threshold (strictly), and left downwards one
level at a time after `recover_steps` steps in a row below it (hysteresis). A measure absent from
a row (PSOD between evaluations) keeps its last reading.

Every transition is an event in <run>/breaker.jsonl with the measures that caused it (value and
both thresholds), and the row carries breaker/level (0 green, 1 yellow, 2 red) and
breaker/synthesis_share. Its state goes into each checkpoint (breaker.json), so a resume
continues it: same thresholds, same level, the same share.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any

GREEN, YELLOW, RED = "green", "yellow", "red"
LEVELS = (GREEN, YELLOW, RED)  # breaker/level is the index
EVENTS = "breaker.jsonl"  # in the run folder
STATE = "breaker.json"  # in each checkpoint folder
# `python -m training run` exits with this when the breaker stopped the run (2: a bad config or
# resume, 1: another failure); run the same command again to resume
STOPPED_EXIT = 3
_PROBE_SCD = re.compile(r"behaviour/[^/]+/probe/scd")


class BreakerStopped(RuntimeError):
    """The breaker went red and stopped the run after writing a resumable checkpoint."""

    def __init__(self, reason: str, step: int, checkpoint: str = ""):
        super().__init__(reason)
        self.reason, self.step, self.checkpoint = reason, step, checkpoint


def quantile(values: list[float], q: float) -> float:
    """The sample quantile, type 7: with x sorted and h = (n - 1) q,
    Q = x[floor h] + (h - floor h) (x[ceil h] - x[floor h])."""
    x = sorted(values)
    h = (len(x) - 1) * q
    low = math.floor(h)
    high = min(low + 1, len(x) - 1)
    return x[low] + (h - low) * (x[high] - x[low])


def judged(measures: list[str], row: dict[str, Any]) -> dict[str, float]:
    """The row's values of the measures named: "scd" every probe-set SCD (one per behaviour
    space: clusters, acts, decision), "psod" psod/training, anything else the key itself.
    Only finite numbers count (a measure not taken this step is absent)."""
    keys: list[str] = []
    for name in measures:
        if name == "scd":
            keys += sorted(k for k in row if _PROBE_SCD.fullmatch(k))
        elif name == "psod":
            keys.append("psod/training")
        else:
            keys.append(name)
    out = {}
    for key in keys:
        value = row.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[key] = float(value)
    return out


@dataclasses.dataclass
class Verdict:
    """What one step's judgement asks of the trainer (every rank acts on rank 0's)."""

    level: str
    share: float  # the synthesis share from now on
    events: list[dict[str, Any]]
    stop: str = ""  # red with red_stops: why the run stops
    rediversify: bool = False  # red without red_stops: re-diversify now

    def row(self) -> dict[str, float]:
        return {
            "breaker/level": float(LEVELS.index(self.level)),
            "breaker/synthesis_share": self.share,
        }


class Breaker:
    """The state machine. `observe(step, row)` once a step, in order; `state()` and
    `Breaker(spec, base_share, state)` carry it through a checkpoint."""

    def __init__(self, spec: Any, base_share: float, state: dict[str, Any] | None = None):
        self.spec = spec
        state = state or {}
        self.base_share = float(state.get("base_share", base_share))
        self.level: str = state.get("level", GREEN)
        self.share = float(state.get("share", base_share))
        self.raised = float(state.get("raised", 0.0))  # what leaving green added to the share
        self.warmup: dict[str, list[float]] = state.get("warmup", {})
        self.thresholds: dict[str, dict[str, float]] | None = state.get("thresholds")
        self.last: dict[str, float] = state.get("last", {})
        self.calm = int(state.get("calm", 0))  # steps in a row below the level's threshold
        self.yellow_run = int(state.get("yellow_run", 0))  # steps in a row at yellow
        self.stopped: dict[str, Any] | None = state.get("stopped")  # a red stop not resumed yet

    def state(self) -> dict[str, Any]:
        return {
            "base_share": self.base_share,
            "level": self.level,
            "share": self.share,
            "raised": self.raised,
            "warmup": self.warmup,
            "thresholds": self.thresholds,
            "last": self.last,
            "calm": self.calm,
            "yellow_run": self.yellow_run,
            "stopped": self.stopped,
        }

    def observe(self, step: int, row: dict[str, Any]) -> Verdict:
        """Judge the step's row: collect it while warming up, fit the thresholds at the end of
        the warmup, then move between the levels."""
        spec, values, events = self.spec, judged(self.spec.measures, row), []
        if self.thresholds is None:
            for key, value in values.items():
                self.warmup.setdefault(key, []).append(value)
            if step >= spec.warmup:
                events.append(self._fit(step))
            return Verdict(self.level, self.share, events)
        self.last.update({k: v for k, v in values.items() if k in self.thresholds})
        severity = {k: self._severity(k, v) for k, v in self.last.items()}
        worst = max(severity.values(), default=0)
        before = self.level
        target = LEVELS.index(before)
        why = ""
        if worst > target:  # up at once, as far as the worst measure says
            target, self.calm = worst, 0
            why = "above its threshold" if worst == 1 else "above its red threshold"
        elif worst < target:  # down one level after recover_steps calm steps in a row
            self.calm += 1
            if self.calm >= spec.recover_steps:
                target, self.calm = target - 1, 0
                why = f"below the {LEVELS[target + 1]} threshold for {spec.recover_steps} steps"
        else:
            self.calm = 0
        self.yellow_run = self.yellow_run + 1 if target == 1 else 0
        if target == 1 and spec.red_after and self.yellow_run >= spec.red_after:
            target, why = 2, f"yellow for {self.yellow_run} steps in a row"
        verdict = Verdict(before, self.share, events)
        if LEVELS[target] != before:
            self._move(step, LEVELS[target], why, severity, verdict)
        return verdict

    def resumed(self, step: int, what: str) -> dict[str, Any]:
        """The run stopped red is going on: the event saying the simulators were re-diversified
        (`what`, the regime's account) before step `step` + 1."""
        stop, self.stopped = self.stopped, None
        return {
            "event": "resume",
            "step": step,
            "level": self.level,
            "stopped": stop,
            "rediversified": what,
            "message": f"breaker: resumed after the red stop at step {stop['step']};"
            f" re-diversified before step {step + 1}: {what}",
        }

    def _severity(self, key: str, value: float) -> int:
        t = self.thresholds[key]
        return 2 if value > t["red"] else 1 if value > t["yellow"] else 0

    def _fit(self, step: int) -> dict[str, Any]:
        spec, found = self.spec, {}
        for key, xs in self.warmup.items():
            spread = max(xs) - min(xs)
            found[key] = {
                "yellow": quantile(xs, spec.yellow_quantile),
                "red": quantile(xs, spec.red_quantile) + spec.red_margin * spread,
                "values": len(xs),
            }
        self.thresholds = found
        missing = [m for m in spec.measures if m not in ("scd", "psod")]
        missing = [
            m
            for m in missing + (["psod/training"] if "psod" in spec.measures else [])
            if m not in found
        ]
        said = (
            ", ".join(
                f"{k} yellow > {t['yellow']:.4g}, red > {t['red']:.4g}" for k, t in found.items()
            )
            or "nothing to judge"
        )
        if missing:
            said += f"; no warmup value, not judged: {', '.join(missing)}"
        return {
            "event": "fit",
            "step": step,
            "thresholds": found,
            "unjudged": missing,
            "message": f"breaker: thresholds from steps 1-{step}: {said}",
        }

    def _move(self, step: int, to: str, why: str, severity: dict[str, int], verdict: Verdict):
        before, self.level = self.level, to
        if before == GREEN:  # leaving green: more anti-collapse synthesis
            share = min(1.0, self.share + self.spec.yellow_step)
            self.raised, self.share = share - self.share, share
        elif to == GREEN:  # back: what leaving green added goes away again
            self.share, self.raised = max(0.0, self.share - self.raised), 0.0
        # the measures that caused it: those at the level's severity going up, every one going
        # down (each is below the threshold it left)
        level = LEVELS.index(to)
        causes = {
            k: {"value": self.last[k], **{n: self.thresholds[k][n] for n in ("yellow", "red")}}
            for k, s in severity.items()
            if (s >= level if level > LEVELS.index(before) else True)
        }
        listed = ", ".join(
            f"{k} = {c['value']:.4g} (yellow > {c['yellow']:.4g}, red > {c['red']:.4g})"
            for k, c in causes.items()
        )
        message = f"breaker: {before} -> {to} at step {step}: {why}: {listed}"
        if to == RED and self.spec.red_stops:
            verdict.stop = (
                f"the breaker went red at step {step} ({why}: {listed}); resume to"
                " continue from its checkpoint with re-diversified simulators"
            )
            self.stopped = {"step": step, "reason": verdict.stop}
            message += "; training stops"
        elif to == RED:
            verdict.rediversify = True
            message += "; re-diversifying the simulators"
        if before == GREEN or to == GREEN:
            message += f"; synthesis share {self.share:.3g}"
        verdict.level, verdict.share = to, self.share
        verdict.events.append(
            {
                "event": "transition",
                "step": step,
                "from": before,
                "to": to,
                "why": why,
                "measures": causes,
                "synthesis_share": self.share,
                "stops": bool(verdict.stop),
                "reason": verdict.stop,
                "message": message,
            }
        )


def load(checkpoint: Path) -> dict[str, Any] | None:
    """The breaker's state saved in a checkpoint folder (None: it has none)."""
    path = Path(checkpoint) / STATE
    return json.loads(path.read_text()) if path.is_file() else None


def read_events(run_dir: str | Path) -> list[dict[str, Any]]:
    """<run>/breaker.jsonl, oldest first (none: [])."""
    path = Path(run_dir) / EVENTS
    if not path.is_file():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def last_stop(run_dir: str | Path) -> dict[str, Any] | None:
    """The red stop the run is waiting in, if it is: its last transition went red with a stop
    and no resume came after it."""
    for event in reversed(read_events(run_dir)):
        if event.get("event") == "resume":
            return None
        if event.get("event") == "transition" and event.get("stops"):
            return event
    return None
