"""The page never locks a participant out with a message the server will not take: in Debian's
chromium against the real ASGI server, a refused message leaves the page's resend queue and a
message with a NUL or a lone surrogate is stored cleaned."""

import pytest

from studies.models import Message
from studies.participation.arrive import arrive
from studies.participation.consent import give_consent
from tests.support.faulty_engine import FaultyEngine
from tests.support.studies import make_study, prolific

pytestmark = pytest.mark.browser


def test_unstorable_and_refused_messages_do_not_lock_the_chat(web_server, browser, monkeypatch):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright's sync API keeps a loop
    with FaultyEngine() as engine:
        study = make_study(slug="odd", engine=engine.url)
        participant, _ = arrive(study, prolific(pid="oddone"))
        give_consent(participant, True)
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


RED = "rgb(179, 38, 30)"  # style.css's --bad: refusals and failures, not news


def notice_color(page) -> str:
    return page.evaluate("() => getComputedStyle(document.getElementById('notice')).color")


def test_an_over_long_message_is_kept_whole_and_the_limit_said_before_sending(
    web_server, browser, monkeypatch
):
    """Pasted past the limit, nothing is cut: the page says by how much it is over and will not
    send it; shortened, it is sent and stored exactly as typed."""
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright's sync API keeps a loop
    with FaultyEngine() as engine:
        study = make_study(slug="long", engine=engine.url, max_message_chars=120)
        participant, _ = arrive(study, prolific(pid="longone"))
        give_consent(participant, True)
        page = browser.new_page()
        page.goto(f"{web_server}/p/{participant.token}/")
        page.wait_for_selector("#text:not([disabled])")
        assert page.locator("#char-count").inner_text() == "0 / 120 characters"

        words = " ".join(["parley"] * 20) + " end"  # 143 characters, ending in a whole word
        page.fill("#text", words)
        assert page.input_value("#text") == words  # nothing cut, mid-word or otherwise
        count = page.locator("#char-count")
        assert "143 characters" in count.inner_text() and "23 over the limit of 120" in (
            count.inner_text()
        )
        assert page.locator("#send").is_disabled()
        page.press("#text", "Enter")  # Enter sends nothing either
        page.wait_for_timeout(300)
        stored = Message.objects.filter(conversation__participant=participant, role="user")
        assert stored.count() == 0 and page.input_value("#text") == words

        shorter = " ".join(["parley"] * 17)  # 118 characters
        page.fill("#text", shorter)
        assert count.inner_text() == "118 / 120 characters"
        assert page.locator("#send").is_enabled()
        page.press("#text", "Enter")
        page.locator(".msg.assistant:not(.streaming)").wait_for(timeout=30_000)
        assert list(stored.values_list("content", flat=True)) == [shorter]


@pytest.fixture
def slow_said_soon(monkeypatch):
    """The server (started after this) says "slow" after half a second without a token."""
    monkeypatch.setenv("PARLEY_STALL_TIMEOUT", "0.5")


def test_the_slow_notice_reads_as_news_and_a_failure_as_an_error(
    slow_said_soon, web_server, browser, monkeypatch
):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright's sync API keeps a loop
    with FaultyEngine(["late", "die"], pace=3) as engine:
        study = make_study(slug="slow", engine=engine.url)
        participant, _ = arrive(study, prolific(pid="slowone"))
        give_consent(participant, True)
        page = browser.new_page()
        page.goto(f"{web_server}/p/{participant.token}/")
        page.wait_for_selector("#text:not([disabled])")
        page.fill("#text", "Hello?")
        page.press("#text", "Enter")
        notice = page.locator("#notice")
        notice.filter(has_text="slow to answer").wait_for(timeout=10_000)
        assert notice_color(page) != RED
        assert "info" in notice.get_attribute("class").split()
        page.locator(".msg.assistant:not(.streaming)").wait_for(timeout=30_000)
        assert notice.is_hidden()

        page.wait_for_selector("#text:not([disabled])")
        page.fill("#text", "And now?")
        page.press("#text", "Enter")
        page.locator("#retry").wait_for(timeout=30_000)  # the engine died mid-reply
        assert notice_color(page) == RED
        assert "info" not in notice.get_attribute("class").split()
