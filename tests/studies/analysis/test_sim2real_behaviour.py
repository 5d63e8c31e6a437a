"""The sim-to-real report's behaviour section (studies/analysis/sim2real_behaviour.py) on
constructed turns: the people write four kinds of turn in known shares, one simulator writes
them in the same shares, another only one kind. The space is fit on the people's turns with a
constructed embedder (each kind a direction of its own), so every share, BDI and distance is
known by hand."""

import math

import numpy as np
import pytest

from agents.behaviour import measures as m
from agents.behaviour.embedder import Embedder
from agents.behaviour.space import BehaviourSpace
from studies.analysis.sim2real_behaviour import (
    SimulatorTurns,
    SpaceSettings,
    behaviour_section,
    format_behaviour,
    shares_rows,
    space_key,
)

KINDS = {
    "ask": (1, 0, 0, 0),
    "refuse": (0, 1, 0, 0),
    "question": (0, 0, 1, 0),
    "agree": (0, 0, 0, 1),
}


def embed(texts):
    """A constructed embedder: a turn's first word picks its kind's direction; its length adds
    a little noise, so turns of one kind are not one point."""
    return [(np.array(KINDS[t.split()[0]], float) * 10 + 0.01 * len(t)).tolist() for t in texts]


def turns(kind, n):
    return [f"{kind} turn number {i}" + "!" * (i % 3) for i in range(n)]


# the people: 40% ask, 20% each of the others
PEOPLE = turns("ask", 16) + turns("refuse", 8) + turns("question", 8) + turns("agree", 8)
LIKE = SimulatorTurns(
    "like",
    "talks like the people",
    conversations=5,
    turns=turns("ask", 8) + turns("refuse", 4) + turns("question", 4) + turns("agree", 4),
)
UNLIKE = SimulatorTurns("unlike", "refuses only", conversations=5, turns=turns("refuse", 20))
SETTINGS = SpaceSettings(embedder="constructed", clusters=4)


def section(tmp_path, simulators=(UNLIKE, LIKE), people=PEOPLE, settings=SETTINGS):
    return behaviour_section(people, 8, list(simulators), settings, tmp_path, lambda _: embed)


def in_cluster_order(result, tmp_path, shares):
    """{kind: share} of shares given in the space's cluster order (k-means numbers its clusters
    as it likes: the saved space says which cluster each kind fell in)."""
    space = BehaviourSpace.load(tmp_path / result["space"]["key"], embed)
    return {kind: shares[space.assign([f"{kind} x"])[0]] for kind in KINDS}


def test_the_simulator_that_talks_like_the_people_is_ranked_first(tmp_path):
    result = section(tmp_path)
    assert result["error"] is None
    assert result["most_like"] == "like"
    assert [s["name"] for s in result["simulators"]] == ["like", "unlike"]
    people = in_cluster_order(result, tmp_path, result["people"]["shares"])
    assert people == pytest.approx({"ask": 0.4, "refuse": 0.2, "question": 0.2, "agree": 0.2})
    like, unlike = result["simulators"]
    assert in_cluster_order(result, tmp_path, like["shares"]) == pytest.approx(people)
    assert in_cluster_order(result, tmp_path, unlike["shares"]) == pytest.approx(
        {"ask": 0, "refuse": 1, "question": 0, "agree": 0}
    )
    # BDI: the like one covers every cluster the people hold; the unlike one only the refusals,
    # which are 20% of the people's behaviour
    assert like["bdi"] == 1.0 and unlike["bdi"] == pytest.approx(0.2)
    assert like["jsd"] == pytest.approx(0, abs=1e-9)
    # JSD by hand from the two KL divergences: p = (0, 1, 0, 0), r = (.4, .2, .2, .2)
    mix = {"ask": 0.2, "refuse": 0.6, "question": 0.1, "agree": 0.1}
    kl_p = math.log(1 / mix["refuse"])
    kl_r = 0.4 * math.log(0.4 / 0.2) + 0.2 * math.log(0.2 / 0.6) + 2 * 0.2 * math.log(0.2 / 0.1)
    assert unlike["jsd"] == pytest.approx(math.sqrt((kl_p + kl_r) / (2 * math.log(2))))
    assert like["mci"] == pytest.approx(0.4**2 + 3 * 0.2**2) and unlike["mci"] == 1.0
    assert (like["turns"], like["conversations"]) == (20, 5)
    assert result["space"]["fitted"] and result["space"]["reference_turns"] == 40


def test_the_space_is_saved_beside_the_report_and_found_again(tmp_path):
    first = section(tmp_path)
    folder = tmp_path / first["space"]["key"]
    assert (folder / "space.json").is_file() and (folder / "centroids.npy").is_file()
    assert "ask turn" not in (folder / "space.json").read_text()  # no participant's words kept
    again = section(tmp_path)
    assert not again["space"]["fitted"] and again["space"]["key"] == first["space"]["key"]
    assert again["simulators"] == first["simulators"]
    # one more participant turn is another reference: another space, never the old one changed
    more = section(tmp_path, people=PEOPLE + ["agree one more"])
    assert more["space"]["key"] != first["space"]["key"] and more["space"]["fitted"]
    assert first["space"]["key"] == space_key(SETTINGS, PEOPLE)


def test_too_few_participant_turns_is_said_and_loads_no_model(tmp_path):
    def no_model(folder):
        raise AssertionError("the embedder was loaded with nothing to compare")

    result = behaviour_section(PEOPLE[:19], 3, [LIKE], SETTINGS, tmp_path, no_model)
    assert result["error"] == (
        "too few participant turns to fit a behaviour space: 19 from 3 participant(s); 4 "
        "clusters need at least 20 (5 a cluster; PARLEY_SIM2REAL_CLUSTERS sets the clusters)"
    )
    assert result["simulators"] == [] and result["most_like"] is None
    assert "not compared: too few participant turns" in "\n".join(format_behaviour(result))
    nothing = behaviour_section(PEOPLE, 8, [SimulatorTurns("x", "x")], SETTINGS, tmp_path, no_model)
    assert nothing["error"].startswith("no simulator turns stored yet")


def test_a_missing_embedder_folder_is_a_clear_message(tmp_path):
    settings = SpaceSettings(embedder=str(tmp_path / "no-model"), clusters=4)
    result = behaviour_section(PEOPLE, 8, [LIKE], settings, tmp_path, Embedder)
    assert result["error"].startswith("the embedder could not be loaded: embedder: no model folder")


def test_a_simulator_without_turns_is_listed_last_unmeasured(tmp_path):
    result = section(tmp_path, simulators=(SimulatorTurns("silent", "silent"), UNLIKE, LIKE))
    assert [s["name"] for s in result["simulators"]] == ["like", "unlike", "silent"]
    assert result["simulators"][-1]["bdi"] is None
    assert "simulator 'silent': no turns stored" in result["notes"]


def test_the_table_and_the_text_give_the_shares_side_by_side(tmp_path):
    result = section(tmp_path)
    rows = shares_rows(result)
    assert rows[0] == ["cluster", "people", "like", "unlike"] and len(rows[1:5]) == 4
    assert [r[1] for r in rows[1:5]] == result["people"]["shares"]
    assert rows[-2][0] == "like" and rows[-2][-1] is True and rows[-1][-1] is False
    text = "\n".join(format_behaviour(result))
    assert "most like the people: like" in text and "refuses only: BDI 0.200" in text


def test_jensen_shannon_distance_bounds():
    assert m.jensen_shannon([0.5, 0.5], [0.5, 0.5]) == 0
    assert m.jensen_shannon([1, 0], [0, 1]) == pytest.approx(1)
    assert m.jensen_shannon([2, 2], [1, 1]) == 0  # counts are normalised
    with pytest.raises(ValueError, match="2 and 3 clusters"):
        m.jensen_shannon([1, 0], [0, 1, 0])
