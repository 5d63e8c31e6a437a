"""In a real browser (Debian's chromium) against the real ASGI server: a participant who idles on
the Redis channel layer keeps one socket, and hostile text stays text for participants and
researchers. The agent's replies come from a scripted server: these tests are about the page."""

import time

import pytest

from studies.models import Message, Participant, Response
from tests.support.scripted_server import ScriptedServer
from tests.support.studies import make_study

pytestmark = pytest.mark.browser

# Each payload would run script, or load a resource that does, if the page put it in as HTML.
PAYLOADS = [
    "<script>window.pwned = 'script'</script>",
    "<img src=x onerror=\"window.pwned = 'img'\">",
    "<svg onload=\"window.pwned = 'svg'\"></svg>",
    '"><iframe src="javascript:window.top.pwned=\'iframe\'"></iframe>',
]
XSS = " ".join(PAYLOADS)


def open_chat(browser, web_server, pid):
    page = browser.new_page()
    page.route(
        "https://app.prolific.com/**", lambda route: route.fulfill(body="Prolific", status=200)
    )
    sockets = []
    page.on("websocket", lambda ws: sockets.append(ws.url))
    page.goto(f"{web_server}/s/safe/?PROLIFIC_PID={pid}&STUDY_ID=st&SESSION_ID=se-{pid}")
    page.click("#consent-accept")
    page.wait_for_selector("#text:not([disabled])")
    return page, sockets


def say(page, text, replies):
    page.fill("#text", text)
    page.press("#text", "Enter")
    page.wait_for_selector(f".msg.assistant:not(.streaming) >> nth={replies - 1}", timeout=30_000)


def answer_questionnaire(page, comment="fine"):
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#end")
    page.wait_for_selector("#submit-questionnaire")
    page.check("#item-helpful input[value='6']")
    page.check("#item-frustration input[value='3']")
    page.check("#item-attn input[value='2']")
    page.fill("#item-donation input", "0.5")
    page.fill("#item-comment textarea", comment)
    page.click("#submit-questionnaire")
    page.wait_for_selector("#return-to-prolific")


def test_an_idle_participant_on_redis_keeps_one_socket_and_completes(
    redis_url, web_server, browser, monkeypatch
):
    """redis-py's default socket_timeout (5 s) used to cut channels-redis's blocking reads, so an
    idle page reconnected every few seconds and lost what was typed meanwhile."""
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright's sync API keeps a loop
    with ScriptedServer([{"content": "Hello there."}, {"content": "Still here."}]) as engine:
        make_study(slug="safe", engine=engine.url)
        page, sockets = open_chat(browser, web_server, "idler")
        say(page, "Hi!", 1)
        time.sleep(20)  # a participant away: four of the 5 s timeouts that used to cut the socket
        say(page, "Back again.", 2)
        assert len(sockets) == 1, f"the page reconnected while idle: {sockets}"
        answer_questionnaire(page)
    participant = Participant.objects.get(prolific_pid="idler")
    assert participant.status == Participant.Status.COMPLETED
    contents = list(participant.conversation.messages.order_by("seq").values_list("content"))
    assert contents == [("Hi!",), ("Hello there.",), ("Back again.",), ("Still here.",)]


def test_hostile_text_stays_text_for_participants_and_researchers(
    web_server, browser, monkeypatch, admin_user
):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with ScriptedServer([{"content": "Agent says " + XSS}]) as engine:
        make_study(slug="safe", engine=engine.url)
        page, _ = open_chat(browser, web_server, "mallory")
        say(page, XSS, 1)
        # Shown literally, nothing ran, no element was made from it.
        assert page.inner_text(".msg.user").strip() == XSS
        assert page.inner_text(".msg.assistant").strip() == "Agent says " + XSS
        made = "#messages script, #messages img, #messages iframe, #messages svg"
        assert page.locator(made).count() == 0
        answer_questionnaire(page, comment=XSS)
        assert page.evaluate("window.pwned") is None
    participant = Participant.objects.get(prolific_pid="mallory")
    assert Message.objects.filter(conversation__participant=participant, content=XSS).exists()
    assert Response.objects.get(participant=participant, item__key="comment").value_text == XSS

    # The researcher reads the transcript and the answers in the admin: text there too.
    admin = browser.new_page()
    admin.goto(f"{web_server}/admin/login/?next=/admin/")
    admin.fill("#id_username", "researcher")
    admin.fill("#id_password", "pw")
    admin.click("input[type=submit]")
    admin.wait_for_selector("#user-tools")
    admin.goto(f"{web_server}/admin/studies/participant/{participant.pk}/transcript/")
    body = admin.inner_text("body")
    assert body.count(XSS) >= 2, "the transcript should show the message and the answer as text"
    assert (
        admin.locator("#content script, #content img, #content iframe, #content svg").count() == 0
    )
    assert admin.evaluate("window.pwned") is None
    admin.close()


@pytest.fixture
def admin_user(transactional_db, monkeypatch):
    from django.contrib.auth import get_user_model

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # after Playwright's loop started
    return get_user_model().objects.create_superuser("researcher", "r@example.org", "pw")
