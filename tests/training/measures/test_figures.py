"""A figure's panel titles are drawn whole: a title wider than its panel is wrapped before the
figure is saved (collapse.png's title was cut at both edges)."""

from matplotlib.backends.backend_agg import FigureCanvasAgg

from training.measures import metrics
from training.measures.figures import figure, save

COLLAPSE = "collapse: exploit probability, decision entropies (nats), reward variance"


def drawn_inside(fig) -> bool:
    renderer = FigureCanvasAgg(fig).get_renderer()
    box, edge = fig.axes[0].title.get_window_extent(renderer), fig.bbox
    return edge.x0 <= box.x0 and box.x1 <= edge.x1 and box.y1 <= edge.y1


def test_a_long_title_is_wrapped_whole_inside_the_figure_and_a_short_one_left(tmp_path):
    fig, (ax,) = figure(6, 3.5)  # metrics.plot's size
    ax.plot([1, 2], [0.1, 0.2])
    ax.set_title(COLLAPSE)
    save(fig, tmp_path / "collapse.png")
    assert drawn_inside(fig) and "\n" in ax.get_title()
    assert ax.get_title().replace("\n", " ") == COLLAPSE  # every word kept, in order
    fig, (ax,) = figure(6, 3.5)
    ax.set_title("train reward")
    save(fig, tmp_path / "short.png")
    assert ax.get_title() == "train reward" and drawn_inside(fig)


def test_the_runs_plots_are_written_with_the_collapse_title(tmp_path):
    rows = [{"step": s, "reward_mean": 0.5, "agent/p_exploit": 0.1 * s} for s in (1, 2)]
    written = {p.name for p in metrics.plot(rows, tmp_path)}
    assert "collapse.png" in written and (tmp_path / "collapse.png").stat().st_size > 0
