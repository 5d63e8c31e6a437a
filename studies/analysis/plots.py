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
from matplotlib.font_manager import FontProperties
from matplotlib.textpath import text_to_path

from .plan import tag
from .report import control_named

CONTROL_COLOR = "#4d4d4d"
ARM_COLOR = "#2166ac"
NEUTRAL_COLOR = "#cfcfcf"
CONSTRAINED_MARGIN = 0.07  # inches, beside constrained layout's own pads
POINT = 1 / 72  # inches
MARGIN = 0.1  # inches of white around everything drawn
TICK = (3.5 + 3.5) * POINT  # matplotlib's tick length and label pad
LABEL_SIZE, TITLE_SIZE, FIGURE_TITLE_SIZE, LEGEND_SIZE, ARM_SIZE = 10.0, 10.0, 11.0, 8.0, 8.0


def _text_width(text: str, size: float) -> float:
    """Width in inches of one line of text as the font draws it, without a figure."""
    found = text_to_path.get_text_width_height_descent(text, FontProperties(size=size), False)
    return found[0] * POINT * 1.03  # a little slack: Agg hints glyphs a bit wider or narrower


def _new_figure(width: float, height: float, layout: str | None = "constrained") -> Figure:
    """A figure saved as laid out: no tight box at save, which would measure every text once
    more. The means and Likert figures are laid out from a few measured texts (_fit_grid,
    _likert_layout); constrained layout (the sim-to-real figure) fits everything inside, here
    with a margin at the edges."""
    figure = Figure(figsize=(width, height), layout=layout)
    FigureCanvasAgg(figure)
    if layout == "constrained":
        x, y = CONSTRAINED_MARGIN / width, CONSTRAINED_MARGIN / height
        figure.get_layout_engine().set(rect=(x, y, 1 - 2 * x, 1 - 2 * y))
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
    figure = _new_figure(3.2 * columns, 2.8 * rows, layout=None)
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
        ax.set_title(measure.get("label", name), fontsize=TITLE_SIZE)
        ax.tick_params(axis="x", labelrotation=30, labelsize=ARM_SIZE)
        for label in ax.get_xticklabels():
            label.set_horizontalalignment("right")
    for ax in axes[len(measures) :]:
        ax.set_visible(False)
    title = tagged(f"Mean per arm with {level} CI", report)
    arm_labels = [arm_label(a, control) for a in report["arms"]]
    _fit_grid(figure, axes[: len(measures)], rows, columns, arm_labels, title)
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
    counts_by_arm = [sum(entry["distribution"][a].values()) for a in arms]
    labels = [f"{a} (n={n})" for a, n in zip(arms, counts_by_arm, strict=True)]
    title = f"{measure}: answers 1..{k} by arm"
    if entry["reverse"]:
        title += " (as given; reverse-coded in the analysis)"
    title = tagged(title, report)
    figure, legend_y = _likert_layout(labels, title, k)
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
    ax.set_yticks(range(len(arms)), labels)
    ax.invert_yaxis()
    ax.set_xlim(-1, 1)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{abs(v):.0%}"))
    ax.set_title(title, fontsize=TITLE_SIZE)
    ax.legend(
        ncols=k,
        loc="upper center",
        bbox_to_anchor=(0.5, legend_y),
        fontsize=LEGEND_SIZE,
        frameon=False,
    )
    return figure


def _likert_layout(labels: list[str], title: str, k: int) -> tuple[Figure, float]:
    """The Likert figure's size and margins from the few texts that decide them (the arm labels,
    the title, the legend), measured once. Constrained layout or a tight box at save measures
    every text of the figure again on each pass: most of the time of these figures. Returns the
    figure and the legend's top in axes coordinates (below the x tick labels)."""
    lines = title.count("\n") + 1
    top = MARGIN + lines * 1.2 * TITLE_SIZE * POINT + 6 * POINT  # 6 pt: the title's pad
    x_labels = TICK + 1.2 * LABEL_SIZE * POINT
    # a line, the border pad above and below, and the pad between the anchor and the legend
    legend_height = (1.2 + 2 * 0.4 + 0.5) * LEGEND_SIZE * POINT
    bottom = MARGIN + x_labels + 0.1 + legend_height
    half_edge_label = _text_width("100%", LABEL_SIZE) / 2  # the x labels at -1 and 1
    left = MARGIN + max(max(_text_width(a, LABEL_SIZE) for a in labels) + TICK, half_edge_label)
    right = MARGIN + half_edge_label
    # Each entry: handle, pad and its number; columns apart; the border pad on both sides.
    entry = (2.0 + 0.8) * LEGEND_SIZE * POINT
    legend_width = sum(entry + _text_width(str(a), LEGEND_SIZE) for a in range(1, k + 1))
    legend_width += (2.0 * (k - 1) + 2 * 0.4) * LEGEND_SIZE * POINT
    title_width = max(_text_width(line, TITLE_SIZE) for line in title.split("\n"))
    axes_width = max(7 - left - right, legend_width, title_width)
    axes_height = 0.6 * len(labels) + 0.6
    width, height = left + axes_width + right, top + axes_height + bottom
    figure = _new_figure(width, height, layout=None)
    figure.subplots_adjust(
        left=left / width, right=1 - right / width, bottom=bottom / height, top=1 - top / height
    )
    return figure, -(x_labels + 0.1) / axes_height


def _tick_label_width(ax) -> float:
    """The widest y tick label of a panel, in inches, from its locator and formatter."""
    axis = ax.yaxis
    low, high = sorted(ax.get_ylim())
    ticks = [t for t in axis.get_majorticklocs() if low - 1e-9 <= t <= high + 1e-9]
    labels = axis.get_major_formatter().format_ticks(ticks)
    return max((_text_width(label, LABEL_SIZE) for label in labels), default=0.0)


def _fit_grid(figure: Figure, axes, rows: int, columns: int, arms: list[str], title: str) -> None:
    """Margins and gaps of the means grid from the texts that decide them, measured once: the
    y tick labels, the arm names (rotated 30 degrees, right-aligned, so they reach down and to
    the left of their tick), the panel titles and the figure's title. Constrained layout
    measured every text of the twelve panels twice, then again to draw."""
    width, height = figure.get_size_inches()
    angle = math.radians(30)
    name_width = max(_text_width(a, ARM_SIZE) for a in arms)
    name_height = 1.2 * ARM_SIZE * POINT
    names_down = TICK + name_width * math.sin(angle) + name_height * math.cos(angle)
    names_left = name_width * math.cos(angle) + name_height * math.sin(angle)
    panel_title = 1.2 * TITLE_SIZE * POINT + 6 * POINT
    y_labels = max(_tick_label_width(ax) for ax in axes) + TICK
    lines = title.count("\n") + 1
    top = MARGIN + lines * 1.2 * FIGURE_TITLE_SIZE * POINT + 0.1 + panel_title
    bottom = MARGIN + names_down
    right = MARGIN + 0.05
    # The first arm's tick sits half a slot into its panel; its name reaches left of it, the
    # farther the narrower the panels that room leaves: a few rounds settle it.
    reach = y_labels
    for _ in range(3):
        left, gap_x = MARGIN + reach, reach + 0.2
        panel_width = (width - left - right - (columns - 1) * gap_x) / columns
        reach = max(y_labels, names_left - max(panel_width, 1.0) / (2 * len(arms)))
    left, gap_x = MARGIN + reach, reach + 0.2
    gap_y = names_down + panel_title + 0.15
    panel_width = (width - left - right - (columns - 1) * gap_x) / columns
    panel_height = (height - top - bottom - (rows - 1) * gap_y) / rows
    if panel_height < 1.0 or panel_width < 1.0:  # long arm names: a bigger figure, not slivers
        width += max(0.0, 1.0 - panel_width) * columns
        height += max(0.0, 1.0 - panel_height) * rows
        figure.set_size_inches(width, height)
        panel_width, panel_height = max(panel_width, 1.0), max(panel_height, 1.0)
    figure.subplots_adjust(
        left=left / width,
        right=1 - right / width,
        bottom=bottom / height,
        top=1 - top / height,
        wspace=gap_x / panel_width,
        hspace=gap_y / panel_height,
    )
    figure.suptitle(title, fontsize=FIGURE_TITLE_SIZE, y=1 - MARGIN / height, va="top")


def figures(report: dict[str, Any]) -> dict[str, Figure]:
    """All figures of a report by name: "means" and "likert-<measure>" per Likert item."""
    if report["errors"] or not report["measures"]:
        return {}
    found = {"means": means_figure(report)}
    for measure in report["measures"]:
        if measure["distribution"] is not None:
            found[f"likert-{measure['name']}"] = likert_figure(report, measure["name"])
    return found


def render_png(figure: Figure, dpi: int = 110) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi, metadata={"Software": None})
    return buffer.getvalue()


def render_svg(figure: Figure) -> str:
    """SVG text; fixed hash salt and no date, so the same report gives the same file. Styled by
    attributes only, so a page or viewer that refuses inline CSS still draws it."""
    buffer = io.StringIO()
    # Text as paths: matplotlib writes a font only as the CSS `font` shorthand, not an attribute.
    with matplotlib.rc_context({"svg.hashsalt": "parley", "svg.fonttype": "path"}):
        figure.savefig(buffer, format="svg", metadata={"Date": None})
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
            ax.errorbar(
                i + shift, d["mean"], yerr=error, fmt="o", color=color, capsize=4, label=label
            )
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


def sim2real_behaviour_figure(section: dict[str, Any] | None) -> Figure | None:
    """The behaviour section's shares: per cluster of the space fit on the study's participants,
    the people's share of their turns beside each simulator's (grouped bars), each simulator's
    BDI and Jensen-Shannon distance in its legend entry, the one most like the people first.
    None when nothing was compared."""
    if not section or section.get("error") or not (section.get("people") or {}).get("shares"):
        return None
    people = section["people"]["shares"]
    sims = [s for s in section["simulators"] if s["shares"]]
    k = len(people)
    figure = _new_figure(max(4.5, 0.22 * (len(sims) + 1) * k + 2.5), 3.4)
    ax = figure.subplots()
    width = 0.8 / (len(sims) + 1)
    x = np.arange(k)
    ax.bar(
        x - 0.4 + width / 2,
        people,
        width,
        color=PEOPLE_COLOR,
        label=f"people ({section['people']['turns']} turns)",
    )
    colors = (SIMULATOR_COLOR, *HUMANLIKE_COLORS, NEUTRAL_COLOR, CONTROL_COLOR)
    for i, s in enumerate(sims, 1):
        label = f"{s['label']}: BDI {s['bdi']:.2f}, JSD {s['jsd']:.2f}"
        ax.bar(
            x - 0.4 + width * (i + 0.5),
            s["shares"],
            width,
            color=colors[(i - 1) % len(colors)],
            label=label,
        )
    ax.set_xticks(x, [str(c + 1) for c in range(k)])
    ax.set_xlabel("behaviour cluster (fit on the participants' turns)")
    ax.set_ylabel("share of turns")
    ax.legend(fontsize=LEGEND_SIZE, frameon=False, loc="best")
    most = next((s["label"] for s in sims if s["name"] == section.get("most_like")), None)
    ax.set_title(f"Behaviour beside the people; most like them: {most or '-'}", fontsize=10)
    return figure
