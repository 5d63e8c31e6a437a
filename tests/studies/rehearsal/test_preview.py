"""Preview: staff walk the real flow on a chosen arm; previews count in no assignment, cap,
export or analysis, and are marked in the admin."""

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from studies.models import Participant, Study
from studies.participation import start
from studies.participation.arrive import arrive
from studies.participation.chat_turn import end_chat, store_user_message
from studies.participation.complete import completion_url
from studies.research import analysis_runs, exports
from tests.support.studies import GOOD_ANSWERS, make_study, prolific

pytestmark = pytest.mark.django_db


def preview_url(study, arm) -> str:
    return reverse("admin:studies_study_preview", args=[study.pk]) + f"?arm={arm.pk}"


def staff(username, *codenames) -> User:
    user = User.objects.create(username=username, is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    return user


def start_preview(client, study, arm):
    """The preview page's button: a POST of the arm."""
    return client.post(reverse("admin:studies_study_preview", args=[study.pk]), {"arm": arm.pk})


def test_only_staff_with_view_permission_start_a_preview(client):
    study = make_study()
    arm = study.arms.get(name="b")
    url = preview_url(study, arm)
    assert client.get(url).status_code == 302 and "/login/" in client.get(url).url
    assert start_preview(client, study, arm).status_code == 302
    client.force_login(staff("nobody"))
    assert client.get(url).status_code == 403
    assert start_preview(client, study, arm).status_code == 403
    assert not Participant.objects.exists()
    client.force_login(staff("viewer", "view_study"))
    response = start_preview(client, study, arm)
    assert response.status_code == 302
    participant = Participant.objects.get()
    assert response.url == reverse("studies:participant", args=[participant.token])
    assert participant.is_preview and participant.arm.name == "b"


def test_the_preview_link_shows_a_button_and_creates_nothing(admin_client):
    """A GET (the study page's link, or one from another site) only shows the page; its button
    posts the arm it names."""
    study = make_study(arms=("a", "b"))
    arm = study.arms.get(name="b")
    for url in (preview_url(study, arm), reverse("admin:studies_study_preview", args=[study.pk])):
        page = admin_client.get(url)
        assert page.status_code == 200
        assert b'method="post"' in page.content and b"csrfmiddlewaretoken" in page.content
        assert f'name="arm" value="{arm.pk}"'.encode() in page.content
    assert (
        f'value="{study.arms.get(name="a").pk}"'.encode()
        not in admin_client.get(preview_url(study, arm)).content
    )  # the linked arm only
    assert not Participant.objects.exists()


def test_a_preview_post_without_the_csrf_token_creates_nothing(db):
    study = make_study()
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(User.objects.create_superuser("root", "root@example.org", "x"))
    assert start_preview(browser, study, study.arms.first()).status_code == 403
    assert not Participant.objects.exists()
    page = browser.get(preview_url(study, study.arms.first()))
    token = page.context["csrf_token"]
    response = browser.post(
        reverse("admin:studies_study_preview", args=[study.pk]),
        {"arm": study.arms.first().pk, "csrfmiddlewaretoken": str(token)},
    )
    assert response.status_code == 302 and Participant.objects.get().is_preview


def test_an_arm_of_another_study_is_not_found(admin_client):
    study, other = make_study(), make_study(slug="other")
    url = preview_url(study, other.arms.first())
    assert admin_client.get(url).status_code == 404
    assert start_preview(admin_client, study, other.arms.first()).status_code == 404
    assert (
        admin_client.post(reverse("admin:studies_study_preview", args=[study.pk])).status_code
        == 404
    )
    assert not Participant.objects.exists()


def test_the_study_page_links_a_preview_per_arm(admin_client):
    study = make_study(arms=("a", "b", "c"))
    page = admin_client.get(reverse("admin:studies_study_change", args=[study.pk])).content
    for arm in study.arms.all():
        assert preview_url(study, arm).replace("&", "&amp;").encode() in page


def test_a_preview_runs_the_real_flow_and_counts_nowhere(admin_client, client):
    study = make_study(status=Study.Status.DRAFT)  # previewed before it goes live
    response = start_preview(admin_client, study, study.arms.get(name="b"))
    page = client.get(response.url)
    assert page.status_code == 200 and b"preview-banner" in page.content
    preview = Participant.objects.get()
    client.post(reverse("studies:consent", args=[preview.token]), {"decision": "accept"})
    preview.refresh_from_db()
    assert preview.status == Participant.Status.CHAT
    store_user_message(preview, "m1", "hello")
    end_chat(preview)
    client.post(reverse("studies:questionnaire", args=[preview.token]), GOOD_ANSWERS)
    preview.refresh_from_db()
    assert preview.status == Participant.Status.COMPLETED
    assert completion_url(preview) is None  # nothing to return to Prolific

    # Not in assignment: the next person still goes to the first arm by the tie-break ...
    Study.objects.filter(pk=study.pk).update(status=Study.Status.LIVE, target_per_arm=1)
    study.refresh_from_db()
    person, _ = arrive(study, prolific(pid="person"))
    assert person.arm.name == "a"
    second, _ = arrive(study, prolific(pid="second"))
    assert second.arm.name == "b"  # ... and the preview holds no place under the cap
    # Not in exports (not even with bots) nor in the analysis.
    for include_bots in (False, True):
        rows = list(exports.response_rows(study.participants.all(), include_bots))
        assert all("preview" not in row[1] for row in rows[1:]) and len(rows) == 3
        messages = list(exports.transcript_rows(study.participants.all(), include_bots))
        assert len(messages) == 1  # the header: the preview's messages stay out
    table = analysis_runs.participant_table(study, include_bots=True)
    assert list(table["participant"]) == ["person", "second"]
    assert not analysis_runs.target_reached(study)


def test_previews_are_marked_in_the_admin(admin_client):
    study = make_study()
    start.start_preview(study.arms.first())
    arrive(study, prolific(pid="person"))
    page = admin_client.get(reverse("admin:studies_participant_changelist")).content.decode()
    assert "preview" in page and "person" in page
    filtered = admin_client.get(
        reverse("admin:studies_participant_changelist"), {"is_preview__exact": "1"}
    ).content.decode()
    assert "person" not in filtered.replace("prolific_pid", "")
