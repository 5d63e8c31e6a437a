"""Figures drawn from a report: diverging Likert bars and means with CIs."""

import io

import numpy as np
import pandas as pd
import pytest
from matplotlib.text import Text

from studies.analysis import Settings, build_report
from studies.analysis.plots import (
    diverging_offsets,
    figures,
    likert_figure,
    means_figure,
    render_png,
    render_svg,
    styles_as_attributes,
)


@pytest.fixture(scope="module")
def report():
    rng = np.random.default_rng(3)
    table = pd.DataFrame(
        {
            "arm": ["base"] * 30 + ["vs"] * 25 + ["none"] * 1,
            "calm": rng.integers(1, 8, 56),
            "score": rng.normal(0, 1, 56),
        }
    )
    return build_report(table, Settings("arm", ("calm", "score"), reverse=("calm",)))


def test_diverging_offsets_put_the_middle_on_zero():
    shares, start = diverging_offsets(np.array([1, 1, 2, 1, 1.0]))
    assert shares == pytest.approx([1 / 6, 1 / 6, 2 / 6, 1 / 6, 1 / 6]) and start == pytest.approx(
        -0.5
    )
    shares, start = diverging_offsets(np.array([2, 2, 1, 3.0]))  # even k: no neutral answer
    assert start == pytest.approx(-0.5)
    shares, start = diverging_offsets(np.array([0, 0, 0.0]))
    assert (shares == 0).all() and start == 0


def test_likert_bars_cover_each_arm_and_centre_the_neutral_answer(report):
    figure = likert_figure(report, "calm")
    bars = figure.axes[0].patches
    distribution = report["measures"][0]["distribution"]
    for y, arm in enumerate(["base", "vs"]):
        row = sorted(
            (b for b in bars if abs(b.get_y() + b.get_height() / 2 - y) < 1e-9),
            key=lambda b: b.get_x(),
        )
        widths = [b.get_width() for b in row]
        counts = np.array([distribution[arm][str(k)] for k in range(1, 8)], float)
        assert widths == pytest.approx(counts / counts.sum())
        neutral = row[3]
        assert neutral.get_x() + neutral.get_width() / 2 == pytest.approx(0)
    assert "reverse-coded" in figure.axes[0].get_title()


def test_means_figure_draws_each_arm_mean(report):
    figure = means_figure(report)
    visible = [ax for ax in figure.axes if ax.get_visible()]
    assert [ax.get_title() for ax in visible] == ["calm (reversed)", "score"]
    plotted = [bar.lines[0].get_ydata()[0] for bar in visible[1].containers]
    means = [a["measures"]["score"]["mean"] for a in report["arms"]]
    assert plotted == pytest.approx(means)  # "none" (n = 1) has a mean but no error bar


def test_rendering_and_the_figure_set(report):
    found = figures(report)
    assert sorted(found) == ["likert-calm", "means"]
    assert render_png(found["means"]).startswith(b"\x89PNG\r\n\x1a\n")
    svg = render_svg(found["likert-calm"])
    assert "<svg" in svg and svg == render_svg(figures(report)["likert-calm"])  # reproducible
    with pytest.raises(ValueError, match="not a Likert item"):
        likert_figure(report, "score")
    assert figures({**report, "errors": ["bad"]}) == {}


def test_svg_is_styled_by_attributes_not_css(report):
    """A page whose Content-Security-Policy refuses inline styles draws the figure only if it
    has no <style> sheet and no style="" attributes; the older, CSS-styled form converts."""
    from xml.dom.minidom import parseString

    svg = render_svg(figures(report)["means"])
    assert "<style" not in svg and 'style="' not in svg
    root = parseString(svg).documentElement
    assert root.getAttribute("stroke-linecap") == "butt"  # the sheet's rule, inherited
    assert 'fill="#ffffff"' in svg  # the figure's white ground, once a style attribute
    buffer = io.StringIO()
    figures(report)["means"].savefig(buffer, format="svg")  # as stored before
    older = buffer.getvalue()
    assert "<style" in older and 'style="' in older
    converted = styles_as_attributes(older)
    assert "<style" not in converted and 'style="' not in converted
    parseString(converted)
    assert styles_as_attributes(svg) == svg


@pytest.fixture(scope="module")
def crowded_report():
    """Eight arms, one with a long name, an 11-point item, a measure in the tens of thousands,
    two rows of panels and a two-line title (a pre-registered study's tag): the texts that
    decide the margins."""
    rng = np.random.default_rng(5)
    arms = ["base", "a-treatment-arm-with-a-rather-long-name-v2", *"cdefgh"]
    table = pd.DataFrame(
        {
            "arm": rng.choice(arms, 400),
            "agree": rng.integers(1, 12, 400).astype(float),
            "amount": rng.normal(20_000, 5_000, 400),
            "calm": rng.integers(1, 8, 400).astype(float),
            "share": rng.random(400),
            "delay": rng.exponential(3, 400),
        }
    )
    measures = ("agree", "amount", "calm", "share", "delay")
    settings = Settings("arm", measures, scales={"agree": 11}, control="base")
    found = build_report(table, settings)
    found["preregistration"] = {"analysis": "exploratory", "sha256": "ab" * 32}
    return found


@pytest.mark.parametrize("which", ["report", "crowded_report"])
def test_everything_drawn_fits_inside_the_figure(which, request):
    # The figures are laid out from a few measured texts and saved as laid out (no tight box
    # at save): nothing drawn may reach past the figure's edge, where it would be cut.
    for name, figure in figures(request.getfixturevalue(which)).items():
        figure.draw_without_rendering()
        drawn = figure.get_tightbbox()
        width, height = figure.get_size_inches()
        assert drawn.x0 >= 0 and drawn.y0 >= 0, name
        assert drawn.x1 <= width and drawn.y1 <= height, name
        inches = figure.dpi_scale_trans.inverted()
        panels = [ax for ax in figure.axes if ax.get_visible()]
        boxes = [ax.get_tightbbox().transformed(inches) for ax in panels]
        of_panels = {id(t) for ax in figure.axes for t in ax.findobj(Text)}
        titles = [t for t in figure.findobj(Text) if id(t) not in of_panels and t.get_text()]
        boxes += [t.get_window_extent().transformed(inches) for t in titles]
        for i, box in enumerate(boxes):  # no panel's labels run into another panel or the title
            for other in boxes[i + 1 :]:
                assert not box.overlaps(other), name
