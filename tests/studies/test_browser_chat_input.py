"""The page never locks a participant out with a message the server will not take: in Debian's
chromium against the real ASGI server, a refused message leaves the page's resend queue and a
message with a NUL or a lone surrogate is stored cleaned."""

import pytest

from studies import flow
from studies.models import Message
from tests.studies.conftest import make_study, prolific
from tests.studies.faulty_engine import FaultyEngine

pytestmark = pytest.mark.browser


def test_unstorable_and_refused_messages_do_not_lock_the_chat(web_server, browser, monkeypatch):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright's sync API keeps a loop
    with FaultyEngine() as engine:
        study = make_study(slug="odd", engine=engine.url)
        participant, _ = flow.arrive(study, prolific(pid="oddone"))
        flow.give_consent(participant, True)
        page = browser.new_page()
        page.goto(f"{web_server}/p/{participant.token}/")
        page.wait_for_selector("#text:not([disabled])")
        # As if typed before a crash: queued for resending on the next connection.
        page.evaluate(
            """token => localStorage.setItem('parley-pending-' + token, JSON.stringify(
                {'m-empty': '\\u0000\\u0000', 'm-odd': 'a\\u0000b\\ud800c'}))""",
            str(participant.token),
        )
        page.reload()
        page.wait_for_selector(".msg.assistant:not(.streaming)", timeout=30_000)
        queued = "t => localStorage.getItem('parley-pending-' + t)"
        for _ in range(100):  # polled here: the page's CSP forbids wait_for_function's eval
            if page.evaluate(queued, str(participant.token)) == "{}":
                break
            page.wait_for_timeout(200)
        assert page.evaluate(queued, str(participant.token)) == "{}"
        stored = Message.objects.filter(conversation__participant=participant, role="user")
        assert list(stored.values_list("client_id", "content")) == [("m-odd", "ab\ufffdc")]

        page.reload()  # nothing is resent, nothing refused again
        page.wait_for_selector(".msg.assistant")
        page.wait_for_timeout(500)
        assert page.locator("#notice").is_hidden()
        assert stored.count() == 1
        page.fill("#text", "Still here")
        page.press("#text", "Enter")
        page.locator(".msg.assistant:not(.streaming)").nth(1).wait_for(timeout=30_000)
        assert stored.count() == 2
