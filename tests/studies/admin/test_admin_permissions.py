"""The admin's own pages and actions check model permissions as the built-in ones do: view to
read, change to act. Pages and actions are found from the URL resolver and the registered
ModelAdmins, so a new one without a check fails here."""

import re

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.auth.models import Permission, User
from django.urls import get_resolver, reverse

from agents.models import Checkpoint, ModelEndpoint
from studies.models import (
    AnalysisRun,
    Arm,
    BonusPayment,
    ErasureRecord,
    Participant,
    Review,
    Scenario,
    Study,
)
from studies.research import analysis_runs
from tests.support.studies import fill, make_study
from training.models import TrainingRun

pytestmark = pytest.mark.django_db

APPS = ("studies", "training", "agents")
BUILT_IN = ("changelist", "add", "change", "delete", "history", "autocomplete")
# A value for each URL parameter that is not the object's pk.
SAMPLE = {"kind": "csv", "name": "train_reward.png", "figure": "means"}
# What the custom pages do: read (view permission) or act (change permission).
READS = {
    "studies_study_responses",
    "studies_study_transcripts",
    "studies_participant_transcript",
    "studies_analysisrun_download",
    "studies_analysisrun_figure",
    "training_trainingrun_progress",
    "studies_study_monitor",
    "studies_study_monitor_json",
    "studies_study_preview",
}
ACTS = {
    "studies_study_import",
    "studies_study_analyse",
    "studies_study_switch",
    "studies_study_bonus_csv",
    "studies_erasurerecord_erase",
}


def custom_admin_urls() -> dict[str, str]:
    """Every admin URL of our apps that is not one of the admin's built-in pages, by name."""
    resolver = get_resolver().namespace_dict["admin"][1]
    pattern = re.compile(rf"^({'|'.join(APPS)})_([a-z0-9]+)_(.+)$")
    urls = {}
    for name in [key for key in resolver.reverse_dict if isinstance(key, str)]:
        match = pattern.match(name)
        if not match or match[3] in BUILT_IN:
            continue
        model = apps.get_model(match[1], match[2])
        obj = model.objects.first()
        assert obj is not None, f"the fixture needs a {model.__name__} for {name}"
        [(possibilities, *_)] = resolver.reverse_dict.getlist(name)
        [(_, params)] = possibilities
        missing = set(params) - {"pk"} - set(SAMPLE)
        assert not missing, f"add a SAMPLE value for {missing} ({name})"
        kwargs = {p: obj.pk if p == "pk" else SAMPLE[p] for p in params}
        urls[name] = reverse(f"admin:{name}", kwargs=kwargs)
    return urls


def custom_actions() -> list[tuple[type, str]]:
    """(model, action name) for every action of our apps' ModelAdmins but Django's delete."""
    return [
        (model, name)
        for model, model_admin in admin.site._registry.items()
        if model._meta.app_label in APPS
        for _, name, _ in model_admin._get_base_actions()
        if name != "delete_selected"
    ]


@pytest.fixture
def data(db):
    """One of everything the custom pages and actions work on."""
    study = make_study(comparisons="all")
    fill(study, {"a": [5], "b": [2]})
    run = analysis_runs.compute(AnalysisRun.objects.create(study=study))
    assert run.status == AnalysisRun.Status.DONE, run.error
    TrainingRun.objects.create(name="run1")
    Checkpoint.objects.create(name="ckpt1", path="/nowhere/ckpt1")
    BonusPayment.objects.create(study=study, source="test", state=BonusPayment.State.FAILED)
    study.participants.update(prolific_status="AWAITING REVIEW")
    ErasureRecord.objects.create(participant_number=0, reason="an earlier request")
    return study


def staff(username, *codenames) -> User:
    user = User.objects.create(username=username, is_staff=True)  # force_login: no password
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    return user


def view_permissions() -> list[str]:
    return [
        f"view_{model._meta.model_name}"
        for model in admin.site._registry
        if model._meta.app_label in APPS
    ]


def state():
    """What any action or page that acts would change."""
    return (
        AnalysisRun.objects.count(),
        Scenario.objects.count(),
        list(Study.objects.values_list("pk", "status")),
        list(Participant.objects.values_list("pk", "status")),
        list(TrainingRun.objects.values_list("pk", "status")),
        list(Arm.objects.values_list("pk", "model_name", "endpoint")),
        Checkpoint.objects.count(),
        Review.objects.count(),
        list(BonusPayment.objects.values_list("pk", "state")),
    )


def changelist(model) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")


def run_action(client, model, name, **extra):
    selected = [model.objects.first().pk]
    return client.post(changelist(model), {"action": name, "_selected_action": selected, **extra})


def refused(response) -> bool:
    return response.status_code == 403 or (
        response.status_code == 302 and response.url.startswith(reverse("admin:login"))
    )


def test_the_resolver_finds_every_known_custom_page(data):
    assert set(custom_admin_urls()) >= READS | ACTS


def mentioned(pids: list[str], text: str) -> list[str]:
    """The ids that `text` holds as whole words: a short id such as "p1" can also turn up inside
    a page's random CSRF token, which is no leak."""
    return [pid for pid in pids if re.search(rf"(?<![\w-]){re.escape(pid)}(?![\w-])", text)]


def test_staff_without_permissions_is_refused_every_custom_page(client, data):
    client.force_login(staff("nobody"))
    before = state()
    pids = list(Participant.objects.values_list("prolific_pid", flat=True))
    for name, url in custom_admin_urls().items():
        for method in (client.get, client.post):
            response = method(url, {"domain": "retail", "count": "2", "source": "builtin"})
            assert refused(response), f"{method.__name__.upper()} {name}: {response.status_code}"
            text = b"".join(response.streaming_content) if response.streaming else response.content
            assert not mentioned(pids, text.decode(errors="replace")), name
    assert state() == before


def test_staff_without_permissions_is_refused_every_custom_action(client, data):
    client.force_login(staff("nobody"))
    before = state()
    for model, name in custom_actions():
        assert refused(run_action(client, model, name, apply="1")), name
    assert state() == before


def test_view_permission_reads_but_does_not_act(client, data):
    client.force_login(staff("viewer", *view_permissions()))
    urls = custom_admin_urls()
    for name in READS:
        assert client.get(urls[name]).status_code == 200, name
    before = state()
    for name in ACTS:
        assert client.get(urls[name]).status_code == 403, name
        assert client.post(urls[name], {"domain": "retail", "count": "2"}).status_code == 403
    for model, name in custom_actions():
        response = run_action(client, model, name, apply="1")
        if name.startswith("export_"):
            assert response.status_code == 200 and response["Content-Type"] == "text/csv"
        else:  # not offered: the admin answers "No action selected" and does nothing
            assert response.status_code in (200, 302), name
            assert "Content-Disposition" not in response, name
    assert state() == before


def test_no_admin_user_sees_a_participant_token(client, data):
    """The token opens the participant's own chat: not shown to viewers, nor to editors."""
    participant = Participant.objects.first()
    page = reverse("admin:studies_participant_change", args=[participant.pk])
    for user in (
        staff("viewer", *view_permissions()),
        staff("editor", *view_permissions(), "change_participant"),
    ):
        client.force_login(user)
        response = client.get(page)
        assert response.status_code == 200 and participant.prolific_pid in response.content.decode()
        assert str(participant.token) not in response.content.decode()


def test_change_permission_acts(client, data):
    """The same pages and actions work for a user who holds the permission."""
    client.force_login(staff("editor", *view_permissions(), "change_study", "change_trainingrun"))
    study = Study.objects.get()
    response = client.post(reverse("admin:studies_study_analyse", args=[study.pk]))
    assert response.status_code == 302 and AnalysisRun.objects.count() == 2
    run_action(client, TrainingRun, "cancel")
    assert TrainingRun.objects.get().status == TrainingRun.Status.CANCELLED


def test_attaching_a_checkpoint_needs_the_permission_to_change_arms(client, data, settings):
    settings.PARLEY_ARM_MODEL_CHECK = "warn"  # no engine here: this is about permissions
    arms = list(Arm.objects.values_list("pk", flat=True))
    dead = ModelEndpoint.of_url("http://127.0.0.1:9/v1")
    form = {"arms": arms, "endpoint": dead.pk, "apply": "1"}
    client.force_login(staff("checkpoints", "view_checkpoint", "change_checkpoint"))
    before = state()
    run_action(client, Checkpoint, "attach_to_arm", **form)
    assert state() == before
    client.force_login(staff("arms", "view_checkpoint", "change_arm"))
    run_action(client, Checkpoint, "attach_to_arm", **form)
    assert set(Arm.objects.values_list("model_name", flat=True)) == {"ckpt1"}


# Every page and export holding what participants wrote or answered, one row per participant.
PARTICIPANT_DATA = {
    "studies_study_responses",
    "studies_study_transcripts",
    "studies_participant_transcript",
}
PARTICIPANT_EXPORTS = ("export_responses", "export_transcripts")


def test_participants_data_needs_the_permission_to_view_participants(client, data):
    """One rule for transcripts, answers and their exports: a staff user who may view studies
    (and analyses) but not participants gets none of them; one who may view participants does."""
    urls = custom_admin_urls()
    run = AnalysisRun.objects.get()
    input_csv = reverse("admin:studies_analysisrun_download", args=[run.pk, "input"])
    pids = list(Participant.objects.values_list("prolific_pid", flat=True))
    assert pids
    everything_but_participants = [p for p in view_permissions() if p != "view_participant"]
    client.force_login(staff("studies-only", *everything_but_participants))
    for name in PARTICIPANT_DATA:
        assert client.get(urls[name]).status_code == 403, name
    assert client.get(input_csv).status_code == 403
    for name in PARTICIPANT_EXPORTS:
        response = run_action(client, Study, name)
        assert "Content-Disposition" not in response, name
        text = response.content.decode()
        assert not mentioned(pids, text), name
    # what holds no participant's data stays readable, and offers no link that would 403
    assert client.get(urls["studies_study_monitor"]).status_code == 200
    study_page = reverse("admin:studies_study_change", args=[Study.objects.first().pk])
    page = client.get(study_page).content.decode()
    assert (
        urls["studies_study_transcripts"] not in page and "permission to view participants" in page
    )
    assert client.get(urls["studies_analysisrun_download"]).status_code == 200

    client.force_login(staff("reader", *everything_but_participants, "view_participant"))
    assert urls["studies_study_transcripts"] in client.get(study_page).content.decode()
    for name in PARTICIPANT_DATA:
        assert client.get(urls[name]).status_code == 200, name
    assert client.get(input_csv).status_code == 200
    for name in PARTICIPANT_EXPORTS:
        response = run_action(client, Study, name)
        assert response["Content-Type"] == "text/csv", name
        assert any(pid in b"".join(response.streaming_content).decode() for pid in pids), name
