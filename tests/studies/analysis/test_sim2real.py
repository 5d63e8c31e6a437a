"""The sim-to-real gap report's statistics, without Django: numbers checked by hand and
against scipy."""

import math

import pytest
from scipy import stats as scipy_stats

from studies.analysis.plots import render_svg, sim2real_figure
from studies.analysis.sim2real import ArmData, Conversation, build_sim2real, format_sim2real


def talks(simulator, rewards):
    return [Conversation(simulator, r >= 0.5, r) for r in rewards]


def three_arms():
    return [
        ArmData(
            "a",
            "run-a",
            simulated=talks("anchored", [1.0, 0.5]) + talks("steady", [0.25, 0.25]),
            outcome=[0.5, 0.25, 0.0],
            success=[1, 1, 0],
            likert={"helpful": [5, 6, 7]},
        ),
        ArmData(
            "b",
            "run-b",
            simulated=talks("anchored", [0.0, 0.25]) + talks("steady", [0.0, 0.5]),
            outcome=[1.0, 0.75, 0.5],
            success=[1, 1, 1],
            likert={"helpful": [2, 3, 3]},
        ),
        ArmData(
            "c",
            "run-c",
            simulated=talks("anchored", [0.5, 0.5]) + talks("steady", [0.5, 0.75]),
            outcome=[0.25, 0.25, 0.5, 0.0],
            success=[1, 1, 1, 0],
            likert={"helpful": [4, 4, 5, 5]},
        ),
    ]


def test_simulator_means_and_t_interval_by_hand():
    report = build_sim2real(three_arms())
    a = report["arms"][0]
    reward = a["simulated"]["reward"]
    # rewards 1, .5, .25, .25: mean .5, SD sqrt(sum of squared deviations / 3)
    assert reward["n"] == 4 and reward["mean"] == pytest.approx(0.5)
    sd = math.sqrt((0.25 + 0 + 0.0625 + 0.0625) / 3)
    assert reward["sd"] == pytest.approx(sd)
    half = 3.182446305284263 * sd / 2  # qt(0.975, 3) * SD / sqrt(4), R's value
    assert reward["ci"] == pytest.approx([0.5 - half, 0.5 + half])
    assert a["simulated"]["success"]["mean"] == pytest.approx(0.5)  # 1 and .5 count as success
    assert a["simulators"]["anchored"]["reward"]["mean"] == pytest.approx(0.75)
    assert a["simulators"]["steady"]["n"] == 2
    assert a["human"]["outcome"]["mean"] == pytest.approx(0.25)
    assert a["likert"]["helpful"]["mean"] == pytest.approx(6.0)
    # hand: SD 1, half-width qt(0.975, 2) / sqrt(3)
    assert a["likert"]["helpful"]["ci"][1] == pytest.approx(6 + 4.302652729911275 / math.sqrt(3))


def test_gap_is_simulators_minus_people_with_welchs_interval():
    a = build_sim2real(three_arms())["arms"][0]
    assert a["gap"]["reward"]["diff"] == pytest.approx(0.5 - 0.25)
    welch = scipy_stats.ttest_ind([1.0, 0.5, 0.25, 0.25], [0.5, 0.25, 0.0], equal_var=False)
    ci = welch.confidence_interval(0.95)
    assert a["gap"]["reward"]["ci"] == pytest.approx([ci.low, ci.high])
    assert a["gap"]["success"]["diff"] == pytest.approx(0.5 - 2 / 3)


def test_kendalls_tau_matches_scipy_and_the_rankings_are_best_first():
    report = build_sim2real(three_arms())
    ranking = report["ranking"]
    # simulator reward means a .5, b .1875, c .5625; human outcome means a .25, b .75, c .25
    assert ranking["simulators"] == ["c", "a", "b"]
    assert ranking["people"] == ["b", "a", "c"]  # a and c tie: the study's order
    expected = scipy_stats.kendalltau([0.5, 0.1875, 0.5625], [0.25, 0.75, 0.25])
    assert ranking["tau"] == pytest.approx(expected.statistic)
    assert ranking["p"] == pytest.approx(expected.pvalue)
    assert ranking["tau"] < 0 and ranking["arms"] == 3


def test_perfect_agreement_gives_tau_one():
    arms = [
        ArmData(n, None, simulated=talks("s", [r, r + 0.1]), outcome=[r, r + 0.2])
        for n, r in (("x", 0.1), ("y", 0.4), ("z", 0.7))
    ]
    assert build_sim2real(arms)["ranking"]["tau"] == pytest.approx(1.0)


def test_fewer_than_two_arms_or_missing_data_say_so():
    one = build_sim2real([three_arms()[0]])
    assert one["ranking"]["tau"] is None
    assert "at least 2 arms" in one["ranking"]["note"]
    assert any("only one arm" in n for n in one["notes"])
    arms = three_arms()
    arms[1].simulated = []
    report = build_sim2real(arms)
    assert report["ranking"]["arms"] == 2 and "b" in report["ranking"]["note"]
    assert report["arms"][1]["gap"]["reward"] == {
        "diff": None,
        "ci": [None, None],
        "note": "no simulator conversations",
    }
    assert any("'b': no simulator conversations" in n for n in report["notes"])
    assert build_sim2real([])["errors"] == ["the study has no arms"]


def test_a_single_conversation_has_no_interval_and_says_why():
    report = build_sim2real([ArmData("a", None, simulated=talks("s", [1.0]), outcome=[0.5])])
    reward = report["arms"][0]["simulated"]["reward"]
    assert reward["mean"] == 1.0 and reward["ci"] == [None, None]
    assert "n < 2" in reward["note"]


def test_text_and_figure():
    report = build_sim2real(three_arms())
    text = format_sim2real(report)
    assert f"Kendall's tau = {report['ranking']['tau']:.3f}, p = " in text
    assert "gap in reward (simulators - people): +0.250" in text
    svg = render_svg(sim2real_figure(report))
    assert svg.lstrip().startswith("<?xml") and "Kendall" in svg
    assert sim2real_figure(build_sim2real([])) is None


LIKE = "pilot-humanlike"
LABEL = "human-like (imitation of study pilot)"


def test_a_human_like_simulator_is_a_column_of_its_own_with_its_gap_to_people():
    arms = three_arms()
    arms[0].humanlike = talks(LIKE, [0.0, 0.5, 0.25])  # mean .25, like its people's .25
    report = build_sim2real(arms, humanlike={LIKE: LABEL})
    assert [(h["name"], h["label"]) for h in report["humanlike"]] == [(LIKE, LABEL)]
    a, b = report["arms"][:2]
    # the training panel's pooled numbers are untouched by it
    assert a["simulated"]["n"] == 4 and a["simulated"]["reward"]["mean"] == pytest.approx(0.5)
    assert LIKE not in a["simulators"]
    (like,) = a["humanlike"]
    assert like["name"] == LIKE and like["label"] == LABEL and like["n"] == 3
    assert like["reward"]["mean"] == pytest.approx(0.25)
    assert like["success"]["mean"] == pytest.approx(1 / 3)
    assert like["gap"]["reward"]["diff"] == pytest.approx(0.25 - 0.25)
    welch = scipy_stats.ttest_ind([0.0, 0.5, 0.25], [0.5, 0.25, 0.0], equal_var=False)
    ci = welch.confidence_interval(0.95)
    assert like["gap"]["reward"]["ci"] == pytest.approx([ci.low, ci.high])
    # an arm it has not played yet has the column, empty, and says why
    assert b["humanlike"][0]["n"] == 0
    assert b["humanlike"][0]["gap"]["reward"]["note"] == "no simulator conversations"

    text = format_sim2real(report)
    assert f"{LABEL}: success 0.333" in text
    assert f"gap in reward ({LABEL} - people): +0.000" in text
    svg = render_svg(sim2real_figure(report))
    assert f"{LABEL} (reward)" in svg
    assert build_sim2real(three_arms())["arms"][0]["humanlike"] == []


def test_the_arms_ranked_by_a_human_like_simulator_against_people():
    arms = three_arms()
    # human-like means a .25, b .75, c .375; people a .25, b .75, c .25
    for arm, rewards in zip(arms, ([0.25, 0.25], [0.5, 1.0], [0.25, 0.5]), strict=True):
        arm.humanlike = talks(LIKE, rewards)
    report = build_sim2real(arms, humanlike={LIKE: LABEL})
    ranking = report["humanlike"][0]["ranking"]
    assert ranking["simulators"] == ["b", "c", "a"] and ranking["people"] == ["b", "a", "c"]
    expected = scipy_stats.kendalltau([0.25, 0.75, 0.375], [0.25, 0.75, 0.25])
    assert ranking["tau"] == pytest.approx(expected.statistic)
    assert ranking["p"] == pytest.approx(expected.pvalue)
    assert ranking["measure"] == f"reward ({LABEL}) against outcome (people)"
    # the panel's ranking is its own (negative here: it ranks the arms unlike people)
    assert report["ranking"]["tau"] < 0 < ranking["tau"]
    assert f"ranking by {LABEL}: b, c, a; Kendall's tau = {ranking['tau']:.3f}" in (
        format_sim2real(report)
    )
