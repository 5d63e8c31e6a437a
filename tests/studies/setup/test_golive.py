"""Going live: the checks refuse a study that cannot run, by every path, with the list of what
is wrong; participants never see a server error, and a study that cannot start someone does not
keep their place."""

import pytest
from django.core.cache import cache
from django.urls import reverse

from agents.models import ModelEndpoint
from studies.models import Arm, Item, Participant, Questionnaire, Study, StudyError
from studies.participation import views
from studies.participation.arrive import arrive
from studies.participation.assign import arms_with_fill
from studies.setup import go_live
from studies.setup.scenario_pools import import_pool
from tests.support.scripted_server import ScriptedServer
from tests.support.studies import (
    change_form_data,
    make_study,
    prolific,
)

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_remembered_health():
    """Endpoint health is cached briefly; each test asks afresh."""
    cache.clear()


UNREACHABLE = "http://127.0.0.1:9/v1"


@pytest.fixture
def engine():
    with ScriptedServer([], models=["served-model", "other"]) as server:
        yield server


def ready_study(engine, slug="ready", **fields):
    study = make_study(slug=slug, engine=engine.url, status=Study.Status.DRAFT, **fields)
    study.arms.update(model_name="served-model")
    return study


def test_a_bare_study_lists_everything_that_is_wrong():
    study = Study.objects.create(slug="bare", title="Bare", domain="retail", completion_code="")
    found = go_live.problems(study)
    text = "\n".join(found)
    assert "scenario" in text
    assert "no questionnaire" in text
    assert "no active arm" in text
    assert "completion code is missing" in text
    assert "no consent code" in text.lower() and "timeout code" in text.lower()
    with pytest.raises(go_live.NotReady):
        go_live.set_live(study)
    assert Study.objects.get(pk=study.pk).status == Study.Status.DRAFT


def test_open_chat_needs_no_scenario_and_the_other_code_covers_the_ending_codes(engine):
    study = ready_study(engine, no_consent_code="", timeout_code="", other_code="OTHER1")
    assert go_live.problems(study) == []
    go_live.set_live(study)
    assert Study.objects.get(pk=study.pk).status == Study.Status.LIVE


def test_a_task_study_needs_active_scenarios_of_its_domain(engine):
    study = ready_study(engine, domain="retail")
    assert any("scenario" in p for p in go_live.problems(study))
    import_pool(study, "retail", 2, None, "", 0)
    assert go_live.problems(study) == []
    study.scenarios.update(active=False)
    assert any("scenario" in p for p in go_live.problems(study))


def test_an_empty_questionnaire_is_refused(engine):
    study = ready_study(engine)
    Item.objects.filter(questionnaire__study=study).delete()
    assert go_live.problems(study) == ["The questionnaire has no items."]
    Questionnaire.objects.filter(study=study).delete()
    assert go_live.problems(Study.objects.get(pk=study.pk)) == ["There is no questionnaire."]


def test_each_arm_needs_an_endpoint_that_serves_its_model(engine, monkeypatch):
    study = ready_study(engine)
    Arm.objects.filter(study=study, name="a").update(model_name="missing-adapter")
    Arm.objects.filter(study=study, name="b").update(endpoint=ModelEndpoint.of_url(UNREACHABLE))
    found = go_live.problems(study)
    assert len(found) == 2, found
    assert "Arm a" in found[0] and "missing-adapter" in found[0] and "served-model" in found[0]
    assert "Arm b" in found[1] and "no replica" in found[1] and UNREACHABLE in found[1]
    # An inactive arm takes nobody: it is not checked.
    Arm.objects.filter(study=study, name="b").update(active=False)
    assert len(go_live.problems(study)) == 1
    # A key named but unset in the environment is a problem too.
    monkeypatch.delenv("PARLEY_TEST_KEY", raising=False)
    Arm.objects.filter(study=study, name="a").update(model_name="served-model")
    ModelEndpoint.objects.filter(arms__name="a").update(api_key_env="PARLEY_TEST_KEY")
    assert "PARLEY_TEST_KEY" in go_live.problems(study)[0]


def test_the_health_panel_is_cached_briefly(engine):
    study = ready_study(engine)
    arms = list(study.arms.all())
    go_live.cached_health(arms)
    asked = engine.model_lists
    assert asked == 1  # one request for the endpoint both arms share
    go_live.cached_health(arms)
    assert engine.model_lists == asked


# --- the admin ----------------------------------------------------------------------------------


def test_the_change_form_refuses_live_with_the_list_and_saves_nothing(admin_client, engine):
    study = ready_study(engine, domain="retail")  # no scenario yet
    url = reverse("admin:studies_study_change", args=[study.pk])
    data = change_form_data(admin_client, url)
    data.update(status="live", title="Renamed", **{"arms-1-model_name": "other-served"})
    engine.models.append("other-served")
    response = admin_client.post(url, data)
    assert response.status_code == 200  # the form again, not a redirect
    text = response.content.decode()
    assert "Cannot go live" in text and "scenario" in text
    study.refresh_from_db()
    assert study.arms.get(name="b").model_name == "served-model"  # the inline rolled back too
    # An arm pointed at a model the endpoint does not serve is refused on its own, with the
    # names it does serve (the arms' own check, before any go-live check).
    data.update(**{"arms-0-model_name": "missing-adapter"})
    text = admin_client.post(url, data).content.decode()
    assert "Refused" in text and "missing-adapter" in text and "other-served" in text
    study.refresh_from_db()
    assert study.status == Study.Status.DRAFT and study.title == "Test study"
    assert study.arms.get(name="a").model_name == "served-model"  # the inline rolled back too

    # Fixed in the same save (the checks see the arms as saved): it goes live.
    import_pool(study, "retail", 1, None, "", 0)
    data = change_form_data(admin_client, url)
    data.update(status="live")
    response = admin_client.post(url, data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert Study.objects.get(pk=study.pk).status == Study.Status.LIVE


def test_the_change_page_shows_the_checks_as_a_panel(admin_client, engine):
    study = ready_study(engine, domain="retail")
    page = admin_client.get(reverse("admin:studies_study_change", args=[study.pk])).content
    assert b"needs scenarios" in page
    import_pool(study, "retail", 1, None, "", 0)
    page = admin_client.get(reverse("admin:studies_study_change", args=[study.pk])).content
    assert b"Ready to go live" in page


def test_the_list_action_goes_live_only_when_ready(admin_client, engine):
    study = ready_study(engine)
    Arm.objects.filter(study=study).update(model_name="missing-adapter")
    changelist = reverse("admin:studies_study_changelist")
    form = {"action": "go_live", "_selected_action": [study.pk]}
    response = admin_client.post(changelist, form, follow=True)
    assert "cannot go live" in response.content.decode()
    assert Study.objects.get(pk=study.pk).status == Study.Status.DRAFT
    Arm.objects.filter(study=study).update(model_name="served-model")
    admin_client.post(changelist, form)
    assert Study.objects.get(pk=study.pk).status == Study.Status.LIVE


# --- participants never see a server error -----------------------------------------------------


def test_an_empty_pool_refuses_arrivals_without_taking_a_place(client):
    study = make_study(slug="tau", domain="retail")
    response = client.get(reverse("studies:arrive", args=[study.slug]), prolific())
    assert response.status_code == 503
    assert b"not ready" in response.content and b"Traceback" not in response.content
    assert not Participant.objects.exists()
    assert StudyError.objects.filter(study=study).count() == 1


def test_a_participant_who_could_not_start_gives_the_place_back_and_starts_later(client):
    """The report: a live tau2 study with an empty pool; the participant who already held a
    place got a 500 at consent, and kept it after scenarios were imported."""
    study = make_study(slug="tau", domain="retail", other_code="OTHERCODE")
    arm = study.arms.get(name="a")
    stuck = Participant.objects.create(
        study=study, arm=arm, prolific_pid="stuck", prolific_study_id="s", prolific_session_id="x"
    )
    response = client.post(reverse("studies:consent", args=[stuck.token]), {"decision": "accept"})
    assert response.status_code == 503 and b"Traceback" not in response.content
    assert b"app.prolific.com/submissions/complete?cc=OTHERCODE" in response.content
    stuck.refresh_from_db()
    assert stuck.status == Participant.Status.UNSTARTED
    assert all(a.filled == 0 for a in arms_with_fill(study))  # the place is free
    error = StudyError.objects.get(study=study)
    assert error.participant == stuck and "not ready" in error.title

    # Still nothing to start with: the page says so again, and no place is taken.
    page = client.get(reverse("studies:participant", args=[stuck.token]))
    assert page.status_code == 503
    assert Participant.objects.get(pk=stuck.pk).status == Participant.Status.UNSTARTED

    import_pool(study, "retail", 2, None, "", 0)
    page = client.get(reverse("studies:participant", args=[stuck.token]))
    assert page.status_code == 200 and b"consent-accept" in page.content
    client.post(reverse("studies:consent", args=[stuck.token]), {"decision": "accept"})
    stuck.refresh_from_db()
    assert stuck.status == Participant.Status.CHAT and stuck.scenario is not None


def test_a_place_held_before_the_import_starts_with_a_scenario(client):
    study = make_study(slug="tau", domain="retail")
    early = Participant.objects.create(
        study=study,
        arm=study.arms.first(),
        prolific_pid="early",
        prolific_study_id="s",
        prolific_session_id="x",
    )
    import_pool(study, "retail", 1, None, "", 0)
    client.post(reverse("studies:consent", args=[early.token]), {"decision": "accept"})
    early.refresh_from_db()
    assert early.status == Participant.Status.CHAT and early.scenario is not None


def test_any_unexpected_exception_is_a_friendly_page_and_recorded(client, study, monkeypatch):
    participant, _ = arrive(study, prolific())

    def broken(*args, **kwargs):
        raise RuntimeError("the secret internals")

    monkeypatch.setattr(views, "give_consent", broken)  # where the consent page looks it up
    response = client.post(
        reverse("studies:consent", args=[participant.token]), {"decision": "accept"}
    )
    assert response.status_code < 500 or response.status_code == 503
    assert b"Something went wrong" in response.content
    assert b"secret internals" not in response.content and b"Traceback" not in response.content
    error = StudyError.objects.get()
    assert error.participant == participant and "RuntimeError" in error.traceback


def test_the_problem_page_offers_the_other_code_only_when_set(client, study):
    url = reverse("studies:arrive", args=[study.slug])
    assert b"return-to-prolific" not in client.get(url, {"PROLIFIC_PID": "x"}).content
    study.other_code = "OTHER9"  # the problem pages' code (a CompletionCode row)
    study.save()
    page = client.get(url, {"PROLIFIC_PID": "x"}).content
    assert b"return-to-prolific" in page and b"OTHER9" in page


def test_adding_a_study_as_live_is_refused_and_adds_nothing(admin_client):
    url = reverse("admin:studies_study_add")
    data = change_form_data(admin_client, url)
    data.update(title="New", slug="new", status="live")
    data.update(  # the completion code, inline
        {
            "completion_codes-TOTAL_FORMS": "1",
            "completion_codes-0-code_type": "COMPLETED",
            "completion_codes-0-code": "C1",
            "completion_codes-0-ending": "completed",
        }
    )
    response = admin_client.post(url, data)
    assert response.status_code == 200
    assert "There is no active arm" in response.content.decode()
    assert not Study.objects.filter(slug="new").exists()
    data["status"] = "draft"
    assert admin_client.post(url, data).status_code == 302
    assert Study.objects.get(slug="new").status == Study.Status.DRAFT
