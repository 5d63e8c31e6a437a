"""The sim-to-real report's behaviour section from a study's database (issue 40 point 7): a P4G
study whose participants wrote known turns, one checkpoint's run with two held-out simulators
whose stored conversations are known (one talks as the people did, one does not). The report,
the analysis run's page, its CSV and figure, and `manage.py sim2real --out` say which one
behaves most like the people, with the BDI and shares as constructed."""

import csv
import io
import json
from pathlib import Path

import pytest
from django.core.management import call_command
from django.urls import reverse

from agents.behaviour.space import BehaviourSpace
from agents.models import Checkpoint
from agents.paths import base_model_dir
from studies.models import AnalysisRun, Message, SimulatorEvaluation
from studies.research import analysis_runs, simulator_evaluations
from studies.setup.scenario_pools import import_pool
from tests.studies.analysis.test_sim2real_behaviour import KINDS, embed, turns
from tests.support.studies import finish, make_study

# what each participant wrote: eight people, five turns each; 40% asks, 20% each other kind
WROTE = [
    ["ask a", "ask b", "refuse a", "question a", "agree a"],
    ["ask c", "ask d", "refuse b", "question b", "agree b"],
] * 4
PANEL = [{"name": "like-people", "kind": "scripted"}, {"name": "refuser", "kind": "scripted"}]
SAYS = {  # one conversation per scenario; each simulator's user turns over both
    "like-people": [turns("ask", 2) + turns("refuse", 1) + turns("question", 1) + ["agree x"]] * 2,
    "refuser": [turns("refuse", 5)] * 2,
}


@pytest.fixture
def constructed_embedder(monkeypatch, settings):
    """The report's embedder, constructed (each kind of turn its own direction), and four
    clusters; the default, SmolLM2 by PARLEY_BASE_MODEL, is tested below on its own."""
    settings.PARLEY_SIM2REAL_CLUSTERS = 4
    asked = []

    def load(folder):
        asked.append(folder)
        return embed

    monkeypatch.setattr(simulator_evaluations, "behaviour_embedder", load)
    return asked


def study_with_people_and_simulators():
    study = make_study(slug="alike", domain="p4g")
    import_pool(study, "p4g", count=2, seed=1)
    scenarios = list(study.scenarios.order_by("id"))
    Checkpoint.objects.create(
        name="run-step8", path="/nowhere", domain="p4g", manifest={"config": {"heldout": PANEL}}
    )
    arm = study.arms.get(name="a")
    study.arms.update(model_name="run-step8")
    answers = {"helpful": "5", "frustration": "3", "attn": "2", "donation": "1"}
    for i, wrote in enumerate(WROTE):
        p = finish(study, f"p{i}", answers, arm="a" if i % 2 else "b", text=wrote[0])
        for seq, text in enumerate(wrote[1:], 100):  # the rest of what they wrote
            Message.objects.create(conversation=p.conversation, seq=seq, role="user", content=text)
    # one who missed the attention check: excluded by the study's rule, their turns left out
    p = finish(study, "inattentive", {**answers, "attn": "5"}, arm="a", text="refuse a")
    for seq in range(100, 110):
        Message.objects.create(conversation=p.conversation, seq=seq, role="user", content="refuse")
    for name, conversations in SAYS.items():
        for scenario, said in zip(scenarios, conversations, strict=True):
            conversation = [{"role": "assistant", "content": "Hello, would you donate?"}]
            conversation += [{"role": "user", "content": t} for t in said]
            SimulatorEvaluation.objects.create(
                arm=arm,
                checkpoint=Checkpoint.objects.get(name="run-step8"),
                simulator=name,
                scenario=scenario,
                sample=0,
                spec={"name": name},
                success=False,
                reward=0.0,
                conversation=conversation,
            )
    return study


def by_kind(section, shares):
    space = BehaviourSpace.load(Path(section["space"]["folder"]) / section["space"]["key"], embed)
    return {kind: shares[space.assign([f"{kind} y"])[0]] for kind in KINDS}


@pytest.mark.django_db
def test_the_report_says_which_simulator_behaves_like_the_people(
    constructed_embedder, admin_client, tmp_path
):
    study = study_with_people_and_simulators()
    section = simulator_evaluations.study_report(study)["behaviour"]
    assert constructed_embedder == [str(base_model_dir())]  # the default: the base model
    assert section["error"] is None and section["most_like"] == "like-people"
    assert section["people"] == {
        "participants": 8,
        "turns": 40,
        "shares": section["people"]["shares"],
    }
    people = by_kind(section, section["people"]["shares"])
    assert people == pytest.approx({"ask": 0.4, "refuse": 0.2, "question": 0.2, "agree": 0.2})
    like, refuser = section["simulators"]
    assert (like["name"], like["conversations"], like["turns"]) == ("like-people", 2, 10)
    assert by_kind(section, like["shares"]) == pytest.approx(people)
    assert by_kind(section, refuser["shares"])["refuse"] == 1.0
    assert like["bdi"] == 1.0 and refuser["bdi"] == pytest.approx(0.2)
    assert like["jsd"] == pytest.approx(0, abs=1e-9) and refuser["jsd"] > 0.5
    # saved beside the report under the data folder, named in the section
    assert section["space"]["folder"].endswith("sim2real/alike/behaviour_space")

    # the analysis run: its page, its CSV and its figure
    run = AnalysisRun.objects.create(study=study)
    run = analysis_runs.compute(run, {"sim2real": simulator_evaluations.analysis_section})
    assert run.results["sim2real"]["behaviour"]["most_like"] == "like-people"
    page = admin_client.get(reverse("admin:studies_analysisrun_change", args=[run.pk]))
    text = page.content.decode()
    assert "Behaviour beside this study's participants" in text
    assert 'Most like the people: <strong class="most-like">like-people</strong>' in text
    assert '<tr class="most-like"><td>like-people</td><td>2</td><td>10</td><td>1.000</td>' in text
    assert "<td>refuser</td><td>2</td><td>10</td><td>0.200</td>" in text
    assert "<th>people (40 turns)</th><th>like-people</th><th>refuser</th>" in text
    svg = run.figures["sim2real_behaviour"]
    assert "most like them: like-people" in svg and "refuser: BDI 0.20" in svg
    body = admin_client.get(
        reverse("admin:studies_analysisrun_download", args=[run.pk, "csv"])
    ).content.decode()
    rows = list(csv.reader(io.StringIO(body)))
    start = rows.index(["sim-to-real behaviour"])
    assert rows[start + 1] == ["cluster", "people", "like-people", "refuser"]
    assert ["like-people", "like-people", "10", "2", "1"] == rows[start + 8][:5]

    # the command: the text, and --out with the space beside the report
    out = io.StringIO()
    call_command("sim2real", "--study", "alike", "--out", str(tmp_path / "report"), stdout=out)
    assert "most like the people: like-people" in out.getvalue()
    assert "refuser: BDI 0.200" in out.getvalue()
    written = json.loads((tmp_path / "report" / "report.json").read_text())["behaviour"]
    assert written["simulators"] == section["simulators"]
    assert written["space"]["folder"] == str(tmp_path / "report" / "behaviour_space")
    key = written["space"]["key"]
    assert key == section["space"]["key"]  # the same turns and settings: the same space
    assert (tmp_path / "report" / "behaviour_space" / key / "space.json").is_file()
    assert (tmp_path / "report" / "behaviour.csv").read_text().startswith("cluster,people,")
    assert (tmp_path / "report" / "sim2real_behaviour.svg").is_file()


@pytest.mark.django_db
def test_a_study_with_few_turns_says_so_on_the_page(constructed_embedder, admin_client):
    study = study_with_people_and_simulators()
    Message.objects.filter(seq__gte=100).delete()  # one turn each: 8 of the 20 four clusters need
    section = simulator_evaluations.study_report(study)["behaviour"]
    assert section["error"].startswith("too few participant turns to fit a behaviour space: 8")
    assert constructed_embedder == []  # no model loaded for nothing
    run = analysis_runs.compute(
        AnalysisRun.objects.create(study=study),
        {"sim2real": simulator_evaluations.analysis_section},
    )
    text = admin_client.get(reverse("admin:studies_analysisrun_change", args=[run.pk])).content
    assert b"Not compared: too few participant turns" in text
    assert "sim2real_behaviour" not in run.figures


@pytest.mark.model
@pytest.mark.django_db
def test_the_default_embedder_is_the_base_model_folder(base_model, settings, tmp_path):
    """SmolLM2's mean-pooled hidden states, from PARLEY_BASE_MODEL: turns of a sort the people
    wrote are nearer the people than turns of another sort."""
    settings.PARLEY_SIM2REAL_EMBEDDER, settings.PARLEY_SIM2REAL_CLUSTERS = "", 2
    assert simulator_evaluations.space_settings().embedder == str(base_model_dir())
    study = study_with_people_and_simulators()
    Message.objects.filter(conversation__participant__study=study).delete()
    people = [
        "Who runs this charity? How much goes to the children?",
        "Is Save the Children trustworthy? What do they spend it on?",
        "I might give a little, but how do I know it helps?",
        "Where does the money go exactly?",
        "Can I see their reports first?",
    ]
    for p, text in zip(study.participants.all(), people * 2, strict=False):
        Message.objects.create(conversation=p.conversation, seq=1, role="user", content=text)
        Message.objects.create(conversation=p.conversation, seq=2, role="user", content=text[::-1])
    SimulatorEvaluation.objects.filter(simulator="refuser").update(
        conversation=[{"role": "user", "content": "1 2 3 4 5 6 7 8 9 0 " * 3}] * 3
    )
    SimulatorEvaluation.objects.filter(simulator="like-people").update(
        conversation=[{"role": "user", "content": t} for t in people]
        + [{"role": "user", "content": t[::-1]} for t in people]
    )
    section = simulator_evaluations.study_report(study, space_dir=tmp_path)["behaviour"]
    assert section["error"] is None, section["error"]
    assert section["space"]["embedder"] == str(base_model_dir())
    assert section["most_like"] == "like-people", section["simulators"]
