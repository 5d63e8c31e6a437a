"""COLLAPSE-AWARE's measures on constructed distributions with known answers
(agents/behaviour/measures.py), the behaviour space's clustering and act classifier on
constructed embeddings, and the profiles' probe and pooled forms (training/measures/profiles.py)."""

import math

import numpy as np
import pytest

from agents.behaviour import measures as m
from agents.behaviour.space import BehaviourSpace
from agents.domains.episode import USER
from training.measures.behaviour_space import load_or_fit
from training.measures.profiles import Profiles, Reply
from training.rollouts.rollout import Decision


def test_one_cluster_is_one_mode():
    p = [0.0, 1.0, 0.0, 0.0]
    assert m.mci(p) == 1.0
    assert m.scd(p) == 1.0


@pytest.mark.parametrize("k", [2, 5, 100])
def test_k_even_clusters_are_spread_evenly(k):
    p = [1 / k] * k
    assert m.mci(p) == pytest.approx(1 / k)
    assert m.scd(p) == pytest.approx(0.0, abs=1e-12)


def test_mci_and_scd_in_between_and_on_counts():
    # MCI's denominator makes counts and shares agree; SCD normalises by log K, K the space's
    assert m.mci([3, 1]) == pytest.approx(0.625) == m.mci([0.75, 0.25])
    q = [0.5, 0.5, 0.0, 0.0]  # half of a 4-cluster space: H = log 2, H_max = log 4
    assert m.scd(q) == pytest.approx(0.5)
    assert m.mci(q) == pytest.approx(0.5)
    # on counts as on shares (the population's turns are counted before they are shared)
    assert m.scd([6, 6, 0, 0]) == pytest.approx(0.5) and m.entropy([6, 6]) == pytest.approx(
        0.6931, rel=1e-4
    )


def test_half_coverage_is_bdi_one_half():
    people = [0.25, 0.25, 0.25, 0.25, 0.0, 0.0]
    simulated = m.covered([0.0, 0.0, 0.5, 0.5, 0.0, 0.0], 0.0)
    assert m.bdi(simulated, people, 0.01) == 0.5
    # behaviour outside the people's support raises nothing
    assert m.bdi(simulated | {4, 5}, people, 0.01) == 0.5
    # a cluster below the support share is not the people's
    assert m.support([0.995, 0.004, 0.001], 0.005) == {0}


def test_bdi_weighs_the_people_s_clusters_by_their_share():
    # P4G's people gave $0 in about two thirds of dialogues: a persuadee that never gives $0
    # covers only the third of their behaviour that is not $0
    people = [0.67, 0.12, 0.14, 0.01, 0.06]
    never_zero = m.covered([0.001, 0.2, 0.3, 0.2, 0.299], 0.01)
    assert never_zero == {1, 2, 3, 4}
    assert m.bdi(never_zero, people, 0.005) == pytest.approx(0.33)
    assert m.bdi({0}, people, 0.005) == pytest.approx(0.67)


def test_coverage_growth_and_psod_signs():
    assert m.coverage_growth({0, 1, 2}, {0}, 10) == pytest.approx(0.2)
    assert m.coverage_growth({0}, {0, 1, 2}, 10) == pytest.approx(-0.2)
    assert m.psod(0.8, 0.3) == pytest.approx(0.5)  # overfit to the training simulators: > 0


def test_bad_inputs_say_so():
    with pytest.raises(ValueError, match="empty"):
        m.mci([0, 0])
    with pytest.raises(ValueError, match="at least 2"):
        m.scd([1.0])
    with pytest.raises(ValueError, match="no support"):
        m.bdi({0}, [0.0, 0.0], 0.01)


def test_bootstrap_interval_holds_the_value_and_is_seeded():
    labels = [0] * 30 + [1] * 10
    stat = lambda x: m.mci(m.shares(x, 2))  # noqa: E731
    lo, hi = m.bootstrap(labels, stat, 200, "s")
    assert lo <= stat(labels) <= hi and lo < hi
    assert m.bootstrap(labels, stat, 200, "s") == (lo, hi)
    assert m.bootstrap([1] * 20, stat, 50, "s") == (1.0, 1.0)  # one mode: no spread


# -- the space -----------------------------------------------------------------------------------

WORDS = {"yes": [1, 0, 0, 0], "no": [0, 1, 0, 0], "why": [0, 0, 1, 0], "ok": [0, 0, 0, 1]}


def embed(texts):
    """A constructed embedder: each text's first word picks a direction, the rest a little noise."""
    out = []
    for t in texts:
        v = np.array(WORDS[t.split()[0].lower().strip("?.!")], dtype=float)
        out.append((v * 10 + 0.01 * len(t)).tolist())
    return out


def settings(**kw):
    return {
        "reference": "test",
        "embedder": "constructed",
        "clusters": 4,
        "reference_max": 100,
        "seed": 0,
        "dialogue_acts": False,
    } | kw


def test_the_space_finds_the_constructed_clusters_and_loads_the_same(tmp_path):
    turns = [f"{w} {'x' * i}" for w in WORDS for i in range(5)]
    space = BehaviourSpace.fit(settings(), turns, embed)
    labels = space.assign(turns)
    groups = [set(labels[i * 5 : (i + 1) * 5]) for i in range(4)]
    assert all(len(g) == 1 for g in groups) and len(set.union(*groups)) == 4
    assert space.reference_shares == [0.25] * 4
    space.save(tmp_path / "behaviour_space")
    again = BehaviourSpace.load(tmp_path / "behaviour_space", embed)
    assert again.assign(turns) == labels


def test_a_resumed_run_refuses_another_space(tmp_path):
    (tmp_path / "ref.jsonl").write_text("\n".join(f'"{w} {i}"' for w in WORDS for i in range(3)))
    fitted = settings(reference=f"texts:{tmp_path / 'ref.jsonl'}")
    load_or_fit(tmp_path, fitted, embed)
    assert (tmp_path / "behaviour_space" / "space.json").is_file()
    load_or_fit(tmp_path, fitted, embed)  # the same settings: loaded
    with pytest.raises(ValueError, match="one space"):
        load_or_fit(tmp_path, fitted | {"clusters": 3}, embed)


def test_each_cluster_keeps_its_nearest_reference_turns_a_space_saved_without_them_too(tmp_path):
    """Verbalized Sampling is told what a missing cluster looks like in the reference's words
    (training/regimes/synthesis.py): each cluster's turns nearest its centroid, kept with a run's
    space; a space saved before they were kept finds them again from its reference."""
    import json

    (tmp_path / "ref.jsonl").write_text("\n".join(f'"{w} {i}"' for w in WORDS for i in range(3)))
    fitted = settings(reference=f"texts:{tmp_path / 'ref.jsonl'}")
    space = load_or_fit(tmp_path, fitted, embed)
    for k, turns in enumerate(space.exemplars):
        assert len(turns) == 3 and set(space.assign(turns)) == {k}
    saved = tmp_path / "behaviour_space" / "space.json"
    about = json.loads(saved.read_text())
    del about["exemplars"]
    saved.write_text(json.dumps(about))
    assert load_or_fit(tmp_path, fitted, embed).exemplars == space.exemplars
    # a study's people: no words kept beside the space
    assert (
        BehaviourSpace.fit(
            fitted, [f"{w} {i}" for w in WORDS for i in range(3)], embed, exemplars=0
        ).exemplars
        is None
    )


def test_the_act_classifier_learns_constructed_acts():
    labelled = [
        (f"{w} {'y' * i}.", "agree" if w in ("yes", "ok") else "object")
        for w in WORDS
        for i in range(6)
    ]
    space = BehaviourSpace.fit(settings(), [s for s, _ in labelled], embed, labelled)
    names = space.acts["labels"]
    assert names == ["agree", "object"] and space.acts["reference_shares"] == [0.5, 0.5]
    said = space.label_acts(["Yes sure. Why would I?", "No."])
    assert [names[i] for i in said] == ["agree", "object", "object"]


# -- the profiles --------------------------------------------------------------------------------


def decision(probs):
    texts = ["$0", "$1", "$2"]
    return Decision(USER, texts, probs, 0)


def test_choice_turns_are_measured_exactly_and_against_people():
    people = {"$0": 0.6, "$1": 0.3, "$2": 0.1}
    profiles = Profiles(None, 0.05, 0.01, 0, 0, True, people)
    probed = {
        "collapsed": [Reply("$2", decision([0.0, 0.0, 1.0]))] * 3,
        "even": [Reply("$0", decision([1 / 3, 1 / 3, 1 / 3]))] * 3,
    }
    row = profiles.row(1, probed, {}, ["collapsed"])
    assert row["behaviour/decision/probe/mci/collapsed"] == 1.0
    assert row["behaviour/decision/probe/mci/even"] == pytest.approx(1 / 3)
    assert row["behaviour/decision/probe/scd"] == 1.0  # the population is the collapsed one
    assert row["behaviour/decision/probe/bdi"] == pytest.approx(0.1)  # people's $2 share
    assert "behaviour/decision/probe/mci/collapsed/lo" not in row  # exact: no interval
    assert row["sim/decision_entropy_probe"] == 0.0
    both = profiles.row(1, probed, {}, ["collapsed", "even"])
    assert both["behaviour/decision/probe/bdi"] == 1.0
    assert both["sim/decision_entropy_probe"] == pytest.approx(math.log(3) / 2)


def test_free_text_is_estimated_with_intervals_and_the_pooled_form_beside(tmp_path):
    space = BehaviourSpace.fit(settings(), [f"{w} {i}" for w in WORDS for i in range(4)], embed)
    profiles = Profiles(space, 0.01, 0.0, 100, 0, True)
    probed = {"a": [Reply("yes", None), Reply("no", None)], "b": [Reply("why", None)] * 2}
    pooled = {"a": [Reply("yes", None)] * 4}  # a collapsed agent: the pooled form only says yes
    row = profiles.row(1, probed, pooled, ["a", "b"])
    assert row["behaviour/clusters/probe/mci/a"] == 0.5
    assert row["behaviour/clusters/probe/mci/b"] == 1.0
    assert row["behaviour/clusters/probe/bdi"] == pytest.approx(0.75)
    assert row["behaviour/clusters/probe/bdi/b"] == pytest.approx(0.25)
    # the intervals: an estimate from 4 replies is never exact
    assert row["behaviour/clusters/probe/mci/a/lo"] < row["behaviour/clusters/probe/mci/a/hi"]
    assert row["behaviour/clusters/probe/scd/lo"] <= row["behaviour/clusters/probe/scd"]
    assert row["behaviour/clusters/probe/scd"] <= row["behaviour/clusters/probe/scd/hi"]
    assert row["behaviour/clusters/pooled/scd"] == 1.0
    assert row["behaviour/clusters/pooled/mci/a"] == 1.0


def test_without_people_the_relative_form_is_written_instead_of_bdi():
    space = BehaviourSpace.fit(settings(), [f"{w} {i}" for w in WORDS for i in range(4)], embed)
    profiles = Profiles(space, 0.01, 0.0, 0, 0, False)
    first = profiles.row(1, {"a": [Reply("yes", None)]}, {}, ["a"])
    assert first["behaviour/clusters/probe/coverage"] == 0.25
    assert "behaviour/clusters/probe/coverage_growth" not in first  # no step before
    assert not any("bdi" in k for k in first)
    second = profiles.row(2, {"a": [Reply("yes", None), Reply("no", None)]}, {}, ["a"])
    assert second["behaviour/clusters/probe/coverage_growth"] == 0.25


# -- the references ------------------------------------------------------------------------------


def test_a_bad_reference_is_refused_where_the_config_enters():
    from training.config import parse_config
    from training.config_keys import ConfigError

    base = {"name": "x", "domain": "p4g"}
    with pytest.raises(ConfigError, match="behaviour.reference"):
        parse_config(base | {"behaviour": {"reference": "people"}})
    with pytest.raises(ConfigError, match="behaviour.reference"):
        parse_config(base | {"behaviour": {"reference": "run:"}})
    assert parse_config(base | {"behaviour": {"reference": "run:/x"}}).behaviour.enabled


def test_the_references_are_read_and_a_missing_one_says_where_it_looked(tmp_path, monkeypatch):
    from training.measures.behaviour_space import reference_turns

    (tmp_path / "samples.jsonl").write_text(
        '{"conversation": [{"role": "assistant", "content": "Hi"},'
        ' {"role": "user", "content": "I want a refund"}]}\n'
    )
    assert reference_turns(f"run:{tmp_path}") == ["I want a refund"]
    (tmp_path / "people.jsonl").write_text('"one"\n{"text": "two"}\n\n')
    assert reference_turns(f"texts:{tmp_path / 'people.jsonl'}") == ["one", "two"]
    (tmp_path / "bad.jsonl").write_text("3\n")
    with pytest.raises(ValueError, match="line 1"):
        reference_turns(f"texts:{tmp_path / 'bad.jsonl'}")
    monkeypatch.setenv("PARLEY_REFERENCE_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="no Persuasion for Good full_dialog.csv in .*empty"):
        reference_turns("p4g_corpus", corpus=str(tmp_path / "empty"))


def test_kmeans_keeps_every_cluster_in_use():
    from agents.behaviour.space import kmeans

    x = np.random.default_rng(0).normal(size=(300, 16))
    c = kmeans(x, 50, seed=1)
    labels = ((x[:, None] - c[None]) ** 2).sum(-1).argmin(1)
    assert c.shape == (50, 16) and len(set(labels.tolist())) == 50
    with pytest.raises(ValueError, match="only 300 turns"):
        kmeans(x, 301, seed=1)


# -- the probe set, on scripted persuadees (no model) --------------------------------------------


def test_an_ensemble_is_probed_member_by_member_on_the_same_fixed_probes(tmp_path):
    from training.config import parse_config
    from training.measures.profiles import ask, probe_set
    from training.regimes.choose import make_regime
    from training.regimes.regime import ModelCache

    members = [{"name": n, "kind": "scripted", "script": n} for n in ("anchored", "reactant")]
    config = parse_config(
        {
            "name": "e",
            "domain": "p4g-decision",
            "regime": "ensemble",
            "ensemble": members,
            "heldout": [],
            "output_dir": str(tmp_path),
        }
    )
    domain = config.build_domain()
    regime = make_regime(config, tmp_path, ModelCache(config))
    probed = list(regime.behaviour_simulators())
    assert [n for n, _ in probed] == ["anchored", "reactant"]
    assert regime.pooled_name("reactant") == "reactant" and regime.frozen_base() is None
    tasks = domain.scenarios("train")
    probes = probe_set(domain, tasks, 2, "")
    assert len(probes) == 2 * 8  # every fixed ask of the decision episode, per task
    assert all(not p.final for p in probes)  # the first reply already is the decision
    replies = {n: ask(domain, probes, user, 2, "s") for n, user in probed}
    assert replies["anchored"] == ask(domain, probes, probed[0][1], 2, "s")  # the same seeds
    row = Profiles(None, 0.005, 0.01, 0, 0, True).row(1, replies, {}, ["anchored", "reactant"])
    for n in ("anchored", "reactant"):
        assert 0.2 <= row[f"behaviour/decision/probe/mci/{n}"] <= 1  # 5 amounts: MCI >= 1/5
    assert 0 <= row["behaviour/decision/probe/scd"] <= 1
