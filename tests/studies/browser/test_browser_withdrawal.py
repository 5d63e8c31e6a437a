"""Stopping from inside the study in a real browser (Debian's chromium) against the real ASGI
server (issue 39): from the chat (over its socket) and from the questionnaire (the page's
confirmation), then the question about the data and what to do on Prolific."""

import pytest

from studies.models import Participant, Study, Withdrawal
from tests.support.scripted_server import ScriptedServer
from tests.support.studies import make_study

pytestmark = pytest.mark.browser


def test_a_participant_stops_from_the_chat_and_from_the_questionnaire(
    web_server, browser, monkeypatch
):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright's sync API keeps a loop
    with ScriptedServer([{"content": "Hello there."}] * 4) as engine:
        make_study(slug="web", engine=engine.url, min_exchanges=1)
        page = browser.new_page()
        page.route(
            "https://app.prolific.com/**", lambda route: route.fulfill(body="Prolific", status=200)
        )
        page.goto(f"{web_server}/s/web/?PROLIFIC_PID=leaver1&STUDY_ID=st1&SESSION_ID=se1")
        page.click("#consent-accept")
        page.wait_for_selector("#text:not([disabled])")
        page.fill("#text", "Hi, I am here.")
        page.press("#text", "Enter")
        page.wait_for_selector(".msg.assistant:not(.streaming)", timeout=30_000)

        # From the chat: the socket ends it at once, then the page asks about the data.
        page.once("dialog", lambda dialog: dialog.accept())
        page.click("#stop-taking-part")
        page.wait_for_selector("#withdrawn-ask", timeout=30_000)
        assert page.locator("#withdrawn-return").is_visible()  # the study pays nothing partial
        page.click("#withdrawn-keep")
        page.wait_for_selector("#withdrawn-kept")
        leaver = Participant.objects.get(prolific_pid="leaver1")
        assert leaver.status == Participant.Status.WITHDRAWN
        assert leaver.conversation.end_reason == "withdrawn"
        withdrawal = Withdrawal.objects.get(participant=leaver)
        assert (withdrawal.stage, withdrawal.data_kept) == ("chat", True)

        # From the questionnaire, in a study that pays for partial participation.
        Study.objects.filter(slug="web").update(pays_partial=True)
        page.goto(f"{web_server}/s/web/?PROLIFIC_PID=leaver2&STUDY_ID=st1&SESSION_ID=se2")
        page.click("#consent-accept")
        page.wait_for_selector("#text:not([disabled])")
        page.fill("#text", "Hello.")
        page.press("#text", "Enter")
        page.wait_for_selector(".msg.assistant:not(.streaming)", timeout=30_000)
        page.once("dialog", lambda dialog: dialog.accept())
        page.click("#end")
        page.wait_for_selector("#submit-questionnaire")
        page.click("#stop-taking-part")
        page.wait_for_selector("#stop-confirm")
        assert "completion code" in page.inner_text("main")
        page.click("#stop-confirm")
        page.wait_for_selector("#withdrawn-ask")
        page.click("#withdrawn-keep")
        assert page.inner_text("#withdrawn-code") == "DONE123"
        with page.expect_request(lambda request: "prolific.com" in request.url) as followed:
            page.click("#return-to-prolific")
        assert followed.value.url == "https://app.prolific.com/submissions/complete?cc=DONE123"
        second = Withdrawal.objects.get(participant__prolific_pid="leaver2")
        assert (second.stage, second.data_kept, second.paid) == ("questionnaire", True, True)
