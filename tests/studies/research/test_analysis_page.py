"""The analysis page, report and figures: the control named only when set, reverse-coded items
labelled, undefined CIs as "n/a", each measure drawn on its own scale and nothing cut off."""

import csv
import io
import json

import numpy as np
import pandas as pd
import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from studies.analysis import Settings, build_report, format_report
from studies.analysis.plots import means_figure, render_png
from studies.models import AnalysisRun
from studies.research import analysis_runs
from tests.support.studies import GOOD_ANSWERS, finish, make_study


def complete(study, arm, helpful, pid):
    answers = {**GOOD_ANSWERS, "helpful": str(helpful), "frustration": str(8 - helpful)}
    finish(study, pid, answers, arm=arm)


@pytest.fixture
def analysed(db):
    """Arm "base" with one participant (CI undefined), arm "vs" with three; no control set."""
    study = make_study(arms=("base", "vs"))
    complete(study, "base", 6, "p1")
    for i, helpful in enumerate([2, 3, 5]):
        complete(study, "vs", helpful, f"p{i + 2}")
    return study


def run_page(admin_client, study):
    run = analysis_runs.compute(AnalysisRun.objects.create(study=study))
    assert run.status == "done", run.error
    page = admin_client.get(reverse("admin:studies_analysisrun_change", args=[run.pk]))
    return run, page.content.decode()


@pytest.mark.django_db
def test_no_control_arm_is_named_when_none_is_set(admin_client, analysed):
    run, page = run_page(admin_client, analysed)
    assert "(control)" not in page
    assert "No control arm is set" in page
    assert "(control)" not in format_report(run.results)
    analysed.control_arm = analysed.arms.get(name="vs")
    analysed.save()
    run, page = run_page(admin_client, analysed)
    assert "vs (control)" in page and "base (control)" not in page
    assert "vs (control)" in format_report(run.results)
    assert "vs (control)" in run.figures["means"]  # the figure's tick label (an SVG comment)


@pytest.mark.django_db
def test_empty_ci_reads_n_a_on_the_page_and_in_the_text_report(admin_client, analysed):
    run, page = run_page(admin_client, analysed)
    base = next(a for a in run.results["arms"] if a["name"] == "base")
    assert base["measures"]["helpful"]["ci"] == [None, None]
    assert "[, ]" not in page and "n/a" in page
    text = format_report(run.results)
    assert "n/a" in text and "[NA, NA]" not in text and "[, ]" not in text


@pytest.mark.django_db
def test_reverse_coded_item_is_labelled_wherever_its_flipped_values_show(admin_client, analysed):
    run, page = run_page(admin_client, analysed)
    assert "frustration (reversed)" in page
    assert "frustration (reversed)" in format_report(run.results)
    assert "frustration (reversed)" in run.figures["means"]
    url = reverse("admin:studies_analysisrun_download", args=[run.pk, "json"])
    report = json.loads(admin_client.get(url).content)
    labels = {c["measure"]: c["label"] for c in report["comparisons"]}
    assert labels == {
        "helpful": "helpful",
        "frustration": "frustration (reversed)",
        "donation": "donation",
    }
    measure = next(m for m in report["measures"] if m["name"] == "frustration")
    assert measure["reverse"] and measure["label"] == "frustration (reversed)"


@pytest.mark.django_db
def test_every_csv_keeps_the_item_key_and_says_reversed_in_its_column(admin_client, analysed):
    """Scripts join CSVs on the item key: the measure cell is the key as it is, and the
    "reversed" column (not a renamed measure) says the values are flipped."""
    run, _ = run_page(admin_client, analysed)
    tables = {}
    for kind in ("csv", "input"):
        url = reverse("admin:studies_analysisrun_download", args=[run.pk, kind])
        body = admin_client.get(url).content.decode()
        assert "(reversed)" not in body
        tables[kind] = list(csv.reader(io.StringIO(body)))
    rows = tables["csv"]
    blank = rows.index([])
    comparisons = [dict(zip(rows[0], r, strict=True)) for r in rows[1:blank]]
    descriptives = [dict(zip(rows[blank + 1], r, strict=True)) for r in rows[blank + 2 :]]
    for table in (comparisons, descriptives):
        reversed_by_measure = {r["measure"]: r["reversed"] for r in table}
        assert reversed_by_measure == {
            "helpful": "False",
            "frustration": "True",
            "donation": "False",
        }
    assert "frustration" in tables["input"][0]


@pytest.mark.django_db
def test_figures_use_each_measure_own_scale(analysed):
    run = analysis_runs.compute(AnalysisRun.objects.create(study=analysed))
    figure = means_figure(run.results)
    limits = {ax.get_title(): tuple(ax.get_ylim()) for ax in figure.axes if ax.get_visible()}
    assert limits == {
        "helpful": (1, 7),
        "frustration (reversed)": (1, 7),
        "donation": (0, 2),  # the number item's own min..max
    }


def test_outcome_and_unbounded_measures_on_their_own_range():
    rng = np.random.default_rng(5)
    table = pd.DataFrame(
        {
            "arm": ["a"] * 8 + ["b"] * 8,
            "calm": rng.integers(1, 6, 16),
            "outcome": rng.random(16),
            "minutes": rng.normal(30, 2, 16),
        }
    )
    settings = Settings(
        "arm", ("calm", "outcome", "minutes"), scales={"calm": 5}, ranges={"outcome": (0, 1)}
    )
    report = build_report(table, settings)
    figure = means_figure(report)
    limits = {ax.get_title(): ax.get_ylim() for ax in figure.axes if ax.get_visible()}
    assert limits["calm"] == (1, 5)
    assert limits["outcome"] == (0, 1)
    low, high = limits["minutes"]  # no range given: the values seen, not from 0
    assert table["minutes"].min() - 1 < low < table["minutes"].min()
    assert table["minutes"].max() < high < table["minutes"].max() + 1
    assert Settings(**json.loads(json.dumps(report["settings"]))) == settings


def test_study_outcome_is_drawn_on_the_domain_reward_range():
    class P4GStudy:
        domain = "p4g"

    assert analysis_runs.own_ranges(P4GStudy(), [], ["outcome"]) == {"outcome": (0.0, 1.0)}


def test_means_figure_is_not_cut_off():
    """Long arm names and many panels: everything drawn lies inside the figure."""
    names = ["a-very-long-arm-name-with-a-checkpoint-step-4000", "base", "vs-k5-cotrained"]
    table = pd.DataFrame(
        {
            "arm": np.repeat(names, 6),
            **{f"item{i}": np.tile([1, 2, 7, 7, 6, 5], 3) for i in range(5)},
        }
    )
    report = build_report(table, Settings("arm", tuple(f"item{i}" for i in range(5))))
    figure = means_figure(report)
    figure.canvas.draw()
    box = figure.get_tightbbox(figure.canvas.get_renderer())
    width, height = figure.get_size_inches()
    assert box.x0 >= 0 and box.y0 >= 0 and box.x1 <= width and box.y1 <= height
    assert render_png(figure).startswith(b"\x89PNG")


def test_cli_takes_a_measure_range_and_writes_n_a(tmp_path):
    from studies.analysis import cli

    data = tmp_path / "t.csv"
    data.write_text("arm,helpful,outcome\na,5,0.2\na,6,0.4\nb,3,0.9\n", encoding="utf-8")
    options = {
        "csv": str(data),
        "arm_column": "arm",
        "measures": "helpful,outcome",
        "reverse": "helpful",
        "ranges": cli._ranges("outcome=0:1"),
    }
    text, report = cli.run(options)
    assert "helpful (reversed)" in text and "n/a" in text and "(control)" not in text
    outcome = next(m for m in report["measures"] if m["name"] == "outcome")
    assert outcome["range"] == [0.0, 1.0] and outcome["range_from"] == "settings"


@pytest.mark.django_db
def test_a_figure_is_served_to_whoever_may_view_the_run_only(admin_client, client, db):
    study = make_study(slug="figures", arms=("base", "vs"))
    for i, helpful in enumerate([6, 5, 2, 3]):
        finish(study, f"p{i}", {**GOOD_ANSWERS, "helpful": str(helpful)}, arm=("base", "vs")[i % 2])
    run = analysis_runs.compute(AnalysisRun.objects.create(study=study))
    url = reverse("admin:studies_analysisrun_figure", args=[run.pk, "means"])

    response = admin_client.get(url)
    assert response.status_code == 200
    assert response["Content-Type"] == "image/svg+xml"
    svg = response.content.decode()
    assert svg.startswith("<?xml") and "<style" not in svg and 'style="' not in svg
    assert admin_client.get(url.replace("means", "nothing")).status_code == 404

    staff = get_user_model().objects.create_user("helper", password="pw", is_staff=True)
    client.force_login(staff)  # staff without the permission to view analysis runs
    assert client.get(url).status_code == 403
    client.logout()
    assert client.get(url).status_code == 302  # to the admin's login
