"""An annotation study's analysis from the database: the run (the chat report on conversations
by group, alpha, judged-human rates), and its ratings as CSV and JSON, one row per rating,
raters numbered and never named."""

import json

import pytest

from studies.annotation.analysis import ratings_csv, ratings_json
from studies.annotation.assignment import assign
from studies.models import AnalysisRun, AnnotationSetup, Participant, RatedConversation
from studies.participation import rating
from studies.research.analysis_runs import compute
from tests.support.studies import GOOD_ANSWERS, make_study

pytestmark = pytest.mark.django_db


def rated_study(raters=4, attention="2"):
    study = make_study(slug="rate", arms=("raters",))
    AnnotationSetup.objects.create(
        study=study, raters_per_conversation=raters, conversations_per_rater=4
    )
    for source, arm, simulator in [("person", "base", ""), ("simulator", "base", "vs")]:
        for i in range(2):
            RatedConversation.objects.create(
                study=study,
                source=source,
                arm=arm,
                simulator=simulator,
                transcript=[{"speaker": "user", "text": f"{source} {i}"}],
            )
    for r in range(raters):
        p = Participant.objects.create(
            study=study,
            arm=study.arms.get(),
            prolific_pid=f"PID{r}SECRET",
            prolific_study_id="S",
            prolific_session_id=f"s{r}",
            status=Participant.Status.RATING,
        )
        for a in assign(p):
            person = a.conversation.source == "person"
            answers = {
                **GOOD_ANSWERS,
                "attn": attention,
                "helpful": str(5 + person + r % 2),
                "real_person": "real" if person else "simulated",
                "realism_confidence": "3",
            }
            assert rating.submit(p, a.position, answers) == {}
    return study


def test_the_run_reports_groups_agreement_and_realism():
    study = rated_study()
    run = compute(AnalysisRun.objects.create(study=study))
    assert run.status == AnalysisRun.Status.DONE, run.error
    results = run.results
    assert [a["name"] for a in results["arms"]] == ["base · people", "base · vs"]
    assert {c["measure"] for c in results["comparisons"]} == {"helpful", "frustration", "donation"}
    annotation = results["annotation"]
    assert annotation["conversations"] == 4 and annotation["ratings"] == 16
    assert annotation["realism"]["by_source"]["people"]["rate"] == 1
    assert annotation["realism"]["by_source"]["vs"]["rate"] == 0
    assert "helpful" in annotation["agreement"]
    assert run.figures and run.inputs["ratings"] == 16


def test_a_missed_attention_item_marks_the_rater():
    study = rated_study(raters=1, attention="5")
    assert Participant.objects.get(study=study).attention_passed is False


def test_ratings_export_one_row_per_rating_with_raters_numbered():
    study = rated_study()
    text = ratings_csv(study)
    lines = text.strip().splitlines()
    assert len(lines) == 1 + 16 and lines[0].startswith("conversation,rater,source,arm")
    assert "SECRET" not in text and "SECRET" not in ratings_json(study)
    rows = json.loads(ratings_json(study))["ratings"]
    assert {r["rater"] for r in rows} == {1, 2, 3, 4}


def test_the_run_page_shows_agreement_and_realism(admin_client):
    from django.urls import reverse

    run = compute(AnalysisRun.objects.create(study=rated_study()))
    page = admin_client.get(reverse("admin:studies_analysisrun_change", args=[run.pk]))
    html = page.content.decode()
    assert page.status_code == 200 and "Raters: agreement and realism" in html
    assert "Krippendorff" in html and "judged a real person" in html and "base · vs" in html


def test_the_study_page_downloads_ratings_for_those_who_may_read_participants(admin_client, client):
    from django.contrib.auth.models import Permission, User
    from django.urls import reverse

    study = rated_study()
    url = reverse("admin:studies_study_ratings", args=[study.pk, "csv"])
    response = admin_client.get(url)
    assert response.status_code == 200 and response.content.decode().count("\n") == 17
    assert (
        admin_client.get(reverse("admin:studies_study_ratings", args=[study.pk, "xml"])).status_code
        == 404
    )
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_study"))
    client.force_login(viewer)
    assert client.get(url).status_code == 403  # the study, not what participants gave


def test_the_sim_to_real_report_gains_what_raters_said_about_the_studys_conversations():
    from studies.analysis.sim2real import build_sim2real, format_sim2real
    from studies.annotation.analysis import sim2real_annotation

    study = rated_study()
    origin = make_study(slug="origin", arms=("base",))
    study.rated_conversations.update(origin_study=origin)
    arms = [
        {
            "name": "base",
            "human": {"outcome": {"mean": 0.5}},
            "simulated": {"reward": {"mean": 0.4}},
        }
    ]
    [entry] = sim2real_annotation(origin, arms)
    assert entry["study"] == "rate" and entry["ratings"] == 16 and entry["quality"] == "helpful"
    assert set(entry["arms"]["base"]) == {"people", "vs"}
    assert entry["arms"]["base"]["vs"]["realism"]["rate"] == 0
    assert sim2real_annotation(make_study(slug="unrated"), arms) == []
    text = format_sim2real({**build_sim2real([], 0.95), "annotation": [entry]})
    assert "rated in annotation study rate (helpful)" in text and "base, vs:" in text


def test_the_command_line_reads_back_exactly_the_answers_the_export_wrote(tmp_path):
    """The export's columns before the answers are the ones the command line sets aside
    (RATING_COLUMNS, declared once): no fixed column is read as an answer, no answer is lost."""
    from studies.analysis.annotation_cli import read_ratings

    study = rated_study()
    path = tmp_path / "ratings.csv"
    path.write_text(ratings_csv(study))
    exported = json.loads(ratings_json(study))["ratings"]
    read = read_ratings(str(path))
    assert len(read) == len(exported)
    keys = set().union(*(r["answers"] for r in exported))
    assert {k for r in read for k in r["answers"]} == keys


def test_the_command_line_reads_the_ratings_csv_and_gives_the_runs_numbers(tmp_path, capsys):
    from studies.analysis.annotation_cli import main

    study = rated_study()
    path = tmp_path / "ratings.csv"
    path.write_text(ratings_csv(study))
    assert (
        main(
            [
                "--ratings",
                str(path),
                "--scales",
                "helpful=7,frustration=7,donation=0",
                "--reverse",
                "frustration",
                "--json",
            ]
        )
        == 0
    )
    printed = json.loads(capsys.readouterr().out)
    run = compute(AnalysisRun.objects.create(study=study))
    assert printed["comparisons"] == run.results["comparisons"]
    assert printed["annotation"]["realism"] == json.loads(
        json.dumps(run.results["annotation"]["realism"])
    )
    assert main(["--ratings", str(path), "--scales", "helpful=7"]) == 0
    assert "judged a real person, vs: 0 of 8" in capsys.readouterr().out
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    assert main(["--ratings", str(tmp_path / "other.csv"), "--scales", "helpful=7"]) == 1
    assert "not a ratings CSV" in capsys.readouterr().err


def test_one_conversation_rated_twice_says_alpha_is_undefined_and_why(
    admin_client, tmp_path, capsys
):
    from django.urls import reverse

    from studies.analysis.annotation_cli import main

    study = make_study(slug="once", arms=("raters",))
    AnnotationSetup.objects.create(
        study=study, raters_per_conversation=2, conversations_per_rater=1
    )
    RatedConversation.objects.create(study=study, source="person", transcript=[])
    for r, helpful in enumerate(["6", "3"]):
        p = Participant.objects.create(
            study=study,
            arm=study.arms.get(),
            prolific_pid=f"ONCE{r}",
            prolific_study_id="S",
            prolific_session_id=f"o{r}",
            status=Participant.Status.RATING,
        )
        (a,) = assign(p)
        answers = {
            **GOOD_ANSWERS,
            "helpful": helpful,
            "real_person": "real",
            "realism_confidence": "3",
        }
        assert rating.submit(p, a.position, answers) == {}
    run = compute(AnalysisRun.objects.create(study=study))
    helpful = run.results["annotation"]["agreement"]["helpful"]
    why = "undefined: needs at least two conversations each rated by two or more raters"
    assert helpful["alpha"] is None and helpful["note"].startswith(why)
    html = admin_client.get(reverse("admin:studies_analysisrun_change", args=[run.pk]))
    assert why in html.content.decode() and "0.000 [0.000, 0.000]" not in html.content.decode()
    path = tmp_path / "ratings.csv"
    path.write_text(ratings_csv(study))
    assert main(["--ratings", str(path), "--scales", "helpful=7"]) == 0
    printed = capsys.readouterr().out
    assert f"Krippendorff's alpha (ordinal), helpful: {why}" in printed and "0.000" not in printed


def test_an_annotation_plan_is_frozen_before_rating_and_its_run_is_confirmatory():
    from studies.research.preregistration import freeze

    study = make_study(slug="planned", arms=("raters",))
    AnnotationSetup.objects.create(
        study=study, raters_per_conversation=4, conversations_per_rater=4
    )
    for source, simulator in [("person", ""), ("simulator", "vs")]:
        for _ in range(2):
            RatedConversation.objects.create(
                study=study, source=source, arm="base", simulator=simulator, transcript=[]
            )
    plan = freeze(study, by="tester")
    assert plan.plan["analysis"]["arms"] == ["base · people", "base · vs"]
    assert plan.plan["analysis"]["pairs"] == "all"
    for r in range(4):  # raters come after the freeze
        p = Participant.objects.create(
            study=study,
            arm=study.arms.get(),
            prolific_pid=f"P{r}",
            prolific_study_id="S",
            prolific_session_id=f"s{r}",
            status=Participant.Status.RATING,
        )
        for a in assign(p):
            answers = {
                **GOOD_ANSWERS,
                "helpful": str(3 + r % 3),
                "real_person": "real",
                "realism_confidence": "3",
            }
            assert rating.submit(p, a.position, answers) == {}
    run = compute(AnalysisRun.objects.create(study=study))
    assert run.status == AnalysisRun.Status.DONE, run.error
    assert run.results["preregistration"]["analysis"] == "confirmatory"
