"""The analysis page in Debian's chromium against the real ASGI server: every figure draws its
axes under the site's Content-Security-Policy, and the page reports no violation of it."""

import io

import pytest
from django.urls import reverse
from matplotlib.image import imread

from studies.models import AnalysisRun
from studies.research import analysis_runs
from tests.support.studies import GOOD_ANSWERS, finish, make_study

pytestmark = pytest.mark.browser

# Set before any of the page's own code runs: every CSP violation the page meets, as
# "directive: blocked" lines the test reads back.
RECORD_VIOLATIONS = """
window.__violations = [];
document.addEventListener('securitypolicyviolation', e => window.__violations.push(
    e.violatedDirective + ': ' + (e.blockedURI || 'inline') + ' ' + (e.sample || '')));
"""


def drawn(png: bytes) -> dict[str, float]:
    """Shares of a screenshot's pixels that are near white (the figure's ground) and dark (its
    spines, ticks and labels); a figure whose styles were refused is one black box."""
    pixels = imread(io.BytesIO(png), format="png")[..., :3]
    light = pixels.min(axis=-1) > 0.9
    dark = pixels.max(axis=-1) < 0.35
    return {"light": float(light.mean()), "dark": float(dark.mean())}


def test_every_figure_shows_its_axes_and_nothing_breaks_the_csp(
    web_server, browser, monkeypatch, tmp_path
):
    from django.contrib.auth import get_user_model

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright's sync API keeps a loop
    study = make_study(slug="figures", arms=("base", "vs"))
    for i, helpful in enumerate([6, 5, 2, 3, 5, 4]):
        answers = {**GOOD_ANSWERS, "helpful": str(helpful), "frustration": str(8 - helpful)}
        finish(study, f"p{i}", answers, arm=("base", "vs")[i % 2])
    run = analysis_runs.compute(AnalysisRun.objects.create(study=study))
    assert run.status == "done", run.error
    assert set(run.figures) == {"means", "likert-helpful", "likert-frustration"}
    get_user_model().objects.create_superuser("researcher", "r@example.org", "pw")

    page = browser.new_page()
    console = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    page.add_init_script(RECORD_VIOLATIONS)
    page.goto(f"{web_server}/admin/login/?next=/admin/")
    page.fill("#id_username", "researcher")
    page.fill("#id_password", "pw")
    page.click("input[type=submit]")
    page.wait_for_selector("#user-tools")
    console.clear()  # the analysis page's own messages from here
    page.goto(web_server + reverse("admin:studies_analysisrun_change", args=[run.pk]))
    page.wait_for_load_state("load")
    page.screenshot(path=tmp_path / "analysis.png", full_page=True)

    figures = page.locator(".analysis-figures .figure")
    assert figures.count() == len(run.figures)
    for i in range(figures.count()):
        figure = figures.nth(i)
        figure.scroll_into_view_if_needed()
        box = figure.bounding_box()
        assert box and box["width"] > 200 and box["height"] > 100, box
        shares = drawn(figure.screenshot())
        # A white ground with the axes drawn on it, not a flat or a black box.
        assert shares["light"] > 0.5 and 0.002 < shares["dark"] < 0.3, (i, shares)
    assert page.evaluate("window.__violations") == []
    assert not [m for m in console if m.startswith("error") or "Content Security" in m], console
