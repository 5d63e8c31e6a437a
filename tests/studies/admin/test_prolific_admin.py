"""The researcher's Prolific actions in the admin: approve (AWAITING REVIEW only, others skipped
with a message), reject with a validated message and category, bonuses from the donation rule
or a CSV; each needs the permission to change participants."""

import re

import pytest
from django.contrib.auth.models import Permission, User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse
from parley.celery import app

from studies.models import BonusPayment, Participant, Review
from studies.prolific import sync as prolific_sync
from tests.support.studies import LONG_MESSAGE, join

CHANGELIST = "/admin/studies/participant/"


@pytest.fixture
def eager():
    """Tasks run in the request's process (the admin's enqueue goes through tasks.py)."""
    before = app.conf.task_always_eager
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = before


def editor(*codenames):
    user = User.objects.create(username="-".join(codenames) or "nobody", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    return user


def act(client, action, participants, **extra):
    selected = [p.pk for p in participants]
    return client.post(CHANGELIST, {"action": action, "_selected_action": selected, **extra})


def texts(response):
    return [str(m) for m in response.context["messages"]] if response.context else []


def test_bulk_approve_only_awaiting_review(
    client, fake, linked, eager, django_capture_on_commit_callbacks
):
    fake.add_study("STUDYP")
    fake.add_submission("SUB1", "PID1", "STUDYP", status="AWAITING REVIEW")
    fake.add_submission("SUB2", "PID2", "STUDYP", status="ACTIVE")
    ready = join(linked, "PID1", "SUB1", prolific_status="AWAITING REVIEW")
    busy = join(linked, "PID2", "SUB2", prolific_status="ACTIVE")
    client.force_login(editor("view_participant"))
    act(client, "approve_on_prolific", [ready, busy])
    assert not Review.objects.exists()  # not offered without the change permission
    client.force_login(editor("view_participant", "change_participant"))
    with django_capture_on_commit_callbacks(execute=True):
        response = act(client, "approve_on_prolific", [ready, busy])
    response = client.get(response.url)
    messages = " ".join(texts(response))
    assert "PID2 skipped: is ACTIVE, not AWAITING REVIEW" in messages
    assert "1 approval(s) queued" in messages
    assert fake.submissions["SUB1"]["status"] == "APPROVED"
    assert fake.submissions["SUB2"]["status"] == "ACTIVE"
    assert fake.called("POST", "bulk-approve")[0][2] == {"submission_ids": ["SUB1"]}
    # the row says so at once, before any sync
    assert fake.called("GET", "/submissions") == []
    ready.refresh_from_db()
    assert ready.prolific_status == "APPROVED"
    assert "AWAITING REVIEW" not in changelist_row(client, "PID1")
    # Prolific approves a bulk request asynchronously: a sync meanwhile does not undo it
    fake.submissions["SUB1"]["status"] = "AWAITING REVIEW"
    prolific_sync.sync_all()
    ready.refresh_from_db()
    assert ready.prolific_status == "APPROVED"


def changelist_row(client, pid) -> str:
    page = client.get(CHANGELIST).content.decode()
    [row] = re.findall(rf"<tr[^>]*>(?:(?!</tr>).)*{pid}(?:(?!</tr>).)*</tr>", page, re.DOTALL)
    return row


def test_reject_form_validates_message_and_category(
    client, fake, linked, eager, django_capture_on_commit_callbacks
):
    fake.add_study("STUDYP")
    fake.add_submission("SUB1", "PID1", "STUDYP", status="AWAITING REVIEW")
    p = join(linked, "PID1", "SUB1", prolific_status="AWAITING REVIEW")
    client.force_login(editor("view_participant", "change_participant"))
    page = act(client, "reject_on_prolific", [p])
    assert page.status_code == 200 and b"rejection_category" in page.content
    short = act(
        client,
        "reject_on_prolific",
        [p],
        apply="1",
        message="short",
        rejection_category="LOW_EFFORT",
    )
    assert b"at least 100 characters" in short.content
    bad = act(
        client,
        "reject_on_prolific",
        [p],
        apply="1",
        message=LONG_MESSAGE,
        rejection_category="NOPE",
    )
    assert b"Select a valid choice" in bad.content
    assert not Review.objects.exists()
    with django_capture_on_commit_callbacks(execute=True):
        act(
            client,
            "reject_on_prolific",
            [p],
            apply="1",
            message=LONG_MESSAGE,
            rejection_category="NO_DATA",
        )
    assert Review.objects.get().state == Review.State.SENT
    assert fake.submissions["SUB1"]["status"] == "REJECTED"
    p.refresh_from_db()
    assert p.prolific_status == "REJECTED"  # from the transition's answer, before any sync


def test_bonuses_from_csv_and_rule_in_the_admin(
    client, fake, linked, eager, django_capture_on_commit_callbacks
):
    fake.add_study("STUDYP")
    for n in range(3):
        fake.add_submission(f"SUB{n}", f"PID{n}", "STUDYP", status="AWAITING REVIEW")
    people = [
        join(linked, f"PID{n}", f"SUB{n}", outcome={"components": {"donation": 0.5 * (n + 1)}})
        for n in range(3)
    ]
    url = reverse("admin:studies_study_bonus_csv", args=[linked.pk])
    client.force_login(editor("view_study", "change_study", "view_participant"))
    assert client.get(url).status_code == 403  # the study, but not its participants
    client.force_login(
        editor("view_study", "change_study", "view_participant", "change_participant")
    )
    bad = client.post(url, {"file": SimpleUploadedFile("b.csv", b"PID0,x\nGHOST,1\n")})
    assert b"row 1: amount" in bad.content and b"GHOST" in bad.content
    assert not BonusPayment.objects.exists()
    with django_capture_on_commit_callbacks(execute=True):
        ok = client.post(
            url, {"file": SimpleUploadedFile("b.csv", b"participant,amount\nPID0,1.10\n")}
        )
    assert ok.status_code == 302
    with django_capture_on_commit_callbacks(execute=True):
        act(client, "donation_match_bonus", people, apply="1", factor="1")
    states = list(BonusPayment.objects.order_by("pk").values_list("state", flat=True))
    assert states == [BonusPayment.State.PAID, BonusPayment.State.PAID]
    assert fake.submissions["SUB0"]["bonus_payments"] == [110]  # not bonused twice
    assert fake.submissions["SUB1"]["bonus_payments"] == [100]
    assert fake.submissions["SUB2"]["bonus_payments"] == [150]
    assert len(fake.pays) == 2
    assert Participant.objects.count() == 3


def test_study_page_shows_codes_with_redirects_and_the_prolific_panel(admin_client, linked):
    p = join(linked, "PIDA", "SUBA", prolific_status="AWAITING REVIEW")
    p.attention_passed = False
    p.save()
    page = admin_client.get(reverse("admin:studies_study_change", args=[linked.pk]))
    assert page.status_code == 200
    text = page.content.decode()
    assert "https://app.prolific.com/submissions/complete?cc=DONE123" in text
    assert "https://app.prolific.com/submissions/complete?cc=NOCONS" in text
    assert "AWAITING REVIEW: 1" in text
    assert reverse("admin:studies_study_bonus_csv", args=[linked.pk]) in text


def test_the_prolific_panel_names_participants_only_with_the_permission(
    client, linked, monkeypatch
):
    """view_study alone listed the Prolific ids of the rejections Prolific's rules allow: by
    number instead (the rule itself is tested in tests/studies/prolific)."""
    monkeypatch.setitem(prolific_sync.RULES, "FAILED_CHECK", (lambda p: True, ""))
    p = join(linked, "PIDA", "SUBA", prolific_status="AWAITING REVIEW")
    url = reverse("admin:studies_study_change", args=[linked.pk])
    client.force_login(editor("view_study"))
    text = client.get(url).content.decode()
    assert "AWAITING REVIEW: 1" in text and f"#{p.pk} (FAILED_CHECK)" in text
    assert "PIDA" not in text and "SUBA" not in text
    client.force_login(editor("view_study", "view_participant"))
    assert "PIDA (FAILED_CHECK)" in client.get(url).content.decode()


@pytest.mark.parametrize("model", ["prolificevent", "bonuspayment"])
def test_prolifics_events_and_bonuses_need_the_participants_permission(client, linked, model):
    """An event's payload holds the participant's id and submission id (together they resume
    their study, studies/participation/arrive.py resume); a bonus names who is paid."""
    url = reverse(f"admin:studies_{model}_changelist")
    client.force_login(editor(f"view_{model}"))
    assert client.get(url).status_code == 403
    client.force_login(editor(f"view_{model}", "view_participant"))
    assert client.get(url).status_code == 200
