"""The model endpoint registry against real HTTP servers (scripted engines, a dead port) on
PostgreSQL: the health task, the admin's colours, arms refused or warned about, point_arms,
and the migration that moved arms' URLs onto endpoints."""

import pytest
from django.conf import settings as django_settings
from django.core.exceptions import ValidationError
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.urls import reverse
from starlette.responses import JSONResponse

from agents.models import ModelEndpoint, Replica
from agents.serving.process import free_port
from agents.tasks import check_endpoints
from studies.models import Arm
from studies.setup.arm_endpoints import check_endpoint, point_arms, register_endpoint
from tests.support.scripted_server import ScriptedServer
from tests.support.studies import make_study

pytestmark = pytest.mark.django_db


def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}/v1"


class Unwell(ScriptedServer):
    """Lists its models but answers GET /health with 503 (a vLLM whose engine has died)."""

    async def health(self, request):
        return JSONResponse({"error": "engine dead"}, status_code=503)


@pytest.fixture
def engine():
    with ScriptedServer([], models=["base", "adapter-a"]) as server:
        yield server


def test_the_beat_task_stores_each_replica_s_health(engine):
    dead = dead_url()
    with Unwell([], models=["base"]) as unwell:
        endpoint = register_endpoint("pair", "vllm", [engine.url, dead, unwell.url])
        assert {r.status for r in endpoint.replica_list()} == {Replica.Status.UNKNOWN}
        assert check_endpoints() == {"pair": "amber"}
    up, down, sick = ModelEndpoint.objects.get(name="pair").replica_list()
    assert up.status == "up" and up.served_models == ["base", "adapter-a"] and up.checked_at
    assert up.last_error == "" and up.last_error_at is None
    assert down.status == "down" and down.checked_at and down.last_error_at
    assert "/health" in down.last_error and "Cannot connect" in down.last_error
    assert sick.status == "down" and "503" in sick.last_error and "engine dead" in sick.last_error
    # the task is on beat's schedule, every PARLEY_ENDPOINT_CHECK_INTERVAL seconds
    entry = django_settings.CELERY_BEAT_SCHEDULE["check-model-endpoints"]
    assert entry["task"] == check_endpoints.name
    assert entry["schedule"] == django_settings.PARLEY_ENDPOINT_CHECK_INTERVAL


def test_a_replica_up_again_keeps_its_last_error_with_its_time(engine):
    endpoint = register_endpoint("one", "vllm", [engine.url])
    Replica.objects.filter(endpoint=endpoint).update(status="down", last_error="was down")
    check_endpoint(ModelEndpoint.objects.get(pk=endpoint.pk))
    replica = Replica.objects.get(endpoint=endpoint)
    assert replica.status == "up" and replica.last_error == "was down"


def test_a_hosted_endpoint_is_not_asked_for_health_and_its_key_is_read_from_the_env(
    engine, monkeypatch
):
    # ScriptedServer's /health would answer; a hosted API has none, and a key it names must be set
    endpoint = register_endpoint("api", "hosted", [engine.url], api_key_env="PARLEY_TEST_KEY")
    monkeypatch.delenv("PARLEY_TEST_KEY", raising=False)
    replica = check_endpoint(endpoint).replica_list()[0]
    assert replica.status == "down" and "PARLEY_TEST_KEY is unset" in replica.last_error
    monkeypatch.setenv("PARLEY_TEST_KEY", "sk-test")
    assert check_endpoint(endpoint).replica_list()[0].status == "up"
    assert engine.headers == []  # no chat; the key went with GET /v1/models only
    assert "sk-test" not in str(ModelEndpoint.objects.filter(pk=endpoint.pk).values().get())


def test_register_endpoint_updates_replicas_and_keeps_their_health(engine):
    dead = dead_url()
    endpoint = check_endpoint(register_endpoint("e", "vllm", [engine.url]))
    again = register_endpoint("e", "embedded", [dead, engine.url + "/"])
    assert again.pk == endpoint.pk and again.kind == "embedded"
    assert again.urls() == [dead, engine.url]
    assert [r.status for r in again.replica_list()] == ["unknown", "up"]
    assert register_endpoint("e", "vllm", [dead]).urls() == [dead]
    assert Replica.objects.count() == 1
    with pytest.raises(ValidationError):
        register_endpoint("e", "vllm", [])
    with pytest.raises(ValidationError):
        register_endpoint("e", "gpu", [dead])
    with pytest.raises(ValidationError):
        register_endpoint("e", "vllm", [dead], api_key_env="sk-the-key-itself")


NAMES = ("all-up", "half", "all-down", "new")


def test_the_admin_lists_endpoints_in_colours(admin_client, engine):
    check_endpoint(register_endpoint("all-up", "vllm", [engine.url]))
    check_endpoint(register_endpoint("half", "vllm", [engine.url, dead_url()]))
    check_endpoint(register_endpoint("all-down", "vllm", [dead_url()]))
    register_endpoint("new", "vllm", [dead_url()])  # not checked yet
    page = admin_client.get(reverse("admin:agents_modelendpoint_changelist")).content.decode()
    rows = {name: next(row for row in page.split("<tr") if f">{name}<" in row) for name in NAMES}
    assert "health-green" in rows["all-up"] and "health-red" not in rows["all-up"]
    assert "health-amber" in rows["half"] and "health-down" in rows["half"]
    assert "health-red" in rows["all-down"] and "health-green" not in rows["all-down"]
    assert "health-amber" in rows["new"] and "health-unknown" in rows["new"]
    assert "adapter-a" in rows["all-up"]  # the served models
    assert "agents/endpoints.css" in page  # the colours come from a file (CSP)
    change = reverse(
        "admin:agents_modelendpoint_change", args=[ModelEndpoint.objects.get(name="half").pk]
    )
    assert "Cannot connect" in admin_client.get(change).content.decode()  # the replica's error


def test_an_arm_whose_model_no_healthy_replica_serves_is_refused_with_the_served_names(engine):
    study = make_study(engine=engine.url)
    endpoint = register_endpoint("smol", "vllm", [dead_url(), engine.url])
    arm = Arm(study=study, name="c", endpoint=endpoint, model_name="adapter-b")
    with pytest.raises(ValidationError) as refused:
        arm.full_clean()
    assert "adapter-b" in str(refused.value) and "adapter-a, base" in str(refused.value)
    arm.model_name = "adapter-a"
    arm.full_clean()  # served by the replica that is up
    arm.save()
    # Nothing up at all: refused with each replica's error.
    down = register_endpoint("down", "vllm", [dead_url()])
    arm.endpoint = down
    with pytest.raises(ValidationError, match="no replica of endpoint down is up"):
        arm.full_clean()
    # An arm not being re-pointed is not checked: its study can still be saved (paused, say).
    Arm.objects.filter(pk=arm.pk).update(endpoint=down)
    Arm.objects.get(pk=arm.pk).full_clean()


def test_warn_mode_saves_the_arm_and_the_admin_says_why(admin_client, engine, settings):
    settings.PARLEY_ARM_MODEL_CHECK = "warn"
    study = make_study(engine=engine.url)
    Arm(
        study=study, name="c", endpoint=ModelEndpoint.of_url(engine.url), model_name="nope"
    ).full_clean()
    from tests.support.studies import change_form_data

    url = reverse("admin:studies_study_change", args=[study.pk])
    data = change_form_data(admin_client, url)
    data["arms-0-model_name"] = "missing-adapter"
    response = admin_client.post(url, data, follow=True)
    assert response.redirect_chain, response.context["adminform"].form.errors
    text = response.content.decode()
    assert "missing-adapter" in text and "adapter-a, base" in text
    assert study.arms.get(name="a").model_name == "missing-adapter"


def test_point_arms_points_a_study_at_an_endpoint(engine):
    study = make_study(engine=dead_url())
    endpoint = register_endpoint("served", "vllm", [engine.url])
    with pytest.raises(ValidationError) as refused:  # their model is not served there
        point_arms(study, endpoint)
    assert "SmolLM2-135M-Instruct" in str(refused.value) and "adapter-a" in str(refused.value)
    assert {arm.endpoint.name for arm in study.arms.all()} != {"served"}  # nothing saved
    with pytest.raises(ValidationError, match="no arm named z"):
        point_arms(study, endpoint, {"z": "base"})
    arms = point_arms(study, endpoint, {"a": "base", "b": "adapter-a"})
    assert [(a.name, a.model_name) for a in arms] == [("a", "base"), ("b", "adapter-a")]
    stored = study.arms.select_related("endpoint").order_by("order")
    assert [(a.endpoint.name, a.model_name) for a in stored] == [
        ("served", "base"),
        ("served", "adapter-a"),
    ]


def test_new_arms_default_to_the_endpoint_of_parley_engine_url(settings):
    settings.PARLEY_ENGINE_URL = "http://127.0.0.1:8001/v1"
    study = make_study(engine="http://127.0.0.1:9/v1")
    arm = Arm.objects.create(study=study, name="c", model_name="m")
    assert arm.endpoint.name == "default" and arm.endpoint.urls() == ["http://127.0.0.1:8001/v1"]
    assert Arm.objects.create(study=study, name="d", model_name="m").endpoint == arm.endpoint


@pytest.mark.django_db(transaction=True)
def test_the_migration_moves_each_arm_s_url_and_key_onto_an_endpoint():
    before = [
        ("studies", "0010_arm_structured_tool_format"),
        ("agents", "0002_remove_checkpoint_training_run"),
    ]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    old = executor.loader.project_state(before).apps
    study = old.get_model("studies", "Study").objects.create(slug="old", title="Old")
    OldArm = old.get_model("studies", "Arm")
    rows = [
        ("a", django_settings.PARLEY_ENGINE_URL, ""),
        ("b", "http://10.0.0.2:8000/v1", ""),
        ("c", "http://10.0.0.2:8000/v1/", ""),
        ("d", "http://10.0.0.2:8000/v1", "LAB_KEY"),
        ("e", "https://api.example.org/v1", "OPENAI_API_KEY"),
    ]
    for name, url, key in rows:
        OldArm.objects.create(
            study=study, name=name, endpoint_url=url, api_key_env=key, model_name=name
        )
    try:
        executor = MigrationExecutor(connection)
        executor.migrate([("studies", "0011_arm_endpoint")])
        new = executor.loader.project_state([("studies", "0011_arm_endpoint")]).apps
        arms = new.get_model("studies", "Arm").objects.select_related("endpoint").order_by("name")
        moved = {
            arm.name: (
                arm.endpoint.name,
                arm.endpoint.kind,
                arm.endpoint.api_key_env,
                list(arm.endpoint.replicas.values_list("url", flat=True)),
            )
            for arm in arms
        }
        engine = django_settings.PARLEY_ENGINE_URL.rstrip("/")
        assert moved == {
            "a": ("default", "embedded", "", [engine]),
            "b": ("10.0.0.2:8000", "vllm", "", ["http://10.0.0.2:8000/v1"]),
            "c": ("10.0.0.2:8000", "vllm", "", ["http://10.0.0.2:8000/v1"]),
            "d": ("10.0.0.2:8000 (LAB_KEY)", "hosted", "LAB_KEY", ["http://10.0.0.2:8000/v1"]),
            "e": (
                "api.example.org (OPENAI_API_KEY)",
                "hosted",
                "OPENAI_API_KEY",
                ["https://api.example.org/v1"],
            ),
        }
        # and back: each arm gets its endpoint's URL and key variable again
        executor = MigrationExecutor(connection)
        executor.migrate(before)
        back = executor.loader.project_state(before).apps.get_model("studies", "Arm")
        assert list(
            back.objects.order_by("name").values_list("name", "endpoint_url", "api_key_env")
        ) == [(name, url.rstrip("/"), key) for name, url, key in rows]
    finally:
        MigrationExecutor(connection).migrate(
            MigrationExecutor(connection).loader.graph.leaf_nodes()
        )


def test_an_endpoint_added_in_the_admin_is_checked_at_once(admin_client, engine):
    dead = dead_url()
    form = {
        "name": "lab",
        "kind": "vllm",
        "api_key_env": "",
        "replicas-TOTAL_FORMS": "2",
        "replicas-INITIAL_FORMS": "0",
        "replicas-MIN_NUM_FORMS": "1",
        "replicas-MAX_NUM_FORMS": "1000",
        "replicas-0-url": engine.url,
        "replicas-0-position": "0",
        "replicas-1-url": dead,
        "replicas-1-position": "1",
    }
    response = admin_client.post(reverse("admin:agents_modelendpoint_add"), form)
    assert response.status_code == 302, response.context["adminform"].form.errors
    endpoint = ModelEndpoint.objects.get(name="lab")
    assert [(r.url, r.status) for r in endpoint.replica_list()] == [
        (engine.url, "up"),
        (dead, "down"),
    ]
    form["name"], form["api_key_env"] = "keyed", "sk-live-123"  # a key, not a variable's name
    response = admin_client.post(reverse("admin:agents_modelendpoint_add"), form)
    assert response.status_code == 200 and not ModelEndpoint.objects.filter(name="keyed")
