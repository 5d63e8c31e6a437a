"""The annotation report (studies/analysis/annotation.py): conversations as the unit, groups by
arm and source, the chat report's Welch and Holm on them, alpha per item, judged-human rates."""

import random

import pytest

from studies.analysis.annotation import annotation_report, conversation_table, realism


def rating(conversation, rater, source, arm, simulator="", attention=True, **answers):
    return {
        "conversation": conversation,
        "rater": rater,
        "source": source,
        "arm": arm,
        "simulator": simulator,
        "attention_passed": attention,
        "answers": answers,
    }


def study_ratings(seed=0):
    """Three groups of eight conversations, three raters each: people in two arms, one
    simulator; the simulator's users read as less real and its conversations rate lower."""
    rng, out = random.Random(seed), []
    groups = [
        ("person", "base", "", 5),
        ("person", "trained", "", 6),
        ("simulator", "base", "vs", 3),
    ]
    for g, (source, arm, simulator, centre) in enumerate(groups):
        for c in range(8):
            for r in range(3):
                quality = min(7, max(1, centre + rng.choice([-1, 0, 0, 1])))
                real = "real" if (source == "person") == (rng.random() < 0.8) else "simulated"
                out.append(
                    rating(
                        f"{g}-{c}",
                        f"r{r + 3 * c}",
                        source,
                        arm,
                        simulator,
                        quality=quality,
                        real_person=real,
                    )
                )
    return out


def test_conversations_are_the_unit_and_groups_name_arm_and_source():
    ratings = [
        rating("c1", "x", "person", "base", quality=4),
        rating("c1", "y", "person", "base", quality=6),
        rating("c2", "x", "simulator", "base", "vs", quality=2),
    ]
    table = conversation_table(ratings, ["quality"]).set_index("conversation")
    assert table.loc["c1", "quality"] == 5 and table.loc["c1", "raters"] == 2
    assert list(table["group"]) == ["base · people", "base · vs"]


def test_the_report_compares_every_pair_of_groups_with_holm_and_measures_agreement():
    report = annotation_report(study_ratings(), {"quality": 7}, boot=200)
    assert not report["errors"]
    pairs = {(c["arm"], c["reference"]) for c in report["comparisons"]}
    assert len(pairs) == 3 and all(c["p_holm"] >= c["p"] for c in report["comparisons"])
    sim = next(
        c
        for c in report["comparisons"]
        if "vs" in (c["arm"] + c["reference"]) and "trained" in (c["arm"] + c["reference"])
    )
    assert sim["p_holm"] < 0.05  # 6 against 3 on 8 conversations each: a clear difference
    annotation = report["annotation"]
    assert annotation["conversations"] == 24 and annotation["ratings"] == 72
    alpha = annotation["agreement"]["quality"]
    assert 0.5 < alpha["alpha"] <= 1 and alpha["ci"][0] < alpha["alpha"] < alpha["ci"][1]


def test_judged_human_rates_per_source_with_exact_intervals():
    ratings = [rating(f"p{i}", "x", "person", "a", real_person="real") for i in range(3)]
    ratings += [rating("p3", "y", "person", "a", real_person="simulated")]
    ratings += [
        rating(f"s{i}", "x", "simulator", "a", "vs", real_person="simulated") for i in range(4)
    ]
    rates = realism(ratings)
    assert rates["by_source"]["people"]["k"] == 3 and rates["by_source"]["people"]["n"] == 4
    assert rates["by_source"]["vs"]["rate"] == 0 and rates["by_source"]["vs"]["ci"][0] == 0
    assert rates["by_group"]["a · vs"]["n"] == 4


def test_raters_who_missed_gold_and_gold_ratings_are_left_out():
    ratings = study_ratings()
    ratings[0]["attention_passed"] = False
    ratings.append({**rating("gold-1", "r0", "person", "", quality=1), "gold": True})
    report = annotation_report(ratings, {"quality": 7}, boot=50)
    assert report["annotation"]["ratings"] == 71 and report["annotation"]["excluded_ratings"] == 2
    kept = annotation_report(ratings, {"quality": 7}, exclude_failed_attention=False, boot=50)
    assert kept["annotation"]["ratings"] == 72


@pytest.mark.parametrize("missing", [None, "n/a", float("nan")])
def test_answers_that_are_not_numbers_are_missing_not_zero(missing):
    ratings = [
        rating("c1", "x", "person", "a", quality=6),
        rating("c1", "y", "person", "a", quality=missing),
    ]
    assert conversation_table(ratings, ["quality"])["quality"].iloc[0] == 6


def test_sim2real_columns_rank_arms_by_raters_against_participants_and_simulators():
    from studies.analysis.annotation import sim2real_columns

    ratings = []
    for arm, quality in [("a", 6), ("b", 4), ("c", 2)]:
        for c in range(3):
            ratings.append(
                rating(f"{arm}{c}", "x", "person", arm, quality=quality + c % 2, real_person="real")
            )
            ratings.append(
                rating(
                    f"{arm}s{c}", "y", "simulator", arm, "vs", quality=3, real_person="simulated"
                )
            )
    arms = [
        {
            "name": name,
            "human": {"outcome": {"mean": outcome}},
            "simulated": {"reward": {"mean": reward}},
        }
        for name, outcome, reward in [("a", 0.9, 0.1), ("b", 0.5, 0.5), ("c", 0.2, 0.8)]
    ]
    columns = sim2real_columns(ratings, "quality", arms)
    assert columns["arms"]["a"]["people"]["quality"]["mean"] == pytest.approx(6 + 1 / 3)
    assert columns["arms"]["c"]["vs"]["realism"]["rate"] == 0
    assert columns["arms"]["b"]["people"]["realism"]["rate"] == 1
    ranking = columns["ranking"]
    assert ranking["raters"] == ["a", "b", "c"]
    assert ranking["against_participants"]["tau"] == pytest.approx(1.0)
    assert ranking["against_simulators"]["tau"] == pytest.approx(-1.0)
