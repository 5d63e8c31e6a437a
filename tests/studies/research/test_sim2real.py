"""The sim-to-real gap report end to end: a P4G study whose arms serve checkpoints of a run with
the real preset's held-out panel (the scripted persuadee types) and a human-like simulator
registered from the study (a column of its own), a real Celery worker playing the missing
conversations on each arm's endpoint (a stub engine: the report, not the model, is under test),
stored evaluations, the analysis page, report.json and `manage.py sim2real`."""

import io
import json
import math
import time

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse
from scipy import stats as scipy_stats
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from agents.domains.p4g.domain import P4GDomain
from agents.models import Checkpoint
from studies.models import AnalysisRun, Item, SimulatorEvaluation
from studies.research import simulator_evaluations
from studies.setup.scenario_pools import import_pool
from tests.support.scripted_server import ScriptedServer
from tests.support.studies import finish, make_study
from training.config import load_config
from training.models import CONFIGS_DIR

# What each arm's model says every turn: a large emotional ask and a small evidence-based one,
# which the scripted persuadee types answer differently.
SAYS = {
    "run-a-step8": "Children are hungry and suffer. Would you donate $2 today?",
    "run-b-step8": "Evidence from audited reports: would you give $0.50?",
}


HUMANLIKE = "gap-humanlike"  # what `imitate_users --study gap` registers
HUMANLIKE_LABEL = "human-like (imitation of study gap)"
PERSON_SAYS = "Hmm, who runs this charity? I might give a little."


class ArmEngine(ScriptedServer):
    """Streams each model's own line, for as many turns as asked; the human-like simulator's
    adapter, asked as the plain simulator asks (not streamed), answers as a person did."""

    def __init__(self, models=("SmolLM2-135M-Instruct", *SAYS, HUMANLIKE)):
        super().__init__([], models=models)

    async def complete(self, request: Request):
        body = await request.json()
        self.requests.append(body)
        if body["model"] == HUMANLIKE and not body.get("stream"):
            message = {"role": "assistant", "content": PERSON_SAYS}
            return JSONResponse(
                {
                    "id": "x",
                    "object": "chat.completion",
                    "model": body["model"],
                    "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                }
            )
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
        domain_input="donation",
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


def humanlike(name, study):
    """A simulator as `imitate_users` registers it (training/tools/imitate.py's manifest)."""
    manifest = {
        "name": name,
        "kind": "simulator",
        "regime": "imitation",
        "base_model": "SmolLM2-135M-Instruct",
        "source": {"study": study},
    }
    return Checkpoint.objects.create(
        name=name, path=f"/nowhere/{name}", regime="imitation", manifest=manifest
    )


def people(study, donations_by_arm):
    """Completed participants per arm with their intended donation and a helpfulness answer."""
    i = 0
    for arm, donations in donations_by_arm.items():
        for donation in donations:
            i += 1
            answers = {
                "helpful": str(3 + i % 4),
                "frustration": "3",
                "attn": "2",
                "donation": "1",
                "intended_donation": str(donation),
            }
            finish(study, f"p{i}", answers, arm=arm)


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
    with ArmEngine() as engine:
        study, panel = study_with_checkpoints(engine.url)
        humanlike(HUMANLIKE, "gap")
        humanlike("pilot-humanlike", "pilot")  # another study's: not a column unless named
        people(study, {"a": [0, 0.5, 1.0], "b": [2, 1.5, 2, 1]})
        # arms x (the run's panel + the human-like simulator) x pool
        assert len(simulator_evaluations.missing(study)) == 2 * (len(panel) + 1) * 2

        admin_client.post(reverse("admin:studies_study_analyse", args=[study.pk]))
        run = wait_for(lambda: AnalysisRun.objects.filter(study=study, status="done").first())
        # The evaluation job runs after the analysis and rewrites the run's section.
        run = wait_for(
            lambda: AnalysisRun.objects.filter(pk=run.pk, results__sim2real__missing=0).first()
        )
        # Named explicitly, a simulator the arm's endpoint does not serve is not played, and
        # the command says why.
        err = io.StringIO()
        call_command(
            "sim2real",
            "--study",
            "gap",
            "--evaluate",
            "--humanlike",
            "pilot-humanlike",
            stdout=io.StringIO(),
            stderr=err,
        )
        assert "human-like simulator 'pilot-humanlike': endpoint" in err.getvalue()
        assert "does not serve pilot-humanlike" in err.getvalue()
    asked = [r for r in engine.requests if r["model"] == HUMANLIKE]
    assert asked and all(r["messages"][0]["role"] == "system" for r in asked)
    everything = list(SimulatorEvaluation.objects.filter(arm__study=study))
    assert len(everything) == 2 * (len(panel) + 1) * 2
    rows = [r for r in everything if r.simulator != HUMANLIKE]
    assert {r.simulator for r in rows} == set(panel)
    domain = P4GDomain()
    for row in everything:  # each conversation is the arm's model against the simulator
        said = {m["content"] for m in row.conversation if m["role"] == "assistant"}
        assert SAYS[row.checkpoint.name] in said
        assert row.reward == domain.score(row.conversation, {}, row.end_reason).reward
    played_by_humanlike = [r for r in everything if r.simulator == HUMANLIKE]
    for row in played_by_humanlike:  # the person-like line came from its adapter, by name
        assert PERSON_SAYS in [m["content"] for m in row.conversation if m["role"] == "user"]
        assert row.spec["humanlike"] and row.spec["imitates"] == "gap"
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
    # the human-like column: its own numbers and its own gap, beside the panel's
    (column,) = section["humanlike"]
    assert column["name"] == HUMANLIKE and column["label"] == HUMANLIKE_LABEL
    assert column["ranking"]["arms"] == 2  # the arms ranked by it, against people
    for name in ("a", "b"):
        (like,) = by_arm[name]["humanlike"]
        rewards = [r.reward for r in played_by_humanlike if r.arm.name == name]
        assert like["label"] == HUMANLIKE_LABEL and like["n"] == len(rewards) == 2
        assert like["reward"]["mean"] == pytest.approx(sum(rewards) / 2)
        assert like["gap"]["reward"]["diff"] == pytest.approx(
            sum(rewards) / 2 - by_arm[name]["human"]["outcome"]["mean"]
        )
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
    assert f"gap in reward ({HUMANLIKE_LABEL})" in text
    assert f"Ranking by {HUMANLIKE_LABEL} (reward)" in text
    assert "sim2real" in run.figures and run.figures["sim2real"].lstrip().startswith("<?xml")
    assert f"{HUMANLIKE_LABEL} (reward)" in run.figures["sim2real"]
    report = json.loads(
        admin_client.get(
            reverse("admin:studies_analysisrun_download", args=[run.pk, "json"])
        ).content
    )
    assert report["sim2real"]["arms"] == section["arms"]
    assert report["sim2real"]["humanlike"] == section["humanlike"]

    listed = admin_client.get(reverse("admin:studies_simulatorevaluation_changelist"))
    assert listed.status_code == 200 and "run-b-step8" in listed.content.decode()

    # Stored conversations are not played again, and the command line reads the same report.
    assert simulator_evaluations.evaluate_missing(study) == {"played": 0, "failed": []}
    out = io.StringIO()
    call_command("sim2real", "--study", "gap", "--json", stdout=out)
    assert json.loads(out.getvalue())["arms"] == section["arms"]
    out = io.StringIO()
    call_command("sim2real", "--study", "gap", stdout=out)
    assert "gap in reward (simulators - people)" in out.getvalue()
    assert f"gap in reward ({HUMANLIKE_LABEL} - people)" in out.getvalue()

    # Other columns on request: another study's simulator (not played here yet), or none.
    out = io.StringIO()
    call_command(
        "sim2real", "--study", "gap", "--json", "--humanlike", "pilot-humanlike", stdout=out
    )
    named = json.loads(out.getvalue())
    assert [(h["name"], h["label"]) for h in named["humanlike"]] == [
        ("pilot-humanlike", "human-like (imitation of study pilot)")
    ]
    assert named["arms"][0]["humanlike"][0]["n"] == 0 and named["missing"] == 2 * 2
    out = io.StringIO()
    call_command("sim2real", "--study", "gap", "--json", "--no-humanlike", stdout=out)
    bare = json.loads(out.getvalue())
    assert bare["humanlike"] == [] and bare["arms"][0]["humanlike"] == []
    assert bare["arms"][0]["simulated"] == section["arms"][0]["simulated"]
    with pytest.raises(CommandError, match="no human-like simulator 'nope' .*gap-humanlike"):
        call_command("sim2real", "--study", "gap", "--humanlike", "nope")


@pytest.mark.django_db
def test_unknown_study_is_a_clear_error():
    make_study(slug="known")
    with pytest.raises(CommandError, match="No study 'nope'; studies: known"):
        call_command("sim2real", "--study", "nope", "--json")


@pytest.mark.django_db
def test_arms_without_a_checkpoint_or_people_are_said_so():
    study = make_study(slug="bare", domain="p4g")
    import_pool(study, "p4g", count=1)
    report = simulator_evaluations.study_report(study)
    assert report["missing"] == 0
    assert any("no registered checkpoint" in n for n in report["notes"])
    assert report["ranking"]["tau"] is None and "at least 2 arms" in report["ranking"]["note"]


@pytest.mark.django_db
def test_an_open_chat_study_has_no_gap_to_report():
    report = simulator_evaluations.study_report(make_study(slug="chat"))
    assert report["errors"] == [
        "an open-chat study has no task: no outcome to set simulators against people"
    ]
    assert report["arms"] == [] and report["missing"] == 0


@pytest.mark.django_db(transaction=True)
def test_a_real_checkpoint_on_the_embedded_engine_meets_the_scripted_panel(
    base_model, checkpoints, tmp_path
):
    """The real path once: SmolLM2 with a LoRA checkpoint, served by the embedded engine, in
    conversation with two of the preset's scripted held-out types and with a human-like
    simulator fine-tuned on the study's one person (a real SmolLM2 adapter, registered while
    the engine runs), played by the command."""
    from agents.models import adapters_dir
    from agents.serving.launch import start_engine, stop_engine
    from tests.support.processes import CHECKPOINT_NAME

    checkpoint = Checkpoint.register(next(checkpoints.glob("*/checkpoints/step-*")))
    url, engine = start_engine(base_model, adapters=adapters_dir())
    try:
        played_against(url, checkpoint, CHECKPOINT_NAME, tmp_path)
    finally:
        stop_engine(engine)


def played_against(url, checkpoint, name, tmp_path):
    study = make_study(slug="real", domain="p4g", engine=url, arms=("tuned", "base"))
    import_pool(study, "p4g", count=1, seed=2)
    config = load_config(CONFIGS_DIR / "p4g-single-cpu.toml").to_dict()
    config["heldout"] = config["heldout"][:2]  # two scripted types: a short run on a CPU
    config["max_turns"] = 4  # and short conversations
    checkpoint.manifest = {**checkpoint.manifest, "config": config}
    checkpoint.save()
    study.arms.filter(name="tuned").update(model_name=name, max_tokens=16)
    # One finished person, and the simulator `imitate_users` learns from them.
    answers = {"helpful": "5", "frustration": "3", "attn": "2", "donation": "1"}
    finish(study, "person", answers, text="Who runs this charity? I might give a little.")
    call_command(
        "imitate_users",
        "--study",
        "real",
        "--epochs",
        "1",
        "--out",
        str(tmp_path / "real-humanlike"),
        stdout=io.StringIO(),
        stderr=io.StringIO(),
    )

    out = io.StringIO()
    call_command("sim2real", "--study", "real", "--json", "--evaluate", stdout=out)
    report = json.loads(out.getvalue())
    rows = SimulatorEvaluation.objects.filter(arm__study=study)
    assert rows.count() == 3 and report["missing"] == 0
    for row in rows:  # the model's own words, then the simulator's answers, scored
        assert row.conversation[1]["role"] == "user"  # the persuader greets, the user answers
        assert any(m["role"] == "assistant" and m["content"] for m in row.conversation[2:])
        assert row.reward == P4GDomain().score(row.conversation, {}, row.end_reason).reward
    like = rows.get(simulator="real-humanlike")  # SmolLM2 with the adapter, by its name
    assert like.spec["model"] == "real-humanlike" and like.spec["endpoint"] == [url]
    assert all(m["content"].strip() for m in like.conversation if m["role"] == "user")
    tuned, base = report["arms"]
    assert tuned["simulated"]["n"] == 2 and base["simulated"]["n"] == 0
    assert [(h["name"], h["label"]) for h in report["humanlike"]] == [
        ("real-humanlike", "human-like (imitation of study real)")
    ]
    assert tuned["humanlike"][0]["n"] == 1 and tuned["humanlike"][0]["reward"]["mean"] == (
        like.reward
    )
    assert any("'base' asks for 'SmolLM2-135M-Instruct'" in n for n in report["notes"])
    assert "at least 2 arms" in report["ranking"]["note"]
