"""The participant's and the rater's pages in Debian's chromium against the real ASGI server,
judged by axe-core (no serious or critical WCAG 2 AA violation: names, contrast, structure), on
a desktop and on a 390x844 phone: a P4G chat (the composer on screen, the notices in a live
region), its questionnaire (the 7-point scale in one row) and a P4G annotation study's rating
page (its speakers named in P4G's words)."""

import pytest

from studies.models import AnnotationSetup, Participant, RatedConversation
from studies.setup.scenario_pools import import_pool
from tests.support.accessibility import axe_violations
from tests.support.scripted_server import ScriptedServer
from tests.support.studies import make_study

pytestmark = pytest.mark.browser

PHONE = {"width": 390, "height": 844}


def p4g_page(browser, web_server, engine_url, pid, viewport=None):
    study = make_study(slug=f"give-{pid}", domain="p4g", engine=engine_url, arms=("a",))
    import_pool(study, "p4g", 1)
    context = browser.new_context(
        bypass_csp=True, viewport=viewport or {"width": 1280, "height": 800}
    )
    page = context.new_page()
    page.goto(f"{web_server}/s/{study.slug}/?PROLIFIC_PID={pid}&STUDY_ID=st&SESSION_ID=se")
    assert axe_violations(page) == []  # the consent page
    page.click("#consent-accept")
    page.wait_for_selector("#text:not([disabled])")
    return page


def box(page, selector) -> dict:
    return page.eval_on_selector(
        selector,
        "e => { const r = e.getBoundingClientRect(); return {top: r.top, bottom: r.bottom, left: r.left, right: r.right}; }",
    )


def test_the_chat_and_questionnaire_pass_axe_and_name_every_field(web_server, browser, monkeypatch):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright's sync API keeps a loop
    with ScriptedServer([{"content": "Would you give to Save the Children?"}]) as engine:
        page = p4g_page(browser, web_server, engine.url, "desk")
        page.fill("#text", "Tell me more.")
        page.press("#text", "Enter")
        page.wait_for_selector(".msg.assistant:not(.streaming) >> nth=1")
        assert axe_violations(page) == []
        assert page.get_by_role("textbox", name="Your message", exact=True).count() == 1
        # the stall, refusal and end notices are announced: they are shown inside a live region
        live = page.eval_on_selector(
            "#notice", "n => n.closest('[aria-live]')?.getAttribute('aria-live')"
        )
        assert live in ("polite", "assertive")
        page.once("dialog", lambda dialog: dialog.accept())
        page.click("#end")
        page.wait_for_selector("#submit-questionnaire")
        assert axe_violations(page) == []
        assert page.get_by_role("spinbutton", name="How much?").count() == 1  # the number item
        page.click("#submit-questionnaire")  # errors shown: still no violation
        page.wait_for_selector(".error")
        assert axe_violations(page) == []


def on_screen(page):
    """The composer and the end button within the phone's first screen; no violation."""
    for part in ("#text", "#send", "#end"):
        where = box(page, part)
        assert 0 <= where["top"] and where["bottom"] <= PHONE["height"], (part, where)
        assert 0 <= where["left"] and where["right"] <= PHONE["width"], (part, where)
    assert axe_violations(page) == []


def test_on_a_phone_the_composer_is_on_screen_and_the_scale_is_one_row(
    web_server, browser, monkeypatch
):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with ScriptedServer([{"content": "Every dollar helps."}]) as engine:
        page = p4g_page(browser, web_server, engine.url, "phone", viewport=PHONE)
        on_screen(page)  # on arrival
        page.fill("#text", "Why should I?")
        page.press("#text", "Enter")
        page.wait_for_selector(".msg.assistant:not(.streaming) >> nth=1")
        on_screen(page)  # with a conversation under way
        page.once("dialog", lambda dialog: dialog.accept())
        page.click("#end")
        page.wait_for_selector("#submit-questionnaire")
        tops = page.eval_on_selector_all(
            "#item-helpful .point", "ps => ps.map(p => Math.round(p.getBoundingClientRect().top))"
        )
        assert len(tops) == 7 and len(set(tops)) == 1, tops  # one row, not 4 + 3
        right = page.eval_on_selector_all(
            "#item-helpful .point",
            "ps => Math.max(...ps.map(p => p.getBoundingClientRect().right))",
        )
        assert right <= PHONE["width"]
        assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
        assert axe_violations(page) == []


def test_the_rating_page_names_p4g_speakers_and_passes_axe(web_server, browser, monkeypatch):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    study = make_study(slug="rate-p4g", domain="p4g", arms=("raters",), target_per_arm=1)
    AnnotationSetup.objects.create(
        study=study, raters_per_conversation=1, conversations_per_rater=1
    )
    RatedConversation.objects.create(
        study=study,
        source="person",
        transcript=[
            {"speaker": "agent", "text": "Would you donate to Save the Children?"},
            {"speaker": "user", "text": "Maybe a little."},
        ],
    )
    for viewport in ({"width": 1280, "height": 800}, PHONE):
        page = browser.new_context(bypass_csp=True, viewport=viewport).new_page()
        page.goto(f"{web_server}/s/rate-p4g/?PROLIFIC_PID=rater&STUDY_ID=st&SESSION_ID=se")
        if page.locator("#consent-accept").count():
            page.click("#consent-accept")
        page.wait_for_selector("#submit-rating")
        transcript = page.inner_text("#transcript")
        assert "Persuader:" in transcript and "Persuadee:" in transcript
        assert "ustomer" not in page.content()
        assert axe_violations(page) == []
        page.click("#submit-rating")  # errors shown
        page.wait_for_selector(".error")
        assert axe_violations(page) == []
    assert Participant.objects.get(prolific_pid="rater").status == "rating"


@pytest.mark.parametrize("viewport", [{"width": 1280, "height": 720}, PHONE])
def test_a_previews_banner_is_styled_and_leaves_the_chat_on_screen(
    web_server, browser, monkeypatch, viewport
):
    from studies.participation.consent import give_consent
    from studies.participation.start import start_preview

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with ScriptedServer([]) as engine:
        study = make_study(slug="peek", domain="p4g", engine=engine.url, arms=("a",))
        import_pool(study, "p4g", 1)
        preview = give_consent(start_preview(study.arms.get()), True)
        page = browser.new_context(bypass_csp=True, viewport=viewport).new_page()
        page.goto(f"{web_server}/p/{preview.token}/")
        page.wait_for_selector("#text:not([disabled])")
        assert "Preview of arm a" in page.inner_text("#preview-banner")
        background = page.eval_on_selector(
            "#preview-banner", "b => getComputedStyle(b).backgroundColor"
        )
        assert background not in ("rgba(0, 0, 0, 0)", "transparent")  # styled, not bare text
        for part in ("#text", "#send", "#end"):
            where = box(page, part)
            assert 0 <= where["top"] and where["bottom"] <= viewport["height"], (part, where)
        assert page.evaluate("document.documentElement.scrollHeight") <= viewport["height"]
        assert axe_violations(page) == []
