"""training/measures/diversity.py on inputs small enough to count by hand, its thresholds in the config,
and the embedding dispersion on a real local model folder (the tiny Llama)."""

import pytest

from training.config import parse_config
from training.config_keys import ConfigError
from training.config_schema import CollapseSpec
from training.measures.diversity import (
    Embedder,
    Warnings,
    crossed,
    dispersion,
    distinct_n,
    step_diversity,
    top_share,
    words,
)


def test_a_token_is_a_lowercased_word_without_punctuation():
    assert words("Hi, there! It's ME.") == ["hi", "there", "it's", "me"]
    assert words("[DONATE $0.50]") == ["donate", "0", "50"]


def test_distinct_n_counts_by_hand():
    # unigrams a b a b: 2 distinct of 4; bigrams ab ba ab: 2 distinct of 3
    assert distinct_n(["a b a b"], 1) == 0.5
    assert distinct_n(["a b a b"], 2) == pytest.approx(2 / 3)
    # the same reply twice: each bigram counted twice
    assert distinct_n(["see you", "See you!"], 2) == 0.5
    # n-grams do not cross turns: two one-word turns have no bigram
    assert distinct_n(["a", "b"], 2) is None
    assert distinct_n([], 1) is None


def test_top_share_compares_replies_by_their_words():
    assert top_share(["Hello!", "hello", "bye"]) == pytest.approx(2 / 3)
    assert top_share(["a", "b", "c", "d"]) == 0.25
    assert top_share([]) is None


def test_dispersion_is_the_mean_pairwise_cosine_distance():
    assert dispersion([[1, 0], [2, 0]]) == pytest.approx(0.0)
    assert dispersion([[1, 0], [0, 3]]) == pytest.approx(1.0)
    assert dispersion([[1, 0], [-1, 0]]) == pytest.approx(2.0)
    # pairs: (1,2) distance 0, (1,3) 1, (2,3) 1
    assert dispersion([[1, 0], [2, 0], [0, 3]]) == pytest.approx(2 / 3)
    assert dispersion([[1, 0]]) is None


def test_step_diversity_over_the_users_and_the_agents_turns():
    conversations = [
        [{"role": "user", "content": "Yes please"}, {"role": "assistant", "content": "ok then"}],
        [
            {"role": "user", "content": "yes, please!"},
            {"role": "assistant", "content": "no"},
            {"role": "user", "content": "why not"},
        ],
        [
            {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
            {"role": "user", "content": "maybe"},
        ],
    ]
    row = step_diversity(conversations)
    # user words: yes please | yes please | why not | maybe -> 5 distinct of 7
    assert row["sim/distinct_1"] == pytest.approx(5 / 7)
    # user bigrams: (yes please) x2, (why not): 2 distinct of 3
    assert row["sim/distinct_2"] == pytest.approx(2 / 3)
    # openings: "Yes please", "yes, please!", "maybe": 2 of 3 alike
    assert row["sim/top_opening_share"] == pytest.approx(2 / 3)
    # agent: ok then | no (the bare tool call is no text): 3 of 3 words, 1 of 1 bigram
    assert row["agent/distinct_1"] == 1.0 and row["agent/distinct_2"] == 1.0
    assert "sim/embedding_dispersion" not in row  # no embedding model: the key is not written
    # an embedding function gives the dispersion of the user turns
    same = step_diversity(conversations, embed=lambda texts: [[1.0, 0.0] for _ in texts])
    assert same["sim/embedding_dispersion"] == pytest.approx(0.0)


def test_a_threshold_warns_below_a_minimum_and_above_a_maximum():
    limits = CollapseSpec(
        min_sim_distinct_2=0.3, max_sim_top_opening_share=0.5, min_agent_entropy=0.05
    )
    calm = {"step": 1, "sim/distinct_2": 0.3, "sim/top_opening_share": 0.5, "entropy": 0.05}
    assert crossed(calm, limits) == []  # at the bound is not past it
    bad = {"step": 2, "sim/distinct_2": 0.25, "sim/top_opening_share": 1.0, "entropy": 0.01}
    found = crossed(bad, limits)
    assert [w["key"] for w in found] == ["sim/distinct_2", "sim/top_opening_share", "entropy"]
    assert found[0]["message"] == (
        "step 2: simulator reply diversity (distinct-2) 0.25 < collapse.min_sim_distinct_2 = 0.3"
    )
    # bounds of 0 (a max of 1) never warn
    off = CollapseSpec(min_sim_distinct_2=0.0, max_sim_top_opening_share=1.0, min_agent_entropy=0.0)
    assert crossed(bad, off) == []


def test_each_threshold_warns_once_and_a_resumed_run_remembers():
    limits = CollapseSpec()
    rows = [{"step": 1, "sim/distinct_2": 0.9}, {"step": 2, "sim/distinct_2": 0.1}]
    warnings = Warnings(limits, rows)  # steps already logged
    assert [w["step"] for w in warnings.seen] == [2]
    assert warnings.check({"step": 3, "sim/distinct_2": 0.1}) == []
    new = warnings.check({"step": 4, "sim/distinct_2": 0.1, "entropy": 0.0})
    assert [(w["step"], w["key"]) for w in new] == [(4, "entropy")]


BASE = {"name": "x", "domain": "letters"}


@pytest.mark.parametrize(
    ("collapse", "message"),
    [
        (
            {"min_sim_distinct_2": 1.5},
            "collapse.min_sim_distinct_2 must be >= 0 and <= 1 (got 1.5)",
        ),
        ({"min_agent_entropy": -1.0}, "collapse.min_agent_entropy must be >= 0 (got -1.0)"),
        ({"min_agent_entropy": "low"}, "collapse.min_agent_entropy must be float (got 'low')"),
        ({"min_distinct_2": 0.3}, "unknown key 'collapse.min_distinct_2'; did you mean"),
    ],
)
def test_bad_thresholds_are_errors_naming_the_key(collapse, message):
    with pytest.raises(ConfigError) as error:
        parse_config({**BASE, "collapse": collapse})
    assert message in str(error.value)
    assert error.value.key.startswith("collapse.")


def test_the_defaults_are_the_documented_ones():
    limits = parse_config(BASE).collapse
    assert (limits.min_sim_distinct_2, limits.max_sim_top_opening_share) == (0.3, 0.5)
    assert (limits.min_agent_entropy, limits.min_sim_dispersion) == (0.05, 0.0)
    assert limits.embedding_model == ""


def test_an_embedding_model_is_a_local_folder(tmp_path, tiny_model):
    with pytest.raises(ValueError, match="collapse.embedding_model: no model folder at"):
        Embedder(tmp_path / "absent")
    from training.measures.behaviour_space import BehaviourEmbedder

    # the same embedder under [behaviour] names its own setting
    with pytest.raises(ValueError, match="behaviour.embedder: no model folder at"):
        BehaviourEmbedder(tmp_path / "absent")
    embed = Embedder(tiny_model)
    assert dispersion(embed(["the same words", "the same words"])) == pytest.approx(0.0, abs=1e-6)
    assert dispersion(embed(["the same words", "zebra quantum 1987 ??"])) > 0.001
