"""The sim-to-real gap report end to end: a P4G study whose arms serve checkpoints of a run with
the real preset's held-out panel (the scripted persuadee types), a real Celery worker playing
the missing conversations on each arm's endpoint (a stub engine: the report, not the model, is
under test), stored evaluations, the analysis page, report.json and `manage.py sim2real`."""

import io
import json
import math
import time

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse
from scipy import stats as scipy_stats
from starlette.requests import Request
from starlette.responses import StreamingResponse

from agents.domains.p4g.domain import P4GDomain
from agents.models import Checkpoint
from studies import flow, sim2real
from studies.models import AnalysisRun, Item, Participant, SimulatorEvaluation
from studies.pools import import_pool
from tests.scripted_server import ScriptedServer
from tests.studies.conftest import make_study, prolific
from training.config import load_config
from training.models import CONFIGS_DIR

# What each arm's model says every turn: a large emotional ask and a small evidence-based one,
# which the scripted persuadee types answer differently.
SAYS = {
    "run-a-step8": "Children are hungry and suffer. Would you donate $2 today?",
    "run-b-step8": "Evidence from audited reports: would you give $0.50?",
}


class ArmEngine(ScriptedServer):
    """Streams each model's own line, for as many turns as asked."""

    async def complete(self, request: Request):
        body = await request.json()
        self.requests.append(body)
        reply = {"content": SAYS.get(body["model"], "Hello.")}
        return StreamingResponse(
            self.chunks(body["model"], reply, True), media_type="text/event-stream"
        )


def study_with_checkpoints(engine_url):
    study = make_study(slug="gap", domain="p4g", engine=engine_url, target_per_arm=50)
    Item.objects.create(
        questionnaire=study.questionnaire,
        order=5,
        key="intended_donation",
        prompt="How much of your $2 bonus will you donate?",
        kind="number",
        min_value=0,
        max_value=2,
    )
    import_pool(study, "p4g", count=2, seed=1)
    # The manifest a training run writes: its config, with the preset's held-out panel.
    config = load_config(CONFIGS_DIR / "p4g-single-cpu.toml").to_dict()
    for arm, name in zip(study.arms.order_by("order"), SAYS, strict=True):
        Checkpoint.objects.create(
            name=name, path=f"/nowhere/{name}", domain="p4g", manifest={"config": config}
        )
        arm.model_name = name
        arm.max_tokens = 40
        arm.save()
    return study, [spec["name"] for spec in config["heldout"]]


def people(study, donations_by_arm):
    """Completed participants per arm with their intended donation and a helpfulness answer."""
    i = 0
    for arm, donations in donations_by_arm.items():
        for donation in donations:
            i += 1
            p, _ = flow.arrive(study, prolific(pid=f"p{i}"))
            Participant.objects.filter(pk=p.pk).update(arm=study.arms.get(name=arm))
            p.refresh_from_db()
            flow.give_consent(p, True)
            flow.store_user_message(p, f"m{i}", "hi")
            flow.end_chat(p)
            answers = {
                "helpful": str(3 + i % 4),
                "frustration": "3",
                "attn": "2",
                "donation": "1",
                "intended_donation": str(donation),
            }
            assert flow.submit_questionnaire(p, answers) == {}


def wait_for(check, seconds=120):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.5)
    pytest.fail("timed out")


@pytest.mark.django_db(transaction=True)
def test_gap_report_from_a_real_worker_on_the_page_in_json_and_on_the_command_line(
    celery_worker, admin_client
):
    with ArmEngine([]) as engine:
        study, panel = study_with_checkpoints(engine.url)
        people(study, {"a": [0, 0.5, 1.0], "b": [2, 1.5, 2, 1]})
        assert len(sim2real.missing(study)) == 2 * len(panel) * 2  # arms x simulators x pool

        admin_client.post(reverse("admin:studies_study_analyse", args=[study.pk]))
        run = wait_for(lambda: AnalysisRun.objects.filter(study=study, status="done").first())
        # The evaluation job runs after the analysis and rewrites the run's section.
        run = wait_for(
            lambda: AnalysisRun.objects.filter(pk=run.pk, results__sim2real__missing=0).first()
        )
    rows = list(SimulatorEvaluation.objects.filter(arm__study=study))
    assert len(rows) == 2 * len(panel) * 2
    assert {r.simulator for r in rows} == set(panel)
    domain = P4GDomain()
    for row in rows:  # each conversation is the arm's model against the scripted type
        said = {m["content"] for m in row.conversation if m["role"] == "assistant"}
        assert SAYS[row.checkpoint.name] in said
        assert row.reward == domain.score(row.conversation, {}, row.end_reason).reward
    section = run.results["sim2real"]
    by_arm = {a["name"]: a for a in section["arms"]}
    for name in ("a", "b"):
        rewards = [r.reward for r in rows if r.arm.name == name]
        assert by_arm[name]["simulated"]["n"] == len(panel) * 2
        assert by_arm[name]["simulated"]["reward"]["mean"] == pytest.approx(
            sum(rewards) / len(rewards)
        )
        assert by_arm[name]["checkpoint"] == f"run-{name}-step8"
    assert by_arm["a"]["human"]["outcome"]["mean"] == pytest.approx((0 + 0.25 + 0.5) / 3)
    assert by_arm["b"]["human"]["outcome"]["mean"] == pytest.approx((1 + 0.75 + 1 + 0.5) / 4)
    assert by_arm["b"]["human"]["success"]["mean"] == 1.0
    assert by_arm["a"]["gap"]["reward"]["diff"] == pytest.approx(
        by_arm["a"]["simulated"]["reward"]["mean"] - by_arm["a"]["human"]["outcome"]["mean"]
    )
    assert set(by_arm["a"]["likert"]) == {"helpful", "frustration"}
    expected = scipy_stats.kendalltau(
        [by_arm[n]["simulated"]["reward"]["mean"] for n in "ab"],
        [by_arm[n]["human"]["outcome"]["mean"] for n in "ab"],
    )
    if math.isnan(expected.statistic):
        assert section["ranking"]["tau"] is None
    else:
        assert section["ranking"]["tau"] == pytest.approx(expected.statistic)

    page = admin_client.get(reverse("admin:studies_analysisrun_change", args=[run.pk]))
    text = page.content.decode()
    assert "Sim-to-real gap" in text and "Kendall" in text and "run-a-step8" in text
    assert "sim2real" in run.figures and run.figures["sim2real"].lstrip().startswith("<?xml")
    report = json.loads(
        admin_client.get(
            reverse("admin:studies_analysisrun_download", args=[run.pk, "json"])
        ).content
    )
    assert report["sim2real"]["arms"] == section["arms"]

    listed = admin_client.get(reverse("admin:studies_simulatorevaluation_changelist"))
    assert listed.status_code == 200 and "run-b-step8" in listed.content.decode()

    # Stored conversations are not played again, and the command line reads the same report.
    assert sim2real.evaluate_missing(study) == {"played": 0, "failed": []}
    out = io.StringIO()
    call_command("sim2real", "--study", "gap", "--json", stdout=out)
    assert json.loads(out.getvalue())["arms"] == section["arms"]
    out = io.StringIO()
    call_command("sim2real", "--study", "gap", stdout=out)
    assert "gap in reward (simulators - people)" in out.getvalue()


@pytest.mark.django_db
def test_unknown_study_is_a_clear_error():
    make_study(slug="known")
    with pytest.raises(CommandError, match="No study 'nope'; studies: known"):
        call_command("sim2real", "--study", "nope", "--json")


@pytest.mark.django_db
def test_arms_without_a_checkpoint_or_people_are_said_so():
    study = make_study(slug="bare", domain="p4g")
    import_pool(study, "p4g", count=1)
    report = sim2real.study_report(study)
    assert report["missing"] == 0
    assert any("no registered checkpoint" in n for n in report["notes"])
    assert report["ranking"]["tau"] is None and "at least 2 arms" in report["ranking"]["note"]


@pytest.mark.django_db
def test_an_open_chat_study_has_no_gap_to_report():
    report = sim2real.study_report(make_study(slug="chat"))
    assert report["errors"] == [
        "an open-chat study has no task: no outcome to set simulators against people"
    ]
    assert report["arms"] == [] and report["missing"] == 0


@pytest.mark.django_db(transaction=True)
def test_a_real_checkpoint_on_the_embedded_engine_meets_the_scripted_panel(base_model, checkpoints):
    """The real path once: SmolLM2 with a LoRA checkpoint, served by the embedded engine, in
    conversation with two of the preset's scripted held-out types, played by the command."""
    from agents.models import adapters_dir
    from agents.serving.launch import start_engine, stop_engine
    from tests.conftest import CHECKPOINT_NAME

    checkpoint = Checkpoint.register(next(checkpoints.glob("*/checkpoints/step-*")))
    url, engine = start_engine(base_model, adapters=adapters_dir())
    try:
        played_against(url, checkpoint, CHECKPOINT_NAME)
    finally:
        stop_engine(engine)


def played_against(url, checkpoint, name):
    study = make_study(slug="real", domain="p4g", engine=url, arms=("tuned", "base"))
    import_pool(study, "p4g", count=1, seed=2)
    config = load_config(CONFIGS_DIR / "p4g-single-cpu.toml").to_dict()
    config["heldout"] = config["heldout"][:2]  # two scripted types: a short run on a CPU
    checkpoint.manifest = {**checkpoint.manifest, "config": config}
    checkpoint.save()
    study.arms.filter(name="tuned").update(model_name=name, max_tokens=16)

    out = io.StringIO()
    call_command("sim2real", "--study", "real", "--json", "--evaluate", stdout=out)
    report = json.loads(out.getvalue())
    rows = SimulatorEvaluation.objects.filter(arm__study=study)
    assert rows.count() == 2 and report["missing"] == 0
    for row in rows:  # the model's own words, then the scripted type's decision, scored
        assert row.conversation[1]["role"] == "user"  # the persuader greets, the type answers
        assert any(m["role"] == "assistant" and m["content"] for m in row.conversation[2:])
        assert row.reward == P4GDomain().score(row.conversation, {}, row.end_reason).reward
    tuned, base = report["arms"]
    assert tuned["simulated"]["n"] == 2 and base["simulated"]["n"] == 0
    assert any("'base' asks for 'SmolLM2-135M-Instruct'" in n for n in report["notes"])
    assert "at least 2 arms" in report["ranking"]["note"]
