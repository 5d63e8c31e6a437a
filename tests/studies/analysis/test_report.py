"""The report builder: reverse coding, exclusions, families, pairs and edge cases."""

import json
from itertools import combinations

import numpy as np
import pandas as pd
import pytest

from studies.analysis import Settings, build_report, to_json, wide_from_long
from studies.analysis.stats import holm, welch


def table_of(arms: dict[str, dict[str, list]], **extra: list) -> pd.DataFrame:
    """{arm: {measure: values}} -> one row per participant, arms in the given order."""
    rows = []
    for arm, measures in arms.items():
        size = len(next(iter(measures.values())))
        for i in range(size):
            rows.append({"arm": arm, **{m: v[i] for m, v in measures.items()}})
    table = pd.DataFrame(rows)
    for column, values in extra.items():
        table[column] = values
    return table


def comparison(report, measure, arm):
    return next(c for c in report["comparisons"] if c["measure"] == measure and c["arm"] == arm)


def descriptives(report, arm, measure):
    return next(a for a in report["arms"] if a["name"] == arm)["measures"][measure]


RNG = np.random.default_rng(7)
LIKERT = {
    arm: {
        "helpful": RNG.integers(1, 8, 20).tolist(),
        "frustration": RNG.integers(1 + i, 8, 20).tolist(),
        "outcome": RNG.random(20).round(3).tolist(),
    }
    for i, arm in enumerate(["base", "rl", "vs"])
}


def test_default_control_is_the_first_arm_and_diff_is_arm_minus_control():
    report = build_report(table_of(LIKERT), Settings("arm", ("helpful", "outcome")))
    assert [a["name"] for a in report["arms"]] == ["base", "rl", "vs"]
    assert [a["control"] for a in report["arms"]] == [True, False, False]
    assert {(c["arm"], c["reference"]) for c in report["comparisons"]} == {
        ("rl", "base"),
        ("vs", "base"),
    }
    c = comparison(report, "helpful", "vs")
    expected = welch(LIKERT["vs"]["helpful"], LIKERT["base"]["helpful"])
    assert c["t"] == expected.t and c["diff"] == pytest.approx(
        np.mean(LIKERT["vs"]["helpful"]) - np.mean(LIKERT["base"]["helpful"])
    )
    assert c["n_arm"] == 20 and c["n_reference"] == 20


def test_explicit_control_and_all_pairs():
    report = build_report(table_of(LIKERT), Settings("arm", ("helpful",), control="vs"))
    assert {(c["arm"], c["reference"]) for c in report["comparisons"]} == {
        ("base", "vs"),
        ("rl", "vs"),
    }
    assert [a["control"] for a in report["arms"]] == [False, False, True]
    every = build_report(table_of(LIKERT), Settings("arm", ("helpful",), pairs="all"))
    pairs = [(c["reference"], c["arm"]) for c in every["comparisons"]]
    assert pairs == list(combinations(["base", "rl", "vs"], 2))


def test_study_order_of_arms_is_kept_and_unknown_arms_are_noted():
    settings = Settings("arm", ("helpful",), arms=("vs", "base", "rl", "empty"))
    table = table_of(LIKERT)
    table.loc[0, "arm"] = "stray"
    report = build_report(table, settings)
    assert [a["name"] for a in report["arms"]] == ["vs", "base", "rl", "empty", "stray"]
    assert report["arms"][0]["control"]
    assert any("stray" in n for n in report["notes"])
    empty = descriptives(report, "empty", "helpful")
    assert empty["n"] == 0 and empty["mean"] is None and empty["note"] == "no values"
    assert comparison(report, "helpful", "empty")["t"] is None


def test_holm_family_per_measure_and_per_study():
    per_measure = build_report(table_of(LIKERT), Settings("arm", ("helpful", "outcome")))
    study = build_report(table_of(LIKERT), Settings("arm", ("helpful", "outcome"), family="study"))
    for measure in ("helpful", "outcome"):
        family = [c for c in per_measure["comparisons"] if c["measure"] == measure]
        assert [c["p_holm"] for c in family] == list(holm([c["p"] for c in family]))
        assert {c["family"] for c in family} == {measure}
    all_p = [c["p"] for c in study["comparisons"]]
    assert [c["p_holm"] for c in study["comparisons"]] == list(holm(all_p))
    assert {c["family"] for c in study["comparisons"]} == {"study"}


def test_flags_and_stars_follow_adjusted_p():
    strong = {"a": {"x": [1, 2, 1, 2, 1, 2, 1, 2]}, "b": {"x": [6, 7, 6, 7, 6, 7, 6, 7]}}
    weak = {"a": {"x": [1, 2, 3, 4, 5, 6]}, "b": {"x": [2, 3, 4, 5, 6, 7]}}
    c = build_report(table_of(strong), Settings("arm", ("x",)))["comparisons"][0]
    assert c["p_holm"] < 0.01 and c["flags"] == {"0.05": True, "0.01": True} and c["stars"] == "**"
    c = build_report(table_of(weak), Settings("arm", ("x",), alphas=(0.3, 0.5)))["comparisons"][0]
    assert 0.3 < c["p_holm"] < 0.5
    assert c["flags"] == {"0.5": True, "0.3": False} and c["stars"] == "*"


def test_reverse_coding_flips_before_analysis():
    plain = build_report(table_of(LIKERT), Settings("arm", ("frustration",)))
    flipped = build_report(
        table_of(LIKERT), Settings("arm", ("frustration",), reverse=("frustration",))
    )
    for arm in ("base", "rl", "vs"):
        raw = np.array(LIKERT[arm]["frustration"])
        assert descriptives(flipped, arm, "frustration")["mean"] == pytest.approx(np.mean(8 - raw))
    for a, b in zip(plain["comparisons"], flipped["comparisons"], strict=True):
        assert b["t"] == pytest.approx(-a["t"]) and b["p"] == pytest.approx(a["p"])
        assert b["hedges_g"] == pytest.approx(-a["hedges_g"])
    entry = flipped["measures"][0]
    assert entry["reverse"] and entry["likert"]
    # The distribution stays the answers as given.
    raw_base = np.array(LIKERT["base"]["frustration"])
    assert entry["distribution"]["base"]["1"] == int((raw_base == 1).sum())


def test_reverse_coding_uses_the_scale_and_drops_out_of_range_answers():
    data = {"a": {"x": [1, 2, 5, 9, 0]}, "b": {"x": [3, 4, 4, 5, 2]}}
    report = build_report(table_of(data), Settings("arm", ("x",), reverse=("x",), scale_max=5))
    a = descriptives(report, "a", "x")
    assert a["n"] == 3 and a["out_of_range"] == 2
    assert a["mean"] == pytest.approx(np.mean([5, 4, 1]))
    assert descriptives(report, "b", "x")["mean"] == pytest.approx(np.mean([3, 2, 2, 1, 4]))
    assert report["measures"][0]["out_of_range"] == {"count": 2, "examples": ["9", "0"]}
    assert any("outside 1..5" in n for n in report["notes"])


def test_items_can_have_their_own_scale():
    data = {"a": {"x": [1, 5, 6], "y": [1, 5, 6]}, "b": {"x": [2, 2, 3], "y": [2, 2, 3]}}
    settings = Settings("arm", ("x", "y"), reverse=("x", "y"), scales={"x": 5})
    report = build_report(table_of(data), settings)
    x, y = report["measures"]
    assert (x["scale_max"], y["scale_max"]) == (5, 7)
    assert descriptives(report, "a", "x")["mean"] == pytest.approx(np.mean([5, 1]))  # 6 dropped
    assert descriptives(report, "a", "y")["mean"] == pytest.approx(np.mean([7, 3, 2]))
    assert list(x["distribution"]["a"]) == ["1", "2", "3", "4", "5"]
    bad = build_report(table_of(data), Settings("arm", ("x",), scales={"z": 5, "x": 1}))
    assert bad["errors"] == [
        "the scale of x must be an integer >= 2, not 1",
        "scales items ['z'] are not among the measures",
    ]


def test_exclusions_by_default_counted_by_reason():
    data = {"a": {"x": [1, 2, 3, 4, 5, 6]}, "b": {"x": [2, 3, 4, 5, 6, 7]}}
    attention = ["yes", "no", "", "1", "FALSE", "maybe", "1", "1", "0", "1", "1", "1"]
    finished = [True, True, True, False, False, True, True, True, True, True, True, True]
    table = table_of(data, attention_passed=attention, finished=finished)
    report = build_report(table, Settings("arm", ("x",)))
    people = report["participants"]
    # failed: rows 1, 4, 8; unfinished: rows 3, 4 (row 4 is both)
    assert people["excluded"] == {
        "total": 4,
        "by_reason": {"unfinished": 2, "failed_attention_check": 3},
    }
    assert people["total"] == 12 and people["included"] == 8
    assert descriptives(report, "a", "x")["mean"] == pytest.approx(np.mean([1, 3, 6]))
    assert descriptives(report, "b", "x")["n"] == 5
    assert any("'maybe'" in n for n in report["notes"])  # unreadable flag: kept, reported

    kept = build_report(
        table, Settings("arm", ("x",), exclude_failed_attention=False, exclude_unfinished=False)
    )
    assert kept["participants"]["included"] == 12
    assert descriptives(kept, "a", "x")["n"] == 6


def test_flags_from_the_database_with_unknowns():
    table = pd.DataFrame(
        {
            "arm": ["a", "a", "a", "b", "b", "b"],
            "x": [1, 2, 3, 4, 5, 6],
            "attention_passed": [True, None, False, True, True, None],  # None: no check
            "finished": pd.array([True, True, True, pd.NA, True, False], dtype="boolean"),
        }
    )
    report = build_report(table, Settings("arm", "x"))
    assert report["settings"]["measures"] == ["x"]
    assert report["participants"]["excluded"]["by_reason"] == {
        "unfinished": 1,
        "failed_attention_check": 1,
    }
    assert descriptives(report, "a", "x")["n"] == 2 and descriptives(report, "b", "x")["n"] == 2


def test_rows_without_arm_are_excluded():
    table = table_of({"a": {"x": [1, 2, 3]}, "b": {"x": [2, 3, 4]}})
    table.loc[1, "arm"] = "  "
    report = build_report(table, Settings("arm", ("x",)))
    assert report["participants"]["excluded"]["by_reason"]["no_arm"] == 1
    assert descriptives(report, "a", "x")["n"] == 2


def test_missing_and_non_numeric_cells_are_dropped_per_measure_and_counted():
    table = pd.DataFrame(
        {
            "arm": ["a"] * 5 + ["b"] * 5,
            "x": ["1", "", "NA", "seven", "4", "2", "3", "abc", "5", "seven"],
            "y": ["1", "2", "3", "4", "5", "2", "3", "4", "5", "6"],
        }
    )
    report = build_report(table, Settings("arm", ("x", "y")))
    a = descriptives(report, "a", "x")
    assert (a["n"], a["missing"], a["non_numeric"], a["mean"]) == (2, 2, 1, 2.5)
    assert descriptives(report, "b", "x")["non_numeric"] == 2
    assert report["measures"][0]["missing"] == 2
    assert report["measures"][0]["non_numeric"] == {"count": 3, "examples": ["seven", "abc"]}
    assert descriptives(report, "a", "y")["n"] == 5  # other measures keep those participants
    assert any("non-numeric" in n and "'seven'" in n for n in report["notes"])


def test_arm_with_one_participant_gets_notes_not_a_crash():
    data = {"a": {"x": [1, 2, 3, 4]}, "b": {"x": [5]}, "c": {"x": [2, 4, 6, 7]}}
    report = build_report(table_of(data), Settings("arm", ("x",)))
    b = descriptives(report, "b", "x")
    assert b["n"] == 1 and b["mean"] == 5 and b["sd"] is None and b["ci"] == [None, None]
    assert "n < 2" in b["note"]
    lonely = comparison(report, "x", "b")
    assert lonely["t"] is None and lonely["p_holm"] is None and "at least 2" in lonely["note"]
    assert lonely["flags"] == {"0.05": None, "0.01": None} and lonely["diff"] == 2.5
    # The undefined test does not enter the family: the other is adjusted alone.
    other = comparison(report, "x", "c")
    assert other["p_holm"] == other["p"]
    assert "arm 'b' has fewer than 2 values for: x (n = 1)" in report["notes"]
    json.loads(to_json(report))


def test_zero_variance_in_both_arms():
    data = {"a": {"x": [4, 4, 4]}, "b": {"x": [6, 6, 6, 6]}}
    report = build_report(table_of(data), Settings("arm", ("x",)))
    c = report["comparisons"][0]
    assert c["t"] is None and c["p"] is None and c["hedges_g"] is None
    assert c["diff"] == 2 and "zero variance" in c["note"]
    assert descriptives(report, "a", "x")["sd"] == 0
    json.loads(to_json(report))


@pytest.mark.parametrize(
    "settings, needle",
    [
        (
            Settings("arm", ("x",), control="nope"),
            "control arm 'nope' is not among the arms: 'a', 'b'",
        ),
        (Settings("arm", ("x", "zz")), "measure columns ['zz'] not found"),
        (Settings("group", ("x",)), "arm column 'group' not found"),
        (Settings("arm", ("x",), reverse=("y",)), "reverse items ['y'] are not among"),
        (Settings("arm", ("x",), family="arm"), "family must be one of"),
        (Settings("arm", ("x",), scale_max=1), "scale_max"),
        (Settings("arm", ("x", "x")), "measures repeat"),
    ],
)
def test_bad_input_is_an_error_inside_the_report(settings, needle):
    report = build_report(table_of({"a": {"x": [1, 2]}, "b": {"x": [3, 4]}}), settings)
    assert any(needle in e for e in report["errors"]), report["errors"]
    assert report["comparisons"] == [] and report["arms"] == []
    json.loads(to_json(report))


def test_repeated_columns_are_an_error():
    table = pd.DataFrame([["a", 1, 2], ["b", 3, 4]], columns=["arm", "x", "x"])
    report = build_report(table, Settings("arm", ("x",)))
    assert report["errors"] == ["columns appear more than once: ['x']"]
    table.columns = ["arm", "arm", "x"]
    report = build_report(table, Settings("arm", ("x",), control="nope"))
    assert report["errors"] == ["columns appear more than once: ['arm']"]


def test_empty_tables():
    header_only = pd.DataFrame({"arm": [], "x": []})
    assert "the table has no rows" in build_report(header_only, Settings("arm", ("x",)))["errors"]
    no_columns = pd.DataFrame()
    assert "no columns" in build_report(no_columns, Settings("arm", ("x",)))["errors"][0]


def test_numbers_from_the_database_are_read_like_csv_text():
    numeric = pd.DataFrame({"arm": ["a", "a", "b", "b", "b"], "x": [1.0, None, 3.0, 4.0, 6.0]})
    text = numeric.assign(x=["1", "", "3", "4", "6"])
    a, b = (build_report(t, Settings("arm", ("x",))) for t in (numeric, text))
    assert a["comparisons"] == b["comparisons"] and a["arms"] == b["arms"]


def test_likert_detection_and_distribution():
    report = build_report(table_of(LIKERT), Settings("arm", ("helpful", "outcome")))
    helpful, outcome = report["measures"]
    assert helpful["likert"] and not outcome["likert"] and outcome["distribution"] is None
    for arm in ("base", "rl", "vs"):
        counts = helpful["distribution"][arm]
        assert list(counts) == [str(k) for k in range(1, 8)]
        assert sum(counts.values()) == descriptives(report, arm, "helpful")["n"]
    forced = build_report(table_of(LIKERT), Settings("arm", ("helpful",), likert=()))
    assert not forced["measures"][0]["likert"]
    # A measure forced to be Likert counts only the answers on the scale.
    odd = pd.DataFrame({"arm": ["a"] * 4 + ["b"] * 2, "x": [1, 2.5, -3, 9, 7, 7]})
    report = build_report(odd, Settings("arm", ("x",), likert=("x",)))
    assert report["measures"][0]["distribution"]["a"] == {
        "1": 1,
        "2": 0,
        "3": 0,
        "4": 0,
        "5": 0,
        "6": 0,
        "7": 0,
    }
    assert any("3 answers not on the 1..7 scale" in n for n in report["notes"])


def test_wide_from_long_keeps_the_last_answer():
    long = pd.DataFrame(
        {
            "participant": [1, 1, 2, 2, 1],
            "item": ["x", "y", "x", "y", "x"],
            "value": [3, 4, 5, 6, 7],
        }
    )
    wide = wide_from_long(long).set_index("participant")
    assert wide.loc[1, "x"] == 7 and wide.loc[2, "y"] == 6
    with pytest.raises(ValueError, match="no column 'answer'"):
        wide_from_long(long, value="answer")


def test_report_is_strict_json_with_the_documented_keys():
    settings = Settings("arm", ("helpful",), reverse=("helpful",), scales={"helpful": 7})
    report = build_report(table_of(LIKERT), settings)
    decoded = json.loads(to_json(report))
    assert set(decoded) == {
        "format",
        "settings",
        "software",
        "errors",
        "notes",
        "participants",
        "arms",
        "measures",
        "comparisons",
        "preregistration",
    }
    assert decoded["preregistration"] is None  # no plan given
    assert set(decoded["comparisons"][0]) >= {
        "t",
        "df",
        "p",
        "p_holm",
        "diff",
        "diff_ci",
        "hedges_g",
        "flags",
        "favours",
        "note",
    }
    assert Settings(**decoded["settings"]) == settings  # a stored run can be redone
