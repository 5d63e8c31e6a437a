"""Figures drawn on matplotlib's object API (a Figure of its own, no pyplot): nothing is kept in
pyplot's global state between figures, so plotting is safe beside other threads and leaks no
open figure. One shape serves the experiments' per-step plots (training/tools/experiment.py,
training/collapse2/results_report.py): a panel per measure, a line per regime, the mean over seeds.
"""

from __future__ import annotations

import statistics
import textwrap
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def figure(width: float, height: float, panels: int = 1) -> tuple[Figure, list[Axes]]:
    """A figure with `panels` axes side by side."""
    fig = Figure(figsize=(width, height))
    return fig, list(fig.subplots(1, panels, squeeze=False)[0])


def fit_titles(fig: Figure) -> None:
    """Wrap each panel's title that is wider than its panel: matplotlib cuts a title at the
    figure's edge, and tight_layout makes room above a title, never beside it (collapse.png's
    "collapse: exploit probability, decision entropies (nats), reward variance" lost both ends)."""
    renderer = FigureCanvasAgg(fig).get_renderer()
    for ax in fig.axes:
        title = ax.title
        text, room = title.get_text(), ax.get_window_extent(renderer).width
        wide = title.get_window_extent(renderer).width
        if text and wide > room:
            chars = max(12, int(len(text) * room / wide * 0.95))
            title.set_text(textwrap.fill(text, chars))


def save(fig: Figure, path: Path, dpi: int = 100) -> Path:
    fit_titles(fig)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    return path


def seed_panels(
    path: Path, panels: list[tuple[str, dict[str, list[list[float]]]]], spread: str = "band"
) -> Path:
    """One panel per (title, {regime: one series per seed}): each regime's mean over its seeds
    per step (cut to the shortest seed), with the seeds' range as a band (`spread="band"`) or
    each seed as a faint line (`spread="seeds"`)."""
    fig, axes = figure(4.2 * len(panels), 3.4, len(panels))
    for ax, (title, by_regime) in zip(axes, panels, strict=True):
        for regime, seeds in by_regime.items():
            if not seeds:
                continue
            width = min(len(s) for s in seeds)
            steps = list(range(1, width + 1))
            mean = [statistics.fmean(s[i] for s in seeds) for i in range(width)]
            (line,) = ax.plot(steps, mean, label=regime)
            if spread == "band":
                low = [min(s[i] for s in seeds) for i in range(width)]
                high = [max(s[i] for s in seeds) for i in range(width)]
                ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.15)
            else:
                for s in seeds:
                    ax.plot(steps, s[:width], color=line.get_color(), alpha=0.2, linewidth=0.8)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
    axes[0].legend(fontsize=8)
    return save(fig, path)
