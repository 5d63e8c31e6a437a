"""Every CSV parley writes: integers as integers, real numbers as they are, no cell a
spreadsheet runs as a formula (CSV injection), negative numbers still numbers."""

import csv
import io
import re
from decimal import Decimal

import numpy as np
import pandas as pd
import pytest
from django.urls import reverse
from hypothesis import given, settings
from hypothesis import strategies as st

from studies.analysis import csvfile
from studies.chat.agent_turn import store_turn_message
from studies.models import AnalysisRun, Message, Participant
from studies.participation.arrive import arrive
from studies.participation.chat_turn import end_chat, store_user_message
from studies.participation.consent import give_consent
from studies.participation.questionnaire import submit_questionnaire
from studies.research import analysis_runs
from tests.support.processes import REPO
from tests.support.studies import GOOD_ANSWERS, make_study, prolific

ATTACKS = ["=1+2", "+SUM(A1)", "-2+3", "@SUM(A1)", "\tx", "\r=x", '=HYPERLINK("http://x")']


@pytest.mark.parametrize(
    ("value", "written"),
    [
        (6.0, "6"),
        (np.float64(2.0), "2"),
        (np.int64(4), "4"),
        (7, "7"),
        (6.25, "6.25"),
        (0.1, "0.1"),
        (-3, "-3"),  # a negative number is data, not a formula
        (-0.5, "-0.5"),
        (-2.0, "-2"),
        (Decimal("1.50"), "1.5"),
        (None, ""),
        (float("nan"), ""),
        (True, "True"),
        ("fine", "fine"),
        ("a-b", "a-b"),
        ("", ""),
    ],
)
def test_cells_keep_numbers_numeric(value, written):
    assert csvfile.cell(value) == written


@pytest.mark.parametrize("text", [*ATTACKS, "-1", "+44 20 7946 0000", "@home"])
def test_text_that_a_spreadsheet_would_run_is_neutralised(text):
    assert csvfile.cell(text) == "'" + text
    (row,) = csv.reader(io.StringIO(csvfile.to_text([["x", text]]), newline=""))
    assert row == ["x", "'" + text]


def test_a_dataframe_goes_through_the_same_cells():
    table = pd.DataFrame(
        {"arm": ["=evil", "b"], "helpful": [6.0, None], "outcome": [-0.5, 0.25], "ok": [True, None]}
    )
    rows = list(csv.reader(io.StringIO(csvfile.table_text(table))))
    assert rows == [
        ["arm", "helpful", "outcome", "ok"],
        ["'=evil", "6", "-0.5", "True"],
        ["b", "", "0.25", ""],
    ]


def test_no_csv_is_written_outside_the_shared_writer():
    """csv.writer, DictWriter and DataFrame.to_csv appear only in studies/analysis/csvfile.py."""
    writers = re.compile(r"csv\.writer\(|csv\.DictWriter\(|\.to_csv\(")
    offenders = [
        str(path.relative_to(REPO))
        for folder in ("agents", "training", "studies", "platform", "bench")
        for path in (REPO / folder).rglob("*.py")
        if writers.search(path.read_text(encoding="utf-8"))
        and path != REPO / "studies" / "analysis" / "csvfile.py"
    ]
    assert offenders == []


def read_streamed(response) -> list[dict]:
    body = b"".join(response.streaming_content).decode()
    return list(csv.DictReader(io.StringIO(body)))


@pytest.fixture
def hostile(db):
    """A completed participant whose free text, message and outcome would each be a formula."""
    study = make_study(arms=("=arm", "b"))
    p, _ = arrive(study, prolific(pid="hostile1"))
    Participant.objects.filter(pk=p.pk).update(arm=study.arms.get(name="=arm"))
    p.refresh_from_db()
    give_consent(p, True)
    said = store_user_message(p, "c1", "@SUM(A1:A9)").message
    store_turn_message(said, [], role="assistant", content="-2+3", model="m")
    end_chat(p)
    answers = {**GOOD_ANSWERS, "helpful": "6", "comment": '=HYPERLINK("http://evil","x")'}
    assert submit_questionnaire(p, answers) == {}
    Participant.objects.filter(pk=p.pk).update(outcome={"reward": -0.5, "success": False})
    return study


@pytest.mark.django_db
def test_responses_csv_neutralises_text_and_keeps_numbers(admin_client, hostile):
    url = reverse("admin:studies_study_responses", args=[hostile.pk])
    (row,) = read_streamed(admin_client.get(url))
    assert row["comment"] == '\'=HYPERLINK("http://evil","x")'
    assert row["arm"] == "'=arm"
    assert (row["helpful"], row["frustration"], row["donation"]) == ("6", "2", "1.5")
    assert row["outcome_reward"] == "-0.5"  # numeric, not quoted


@pytest.mark.django_db
def test_transcripts_csv_neutralises_messages(admin_client, hostile):
    url = reverse("admin:studies_study_transcripts", args=[hostile.pk])
    rows = read_streamed(admin_client.get(url))
    contents = [r["content"] for r in rows]
    assert "'@SUM(A1:A9)" in contents and "'-2+3" in contents
    assert all(not c.startswith(csvfile.FORMULA_STARTS) for c in contents)
    assert [r["seq"] for r in rows] == [str(m.seq) for m in Message.objects.order_by("seq")]


@pytest.mark.django_db
def test_analysis_downloads_neutralise_and_write_integers(admin_client, hostile):
    run = analysis_runs.compute(AnalysisRun.objects.create(study=hostile))
    assert run.status == "done", run.error
    inputs = list(csv.DictReader(io.StringIO(run.inputs["csv"])))
    assert inputs[0]["arm"] == "'=arm" and inputs[0]["helpful"] == "6"
    assert inputs[0]["outcome"] == "-0.5"
    url = reverse("admin:studies_analysisrun_download", args=[run.pk, "csv"])
    body = admin_client.get(url).content.decode()
    cells = [c for row in csv.reader(io.StringIO(body)) for c in row]
    assert "'=arm" in cells and "=arm" not in cells


def test_parley_reads_its_own_neutralised_csv_back_as_written(tmp_path):
    from studies.analysis import read_csv

    table = pd.DataFrame({"arm": ["=evil", "-b", "'plain"], "-x": ["@home", "-1", "fine"]})
    path = tmp_path / "input.csv"
    path.write_text(csvfile.table_text(table), encoding="utf-8")
    assert "'=evil" in path.read_text() and "'-x" in path.read_text()
    back = read_csv(path)
    assert list(back.columns) == ["arm", "-x"]
    assert back.to_dict("list") == table.to_dict("list")


# Text cells as a participant could type them (no lone surrogates: a CSV file is UTF-8), often
# starting with quotes and formula characters, the shapes the guard has to tell apart.
texts = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",))),
    st.builds(
        lambda quotes, start, rest: quotes + start + rest,
        st.text(alphabet="'", max_size=3),
        st.sampled_from([*csvfile.FORMULA_STARTS, "'", "a", " ", ""]),
        st.text(st.characters(blacklist_categories=("Cs",)), max_size=5),
    ),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(texts, min_size=1, max_size=4))
def test_written_text_reads_back_exactly_and_never_starts_a_formula(cells):
    written = csvfile.to_text([cells])
    (raw,) = list(csv.reader(io.StringIO(written, newline="")))
    assert not any(c.startswith(csvfile.FORMULA_STARTS) for c in raw)
    assert [csvfile.restore(c) for c in raw] == cells


@settings(max_examples=100, deadline=None)
@given(st.lists(texts.filter(lambda t: not t[:1].isspace()), min_size=1, max_size=4))
def test_parley_reads_any_text_column_back_as_written(tmp_path_factory, cells):
    from studies.analysis import read_csv

    table = pd.DataFrame({"arm": ["a"] * len(cells), "text": cells})
    path = tmp_path_factory.mktemp("csv") / "input.csv"
    path.write_text(csvfile.table_text(table), encoding="utf-8")
    assert read_csv(path)["text"].tolist() == cells
