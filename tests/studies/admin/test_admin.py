"""The researcher's admin: set-up pages, filters, transcript view and CSV exports."""

import csv
import io

import pytest
from django.urls import reverse

from studies.chat.agent_turn import store_turn_message
from studies.models import Message, Participant
from studies.participation.arrive import arrive
from studies.participation.chat_turn import end_chat, store_user_message
from studies.participation.consent import give_consent
from studies.participation.questionnaire import submit_questionnaire
from tests.support.studies import GOOD_ANSWERS, make_study, prolific

pytestmark = pytest.mark.django_db


@pytest.fixture
def finished(db):
    """Two participants: one completed with a short chat, one who declined."""
    study = make_study()
    done, _ = arrive(study, prolific(pid="done1"))
    give_consent(done, True)
    said = store_user_message(done, "c1", "Hello, agent").message
    store_turn_message(  # the agent's reply, stored as a chat turn stores it
        said,
        [],
        role="assistant",
        content="Hi, how can I help?",
        model="m",
        latency_ms=120,
        ttft_ms=30,
    )
    end_chat(done)
    assert submit_questionnaire(done, GOOD_ANSWERS) == {}
    declined, _ = arrive(study, prolific(pid="nope2"))
    give_consent(declined, False)
    return study


def read_csv(response):
    body = b"".join(response.streaming_content).decode()
    return list(csv.DictReader(io.StringIO(body)))


def test_study_pages_render_with_inlines(admin_client, finished):
    page = admin_client.get(
        reverse("admin:studies_study_change", args=[finished.pk])
    ).content.decode()
    assert "arms-0-endpoint" in page and "scenarios-TOTAL_FORMS" in page
    assert "/s/s1/?PROLIFIC_PID=" in page
    assert "a: 1 / 1" in page  # completed / active in arm a
    analyse = reverse("admin:studies_study_analyse", args=[finished.pk])
    assert f'formaction="{analyse}"' in page  # a button of the change form, not a nested form
    assert admin_client.get(reverse("admin:studies_study_changelist")).status_code == 200
    q = admin_client.get(
        reverse("admin:studies_questionnaire_change", args=[finished.questionnaire.pk])
    )
    assert "items-0-reverse_coded" in q.content.decode()


def test_participants_filter_by_status_and_arm(admin_client, finished):
    url = reverse("admin:studies_participant_changelist")
    completed = admin_client.get(url, {"status__exact": "completed"}).content.decode()
    assert "done1" in completed and "nope2" not in completed
    arm_b = finished.arms.get(name="b")
    by_arm = admin_client.get(url, {"arm__id__exact": arm_b.pk}).content.decode()
    assert "nope2" in by_arm and "done1" not in by_arm


def test_transcript_view_reads_in_order(admin_client, finished):
    participant = Participant.objects.get(prolific_pid="done1")
    page = admin_client.get(
        reverse("admin:studies_participant_transcript", args=[participant.pk])
    ).content.decode()
    assert page.index("Hello, agent") < page.index("Hi, how can I help?")
    assert "120 ms" in page and "frustration (reverse-coded)" in page
    assert 'class="success"' not in page  # the transcript is not shown as flash messages


def test_responses_csv_has_one_row_per_participant(admin_client, finished):
    rows = read_csv(admin_client.get(reverse("admin:studies_study_responses", args=[finished.pk])))
    assert [r["prolific_pid"] for r in rows] == ["done1", "nope2"]
    done = rows[0]
    assert (done["arm"], done["status"], done["attention_passed"], done["messages"]) == (
        "a",
        "completed",
        "True",
        "2",
    )
    assert (done["helpful"], done["frustration"], done["donation"], done["comment"]) == (
        "6",  # a Likert answer is an integer, not "6.0"
        "2",
        "1.5",
        "fine",
    )
    assert rows[1]["status"] == "no_consent" and rows[1]["helpful"] == ""


def test_transcripts_csv_has_one_row_per_message(admin_client, finished):
    rows = read_csv(
        admin_client.get(reverse("admin:studies_study_transcripts", args=[finished.pk]))
    )
    assert [(r["seq"], r["role"], r["content"]) for r in rows] == [
        ("1", "user", "Hello, agent"),
        ("2", "assistant", "Hi, how can I help?"),
    ]
    assert rows[0]["client_id"] == "c1" and rows[1]["latency_ms"] == "120"


def test_export_actions_on_the_changelist(admin_client, finished):
    url = reverse("admin:studies_study_changelist")
    response = admin_client.post(
        url, {"action": "export_transcripts", "_selected_action": [finished.pk]}
    )
    assert len(read_csv(response)) == Message.objects.count() == 2
    response = admin_client.post(
        url, {"action": "export_responses", "_selected_action": [finished.pk]}
    )
    assert len(read_csv(response)) == 2


def test_the_control_arm_is_chosen_among_the_study_s_own_arms(admin_client):
    import re

    from tests.support.studies import change_form_data

    mine, other = make_study(slug="mine"), make_study(slug="other")

    def offered(page) -> set[str]:
        select = re.search(r'<select name="control_arm".*?</select>', page, re.DOTALL)[0]
        return set(re.findall(r'<option value="(\d+)"', select))

    add = admin_client.get(reverse("admin:studies_study_add")).content.decode()
    assert offered(add) == set()  # a new study has no arms yet: none of the others'
    assert "Save the study with its arms first" in add
    url = reverse("admin:studies_study_change", args=[mine.pk])
    page = admin_client.get(url).content.decode()
    assert offered(page) == {str(pk) for pk in mine.arms.values_list("pk", flat=True)}
    data = change_form_data(admin_client, url)
    data["control_arm"] = other.arms.first().pk
    response = admin_client.post(url, data)
    assert response.status_code == 200 and "Select a valid choice" in response.content.decode()
    data["control_arm"] = mine.arms.get(name="b").pk
    assert admin_client.post(url, data).status_code == 302
    mine.refresh_from_db()
    assert mine.control_arm.name == "b"
