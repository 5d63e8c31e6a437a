"""The time limit in Debian's chromium against the real ASGI server: the chat counts down, warns
two minutes before, says so when a message came too late (never dropped silently), and moves on
to the time-up page by itself at zero."""

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from studies.models import Participant
from studies.participation.arrive import arrive
from studies.participation.consent import give_consent
from tests.support.studies import make_study, prolific

pytestmark = pytest.mark.browser


def chatting(study, pid, seconds_ago):
    participant, _ = arrive(study, prolific(pid=pid, session_id=f"s-{pid}"))
    give_consent(participant, True)
    Participant.objects.filter(pk=participant.pk).update(
        created_at=timezone.now() - timedelta(seconds=seconds_ago)
    )
    return participant


def test_countdown_warning_late_message_and_time_up(web_server, browser, monkeypatch):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright's sync API keeps a loop
    study = make_study(slug="timed", time_limit_minutes=3)
    late = chatting(study, "late", 3 * 60 - 100)  # 100 s left: inside the two-minute warning
    page = browser.new_page()
    page.goto(f"{web_server}/p/{late.token}/")
    page.wait_for_selector("#text:not([disabled])")
    assert page.locator("#time-left").inner_text().startswith("Time left: 1:")
    page.locator("#time-warning").wait_for(state="visible", timeout=5_000)
    assert "minute(s) left" in page.locator("#time-warning").inner_text()

    # The limit passes while the page still shows the chat (its clock is behind the server's).
    Participant.objects.filter(pk=late.pk).update(created_at=timezone.now() - timedelta(minutes=4))
    page.fill("#text", "Am I too late?")
    page.press("#text", "Enter")
    for _ in range(50):  # polled: the page's CSP forbids wait_for_function's eval
        if "not sent" in page.locator("#notice").inner_text():
            break
        page.wait_for_timeout(100)
    # The server's refusal ("...so this message was not sent") comes first, then the page's own
    # notice on the redirect ("...so your last message was not sent"): either may be read here.
    assert "message was not sent" in page.locator("#notice").inner_text()
    page.wait_for_url(re.compile(rf"/p/{late.token}/\?unsent=1$"), timeout=10_000)
    page.locator("#unsent").wait_for(timeout=10_000)
    assert "came after the time limit" in page.locator("#unsent").inner_text()
    assert Participant.objects.get(pk=late.pk).status == "timed_out"

    # Idle at zero: the page says so and moves on by itself.
    idle = chatting(study, "idle", 3 * 60 - 3)
    page = browser.new_page()
    page.goto(f"{web_server}/p/{idle.token}/")
    page.get_by_text("The time for this study is up.").first.wait_for(timeout=15_000)
    page.locator("h1", has_text="The time for this study is up").wait_for(timeout=15_000)
    assert Participant.objects.get(pk=idle.pk).status == "timed_out"
