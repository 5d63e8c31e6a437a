"""The run's regime, chosen by its config: the regime's class (training/regimes/regime.py
CLASSES), with COLLAPSE-AWARE's synthesis supplies mixed in front of it when [synthesis] has one
on (training/regimes/synthesis.py). Its own module, above both, so neither imports the other."""

from __future__ import annotations

from pathlib import Path

from training.config_schema import RunConfig
from training.regimes.regime import CLASSES, ModelCache, RegimeRun
from training.regimes.synthesis import Synthesis, synthesized
from training.rl.distributed import Ranks
from training.vocabulary import Regime


def make_regime(
    config: RunConfig, run_dir: Path, models: ModelCache, ranks: Ranks | None = None
) -> RegimeRun:
    """The run's regime; with a [synthesis] supply on, the same class with the supplies mixed
    in front of it (training/regimes/synthesis.py), so a run without one is today's exactly."""
    cls = CLASSES[Regime(config.regime)]
    if config.synthesis.enabled:
        regime = synthesized(cls)(config, run_dir, models, ranks)
        regime.synthesis = Synthesis(config, run_dir, models, ranks)
        return regime
    return cls(config, run_dir, models, ranks)
