"""A participant completes the study in a real browser (Debian's chromium) against the real
ASGI server, a real Celery-free flow and the embedded engine serving SmolLM2."""

import pytest

from studies.models import Message, Participant
from tests.support.studies import make_study

pytestmark = pytest.mark.browser


def test_participant_completes_the_study_in_a_browser(
    web_server, engine_url, browser, monkeypatch, tmp_path
):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright's sync API keeps a loop
    study = make_study(slug="web", engine=engine_url, min_exchanges=1)
    study.arms.update(max_tokens=24)
    page = browser.new_page()
    # Prolific is outside this machine: answer it locally so nothing leaves the machine.
    page.route(
        "https://app.prolific.com/**", lambda route: route.fulfill(body="Prolific", status=200)
    )
    link = f"{web_server}/s/web/?PROLIFIC_PID=5f0c0ffee0ddba11c0ffee01&STUDY_ID=st1&SESSION_ID=se1"
    page.goto(link)
    page.click("#consent-accept")
    page.wait_for_selector("#text:not([disabled])")
    page.screenshot(path=str(tmp_path / "chat-empty.png"))

    # Watch the agent's bubble grow while it streams.
    page.evaluate("""() => { window.seen = []; new MutationObserver(() => {
        const b = document.querySelector('.msg.assistant.streaming');
        if (b) window.seen.push(b.textContent.length); }).observe(document.getElementById('messages'),
        {subtree: true, childList: true, characterData: true}); }""")
    page.fill("#text", "Hello! What is a good name for a cat?")
    page.press("#text", "Enter")
    page.wait_for_selector(".msg.assistant:not(.streaming)", timeout=90_000)
    lengths = page.evaluate("window.seen")
    assert len(set(lengths)) >= 3, f"the reply did not stream: {lengths}"
    reply = page.inner_text(".msg.assistant")
    participant = Participant.objects.get(prolific_pid="5f0c0ffee0ddba11c0ffee01")
    stored = list(
        Message.objects.filter(conversation__participant=participant).values_list("role", "content")
    )
    assert stored[0] == ("user", "Hello! What is a good name for a cat?")
    assert stored[1][0] == "assistant" and stored[1][1].strip() == reply.strip()
    page.screenshot(path=str(tmp_path / "chat.png"))

    # Reload: the chat resumes with its history.
    page.goto(link)
    page.wait_for_selector(".msg.assistant")
    assert page.inner_text(".msg.user") == "Hello! What is a good name for a cat?"

    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#end")
    page.wait_for_selector("#submit-questionnaire")
    page.click("#submit-questionnaire")  # nothing chosen: the server says what is missing
    assert page.locator(".error").count() >= 3
    page.check("#item-helpful input[value='6']")
    page.check("#item-frustration input[value='3']")
    page.check("#item-attn input[value='2']")
    page.fill("#item-donation input", "0.5")
    page.click("#submit-questionnaire")
    page.wait_for_selector("#return-to-prolific")
    page.screenshot(path=str(tmp_path / "debrief.png"))
    with page.expect_request(lambda request: "prolific.com" in request.url) as followed:
        page.click("#return-to-prolific")
    assert followed.value.url == "https://app.prolific.com/submissions/complete?cc=DONE123"
    assert followed.value.redirected_from.url.endswith(f"/p/{participant.token}/done/")
    participant.refresh_from_db()
    assert participant.status == "completed" and participant.attention_passed is True


def shop_chat(browser, web_server: str, engine: str, pid: str, **arm_fields):
    """A tau2 retail study on `engine` (its task retail-0, one arm with these settings) and a
    participant's page, consented and ready to type."""
    from studies.setup.scenario_pools import import_pool

    study = make_study(slug="shop", domain="retail", engine=engine, arms=("a",))
    study.arms.update(**arm_fields)
    import_pool(study, "retail")
    study.scenarios.exclude(key="retail-0").update(active=False)
    page = browser.new_page()
    page.goto(f"{web_server}/s/shop/?PROLIFIC_PID={pid}&STUDY_ID=st&SESSION_ID=se")
    page.click("#consent-accept")
    page.wait_for_selector("#text:not([disabled])")
    return page


def test_tool_calls_show_as_cards_beside_the_scenario(web_server, browser, monkeypatch, tmp_path):
    """tau2 retail in the browser: the scenario in the side panel, the agent's tool calls as cards
    (the replies come from a scripted server: this test is about the page, not the model)."""
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    from tests.support.scripted_server import ScriptedServer

    script = [
        {"tool_calls": [("get_order_details", {"order_id": "#W5785065"})]},
        {"content": "Your order #W5785065 is pending."},
    ]
    with ScriptedServer(script) as server:
        page = shop_chat(browser, web_server, server.url, "buyer1", tool_format="native")
        assert "What you know" in page.inner_text("#scenario-panel")
        assert page.inner_text(".msg.assistant") == "Hi! How can I help you today?"
        page.fill("#text", "What is the status of order #W5785065?")
        page.press("#text", "Enter")
        page.wait_for_selector(".tool-card .tool-result")
        page.wait_for_selector(".msg.assistant:not(.streaming) >> nth=1")
        card = page.inner_text(".tool-card")
        assert "get_order_details" in card and "#W5785065" in card
        page.screenshot(path=str(tmp_path / "tool-card.png"))
        assert (
            page.locator(".msg.assistant").nth(1).inner_text().strip()
            == "Your order #W5785065 is pending."
        )


def test_an_empty_answer_shows_the_notice_and_no_empty_bubble(web_server, browser, monkeypatch):
    """An answer empty twice (asked once more) leaves no empty assistant bubble: the page says
    the assistant gave no answer; an answer empty once shows only the re-ask's text."""
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    from studies.chat.agent_turn import EMPTY_REPLY_NOTICE
    from tests.support.scripted_server import ScriptedServer

    script = [{"content": ""}, {"content": ""}, {"content": ""}, {"content": "Found it."}]
    with ScriptedServer(script) as server:
        page = shop_chat(browser, web_server, server.url, "mute1", tool_format="native")
        page.fill("#text", "Is anyone there?")
        page.press("#text", "Enter")
        notice = page.locator("#notice")
        notice.filter(has_text=EMPTY_REPLY_NOTICE).wait_for(timeout=30_000)
        assert "info" in notice.get_attribute("class").split()  # news, not an error
        page.wait_for_selector("#text:not([disabled])")  # the turn is over: write again
        bubbles = page.locator(".msg.assistant")
        assert bubbles.all_inner_texts() == ["Hi! How can I help you today?"]  # the greeting

        page.fill("#text", "Hello?")
        page.press("#text", "Enter")
        page.wait_for_selector(".msg.assistant:not(.streaming) >> nth=1")
        page.wait_for_selector("#text:not([disabled])")
        assert [t.strip() for t in bubbles.all_inner_texts()][1:] == ["Found it."]
        assert notice.is_hidden()

        page.reload()  # the conversation read back: the stored empty answer shows no bubble
        page.wait_for_selector(".msg.user >> nth=1")
        texts = [t.strip() for t in page.locator(".msg.assistant").all_inner_texts()]
        assert texts == ["Hi! How can I help you today?", "Found it."]
    assert len(server.requests) == 4


@pytest.fixture
def patient_web_server(transactional_db, monkeypatch, request):
    """The ASGI server waiting longer for a first token: the prefill of a tau2 prompt of some
    3,000 tokens, which this machine's other work slows several times over."""
    monkeypatch.setenv("PARLEY_FIRST_TOKEN_TIMEOUT", "170")
    return request.getfixturevalue("web_server")


def test_smollm2_tool_call_shows_as_a_card(
    patient_web_server, engine_url, browser, monkeypatch, tmp_path
):
    """The demo's tau2 arm with the real model: its reply starts with a tool call (the arm's
    tool choice "first"), which the page shows as a card with the tool's result."""
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    from studies.lib.domain_bridge import shared_domain
    from studies.models import ToolChoice

    page = shop_chat(
        browser,
        patient_web_server,
        engine_url,
        "smol1",
        tool_format="structured",
        tool_choice=ToolChoice.FIRST,
        max_tokens=64,
        temperature=0,
    )
    page.fill("#text", "Please cancel my order #W5785065, my email is ada.abara154@example.com")
    page.press("#text", "Enter")
    page.wait_for_selector(".tool-card .tool-result", timeout=240_000)
    page.screenshot(path=str(tmp_path / "smollm2-tool-card.png"))
    card = page.inner_text(".tool-card")
    tools = [t["function"]["name"] for t in shared_domain("retail").tools(None)]
    assert any(name in card for name in tools), card
    stored = Message.objects.filter(conversation__participant__prolific_pid="smol1")
    call = stored.exclude(tool_calls__isnull=True).get().tool_calls[0]["function"]
    assert call["name"] in card and call["name"] in tools
