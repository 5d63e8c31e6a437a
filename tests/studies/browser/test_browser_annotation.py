"""A whole annotation study in real Chromium against the real ASGI server: raters arrive from
Prolific links, each gets n conversations with k = 1 (no conversation twice), one rater misses
the gold conversation (marked, and left out of the analysis), both leave with the completion
code, a third finds nothing left; no page shows an arm, model or simulator name, and no
socket is opened."""

import pytest

from studies.models import AnalysisRun, AnnotationSetup, Participant, RatedConversation
from studies.research.analysis_runs import compute
from tests.support.studies import make_study

pytestmark = pytest.mark.browser

SECRETS = ("secret-arm-name", "secret-simulator-name", "SmolLM2", "simulator")


def annotation_study():
    # a target above the pool's places (go-live would refuse it): the third rater finds none left
    study = make_study(slug="rate", arms=("raters",), target_per_arm=3)
    AnnotationSetup.objects.create(
        study=study, raters_per_conversation=1, conversations_per_rater=2, gold_per_rater=1
    )
    for i, (source, simulator) in enumerate(
        [("person", ""), ("person", ""), ("simulator", SECRETS[1]), ("simulator", SECRETS[1])]
    ):
        RatedConversation.objects.create(
            study=study,
            source=source,
            arm=SECRETS[0],
            simulator=simulator,
            transcript=[
                {"speaker": "agent", "text": f"Conversation number {i}: how can I help?"},
                {"speaker": "user", "text": "Where is my parcel?"},
            ],
        )
    RatedConversation.objects.create(
        study=study,
        source="person",
        gold={"helpful": 1},
        transcript=[
            {"speaker": "agent", "text": "This is a check: choose 1 for the first question."}
        ],
    )
    return study


def rate_all(page, helpful_on_gold: str) -> list[str]:
    """Rate every conversation shown; what each page said. The gold one gets `helpful_on_gold`."""
    seen = []
    while page.locator("#submit-rating").count():
        html = page.content()
        seen.append(html)
        gold = "This is a check" in page.inner_text("#transcript")
        page.check(f"#item-helpful input[value='{helpful_on_gold if gold else '6'}']")
        page.check("#item-frustration input[value='3']")
        page.check("#item-attn input[value='2']")
        page.fill("#item-donation input", "1")
        page.check("#item-real_person input[value='real']")
        page.check("#item-realism_confidence input[value='4']")
        page.click("#submit-rating")
        page.wait_for_load_state()
    return seen


def test_raters_complete_an_annotation_study_blind_in_a_browser(web_server, browser, monkeypatch):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright's sync API keeps a loop
    study = annotation_study()
    pages, sockets = {}, []
    for pid, gold_answer in [("rater-one", "6"), ("rater-two", "1")]:
        page = browser.new_page()
        page.on("websocket", lambda socket: sockets.append(socket.url))
        page.goto(f"{web_server}/s/rate/?PROLIFIC_PID={pid}&STUDY_ID=st&SESSION_ID=se-{pid}")
        page.click("#consent-accept")
        page.wait_for_selector("#submit-rating")
        # the server says what is missing, and nothing is stored
        page.click("#submit-rating")
        assert page.locator(".error").count() >= 3
        seen = rate_all(page, gold_answer)
        assert len(seen) == 3 and "Conversation 3 of 3" in seen[-1]
        assert not [s for s in SECRETS for html in seen if s in html]
        assert "DONE123" in page.content()  # the completion code, as in any study
        pages[pid] = page
    assert sockets == []
    one, two = (Participant.objects.get(prolific_pid=pid) for pid in ("rater-one", "rater-two"))
    assert one.attention_passed is False and two.attention_passed is True
    assert one.status == two.status == "completed"
    mine = [
        {a.conversation_id for a in p.rating_assignments.filter(conversation__gold__isnull=True)}
        for p in (one, two)
    ]
    assert len(mine[0]) == len(mine[1]) == 2 and not mine[0] & mine[1]  # k = 1: never twice

    late = browser.new_page()
    late.goto(f"{web_server}/s/rate/?PROLIFIC_PID=rater-three&STUDY_ID=st&SESSION_ID=se3")
    late.click("#consent-accept")
    assert "No conversations left to rate" in late.content()

    run = compute(AnalysisRun.objects.create(study=study))
    assert run.results["annotation"]["raters"] == 1  # the one who missed the gold is left out
    assert run.results["annotation"]["excluded_ratings"] == 4  # theirs (3) and the other's gold
