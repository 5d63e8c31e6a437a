"""Figures of a report: means with CIs per arm, and Likert answer distributions.

Drawn from the report dict alone (no raw data), with matplotlib's object API
and the Agg canvas, so it works in a Celery worker without a display and
never touches pyplot's global state.
"""

from __future__ import annotations

import io
import math
import re
from typing import Any

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from .plan import tag
from .report import control_named

CONTROL_COLOR = "#4d4d4d"
ARM_COLOR = "#2166ac"
NEUTRAL_COLOR = "#cfcfcf"


def _new_figure(width: float, height: float, layout: str | None = "constrained") -> Figure:
    figure = Figure(figsize=(width, height), layout=layout)
    FigureCanvasAgg(figure)
    return figure


def own_scale(measure: dict[str, Any]) -> tuple[float, float] | None:
    """The y range of a measure's panel: its own scale (1..k for a Likert item, the outcome's
    or number item's range), widened a little for a range seen only in the data."""
    bounds = measure.get("range")
    if bounds is None and measure.get("likert"):  # a report from before ranges were stored
        bounds = [1, measure["scale_max"]]
    if bounds is None:
        return None
    low, high = bounds
    if measure.get("range_from") == "data":
        pad = (high - low) * 0.05 if high > low else max(abs(low) * 0.1, 0.5)
        return low - pad, high + pad
    return low, high


def means_figure(report: dict[str, Any]) -> Figure:
    """One panel per measure: each arm's mean with its CI as an error bar, on the measure's own
    scale. A CI reaching past the scale is cut at its edge (the table gives its numbers); the
    points themselves are drawn unclipped so a mean on the edge (all 7s) shows in full."""
    measures = report["measures"]
    columns = min(4, max(1, len(measures)))
    rows = max(1, math.ceil(len(measures) / columns))
    width, height = 3.2 * columns, 2.8 * rows
    figure = _new_figure(width, height)
    # Saved without a tight box (see _fitted): the layout itself keeps a margin at the edges.
    margin = 0.07  # inches
    figure.get_layout_engine().set(
        rect=(margin / width, margin / height, 1 - 2 * margin / width, 1 - 2 * margin / height)
    )
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    level = f"{report['settings']['ci_level']:.0%}"
    control = control_named(report)
    for ax, measure in zip(axes, measures, strict=False):
        name = measure["name"]
        for x, arm in enumerate(report["arms"]):
            d = arm["measures"][name]
            if d["mean"] is None:
                continue
            low, high = d["ci"]
            error = None if low is None else [[d["mean"] - low], [high - d["mean"]]]
            # The reference arm in grey; called "control" below only when one was set.
            color = CONTROL_COLOR if arm["control"] else ARM_COLOR
            bars = ax.errorbar([x], [d["mean"]], yerr=error, fmt="o", color=color, capsize=4)
            bars.lines[0].set_clip_on(False)
        ax.set_xticks(range(len(report["arms"])), [arm_label(a, control) for a in report["arms"]])
        ax.set_xlim(-0.5, len(report["arms"]) - 0.5)
        scale = own_scale(measure)
        if scale is not None:
            # A mean off its declared scale (an outcome outside the Domain's range) still shows.
            means = [a["measures"][name]["mean"] for a in report["arms"]]
            means = [m for m in means if m is not None]
            scale = (min([scale[0], *means]), max([scale[1], *means]))
            ax.set_ylim(*scale)
            if measure.get("likert"):
                ax.set_yticks(range(int(scale[0]), int(scale[1]) + 1))
        ax.set_title(measure.get("label", name), fontsize=10)
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
        for label in ax.get_xticklabels():
            label.set_horizontalalignment("right")
    for ax in axes[len(measures) :]:
        ax.set_visible(False)
    figure.suptitle(tagged(f"Mean per arm with {level} CI", report), fontsize=11)
    return figure


def tagged(title: str, report: dict[str, Any]) -> str:
    """A figure of a pre-registered study says above its title whether it is the plan's
    (confirmatory) analysis or an exploratory one."""
    line = tag(report)
    return f"{line}\n{title}" if line else title


def arm_label(arm: dict[str, Any], control: str | None) -> str:
    return arm["name"] + (" (control)" if arm["name"] == control else "")


def diverging_offsets(counts: np.ndarray) -> tuple[np.ndarray, float]:
    """Shares of each answer 1..k and where the bar starts, so the neutral middle sits on 0.

    For odd k the middle answer is split evenly around 0; for even k the lower
    half of the scale lies left of 0 and the upper half right of it.
    """
    total = counts.sum()
    shares = counts / total if total else np.zeros(counts.shape)
    k = shares.size
    left = shares[: k // 2].sum() + (shares[k // 2] / 2 if k % 2 else 0.0)
    return shares, -float(left)


def likert_figure(report: dict[str, Any], measure: str) -> Figure:
    """Diverging stacked bars of the answers (as given) to one Likert item, one bar per arm."""
    entry = next(m for m in report["measures"] if m["name"] == measure)
    if entry["distribution"] is None:
        raise ValueError(f"measure {measure!r} is not a Likert item; it has no distribution")
    k = entry["scale_max"]
    colors = list(matplotlib.colormaps["RdBu"](np.linspace(0.1, 0.9, k)))
    if k % 2:
        colors[k // 2] = NEUTRAL_COLOR  # the colormap's middle is white on white
    arms = [a["name"] for a in report["arms"]]
    # One axes and a save to the tight bounding box (TIGHT), which makes room for the arm labels
    # and the legend: constrained layout would only measure the same text again (a third of
    # the time of these figures).
    figure = _new_figure(7, 0.6 * len(arms) + 1.6, layout=None)
    ax = figure.subplots()
    shares, lefts = [], []
    for arm in arms:
        counts = np.array([entry["distribution"][arm][str(i)] for i in range(1, k + 1)], float)
        arm_shares, start = diverging_offsets(counts)
        shares.append(arm_shares)
        lefts.append(start + np.concatenate([[0.0], np.cumsum(arm_shares)[:-1]]))
    shares, lefts = np.array(shares), np.array(lefts)
    for answer in range(k):  # one bar per arm for each answer
        ax.barh(
            range(len(arms)),
            shares[:, answer],
            left=lefts[:, answer],
            color=colors[answer],
            edgecolor="white",
            linewidth=0.5,
            label=str(answer + 1),
        )
    ax.axvline(0, color="black", linewidth=0.8)
    counts_by_arm = [sum(entry["distribution"][a].values()) for a in arms]
    ax.set_yticks(
        range(len(arms)), [f"{a} (n={n})" for a, n in zip(arms, counts_by_arm, strict=True)]
    )
    ax.invert_yaxis()
    ax.set_xlim(-1, 1)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{abs(v):.0%}"))
    title = f"{measure}: answers 1..{k} by arm"
    if entry["reverse"]:
        title += " (as given; reverse-coded in the analysis)"
    ax.set_title(tagged(title, report), fontsize=10)
    ax.legend(ncols=k, loc="upper center", bbox_to_anchor=(0.5, -0.15), fontsize=8, frameon=False)
    return figure


def figures(report: dict[str, Any]) -> dict[str, Figure]:
    """All figures of a report by name: "means" and "likert-<measure>" per Likert item."""
    if report["errors"] or not report["measures"]:
        return {}
    found = {"means": means_figure(report)}
    for measure in report["measures"]:
        if measure["distribution"] is not None:
            found[f"likert-{measure['name']}"] = likert_figure(report, measure["name"])
    return found


# Saved to the bounding box of everything drawn (long arm names, a legend below the axes), with
# a margin, so nothing is cut at the figure's edge.
TIGHT = {"bbox_inches": "tight", "pad_inches": 0.1}


def _fitted(figure: Figure) -> dict[str, Any]:
    """TIGHT for a figure without a layout engine. Constrained layout already fits everything
    inside the figure; a tight box there would only measure every text once more."""
    return TIGHT if figure.get_layout_engine() is None else {}


def render_png(figure: Figure, dpi: int = 110) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi, metadata={"Software": None}, **_fitted(figure))
    return buffer.getvalue()


def render_svg(figure: Figure) -> str:
    """SVG text; fixed hash salt and no date, so the same report gives the same file. Styled by
    attributes only, so a page or viewer that refuses inline CSS still draws it."""
    buffer = io.StringIO()
    # Text as paths: matplotlib writes a font only as the CSS `font` shorthand, not an attribute.
    with matplotlib.rc_context({"svg.hashsalt": "parley", "svg.fonttype": "path"}):
        figure.savefig(buffer, format="svg", metadata={"Date": None}, **_fitted(figure))
    return styles_as_attributes(buffer.getvalue())


_STYLE_SHEET = re.compile(r"\s*<style[^>]*>\*\{([^}]*)\}</style>")
_STYLE = re.compile(r' style="([^"]*)"')


def _attributes(declarations: str) -> str:
    pairs = (d.split(":", 1) for d in declarations.split(";") if d.strip())
    return "".join(f' {name.strip()}="{value.strip()}"' for name, value in pairs)


def styles_as_attributes(svg: str) -> str:
    """matplotlib's SVG with its CSS (a `*{...}` sheet, `style="..."` on each element) turned
    into presentation attributes, which a Content-Security-Policy without 'unsafe-inline' for
    styles allows. The sheet's rules go on the root element, whence every element inherits them.
    Idempotent, so figures stored in the older form can be passed through it when served."""
    sheet = _STYLE_SHEET.search(svg)
    if sheet:
        svg = _STYLE_SHEET.sub("", svg, count=1)
        svg = svg.replace("<svg ", "<svg" + _attributes(sheet.group(1)) + " ", 1)
    return _STYLE.sub(lambda m: _attributes(m.group(1)), svg)


def render_all(report: dict[str, Any], fmt: str = "png") -> dict[str, bytes | str]:
    """Every figure rendered: PNG bytes or SVG strings by figure name."""
    render = {"png": render_png, "svg": render_svg}[fmt]
    return {name: render(figure) for name, figure in figures(report).items()}


SIMULATOR_COLOR = "#b2182b"
PEOPLE_COLOR = "#2166ac"
HUMANLIKE_COLORS = ("#1b7837", "#762a83", "#e08214")  # one per human-like simulator


def _humanlike_reward(name: str):
    return lambda arm: next(h["reward"] for h in arm["humanlike"] if h["name"] == name)


def sim2real_figure(report: dict[str, Any]) -> Figure | None:
    """The sim-to-real gap: per arm, the mean reward against the held-out simulators (and
    against each human-like simulator, a labelled series of its own) beside the mean outcome
    with people, each with its CI, and Kendall's tau in the title. None when there is nothing
    to draw."""
    arms = report.get("arms") or []
    if report.get("errors") or not arms:
        return None
    columns = 2 + len(report.get("humanlike") or [])
    figure = _new_figure(max(4.0, (0.45 * columns + 0.4) * len(arms) + 2), 3.2)
    ax = figure.subplots()
    x = np.arange(len(arms))
    sides = [("simulators (reward)", SIMULATOR_COLOR, lambda a: a["simulated"]["reward"])]
    # each human-like simulator beside the training panel, in a colour of its own
    for k, like in enumerate(report.get("humanlike") or []):
        color = HUMANLIKE_COLORS[k % len(HUMANLIKE_COLORS)]
        sides.append((f"{like['label']} (reward)", color, _humanlike_reward(like["name"])))
    sides.append(("people (outcome)", PEOPLE_COLOR, lambda a: a["human"]["outcome"]))
    width = 0.12 * (len(sides) - 1)
    shifts = np.linspace(-width, width, len(sides))
    for (label, color, pick), shift in zip(sides, shifts, strict=True):
        for i, arm in enumerate(arms):
            d = pick(arm)
            if d["mean"] is None:
                continue
            low, high = d["ci"]
            error = None if low is None else [[d["mean"] - low], [high - d["mean"]]]
            ax.errorbar(i + shift, d["mean"], yerr=error, fmt="o", color=color, capsize=4,
                        label=label)  # fmt: skip
            label = None  # one legend entry per side
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, frameon=False, loc="best")
    ax.set_xticks(x, [a["name"] for a in arms])
    ax.set_xlim(-0.6, len(arms) - 0.4)
    ax.set_ylabel("mean (reward / outcome)")
    level = f"{report['ci_level']:.0%}"
    ranking = report.get("ranking") or {}
    if ranking.get("tau") is not None:
        tau, p = ranking["tau"], ranking["p"]
        title = f"Sim-to-real gap ({level} CI); Kendall's τ = {tau:.2f}, p = {p:.3g}"
    else:
        title = f"Sim-to-real gap ({level} CI); τ undefined"
    ax.set_title(title, fontsize=10)
    return figure
