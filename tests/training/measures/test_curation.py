"""Curation (training/measures/curation.py): the quality gate, the diversity weights by their
formula on constructed behaviour spaces, the per-batch normalisation, the ESS, and the config."""

import math

import numpy as np
import pytest

from agents.behaviour.space import BehaviourSpace
from agents.domains.base import Scenario
from agents.domains.episode import USER
from training.config import parse_config
from training.config_keys import ConfigError
from training.config_schema import CurationSpec
from training.measures.curation import (
    GATES,
    Curation,
    Summary,
    ess,
    gate_reasons,
    kernel_density,
    normalise,
)
from training.measures.profiles import Reply
from training.rl.distributed import Ranks
from training.rollouts.rollout import Decision, Rollout
from training.rollouts.turns import speak
from training.vocabulary import CURATION_GATES

E = math.exp

# -- the gate -----------------------------------------------------------------------------------


def rollout(*user_turns, **fields):
    r = Rollout(Scenario("t", "letters", {}), None, [], **fields)
    for text in user_turns:
        r.conversation += [
            {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": text},
        ]
    return r


def test_the_gate_drops_what_the_simulators_side_got_wrong():
    assert gate_reasons(rollout("Hi.", "Fine.")) == []
    assert gate_reasons(rollout("Hi.", fallbacks=1)) == ["fallback"]
    assert gate_reasons(rollout("Hi.", "  ")) == ["empty"]
    assert gate_reasons(rollout("Hi.", cut_turns={USER: 1})) == ["cut"]
    broken = 'Order? <tool_call>{"name": "find_user"</tool_call>'
    assert gate_reasons(rollout(broken, user_tools=[{"name": "find_user"}])) == ["parse"]
    # several reasons at once, in GATES' order; a subset of gates checks only those
    both = rollout("", fallbacks=2, cut_turns={USER: 1})
    assert gate_reasons(both) == ["fallback", "empty", "cut"]
    assert gate_reasons(both, ["cut"]) == ["cut"]
    assert gate_reasons(both, []) == []


def test_the_gate_leaves_the_agents_own_failures_and_well_formed_turns_alone():
    # the agent's cut turn is for its reward to teach, never gated
    assert gate_reasons(rollout("Hi.", cut_turns={"agent": 3})) == []
    # a user turn that is only a tool call has no text and is not empty
    call = rollout("Hi.")
    call.conversation.append({"role": "user", "content": "", "tool_calls": [{"id": "1"}]})
    assert gate_reasons(call) == []
    # a block in the text of a user without tools is text, not a failed call
    assert gate_reasons(rollout("I wrote <tool_call> here")) == []


class StubLM:
    """The two things speak() asks of a model for a free turn: sampled ids and their text."""

    stop_ids = [2]

    def sample(self, prompts, temperature, max_new_tokens, caches=None):
        return [[5, 6, 2], [5, 6, 7]]  # the first stopped, the second ran out of tokens

    def decode(self, ids):
        return "words"


def test_a_turn_that_ran_out_of_tokens_is_counted_as_cut_for_its_speaker():
    stopped, cut = rollout(), rollout()
    speak(StubLM(), USER, [stopped, cut], [[1], [1]], [None, None], 1.0, 3, None)
    assert stopped.cut_turns == {} and cut.cut_turns == {USER: 1}
    speak(StubLM(), "agent", [stopped, cut], [[1], [1]], [None, None], 1.0, 3, None)
    assert cut.cut_turns == {USER: 1, "agent": 1}


# -- normalisation and ESS -----------------------------------------------------------------------


def test_weights_are_normalised_to_mean_one_over_the_kept_rollouts():
    w = normalise([2.0, 1.0, 5.0, 1.0], [True, True, False, True])
    assert w == pytest.approx([1.5, 0.75, 0.0, 0.75])
    assert normalise([1.0] * 4, [True] * 4) == [1.0] * 4  # exactly, not approximately
    assert normalise([3.0, 1.0], [False, False]) == [0.0, 0.0]
    # clipped after the first normalisation, then normalised once more: raw 1, 1, 10 is
    # 0.25, 0.25, 2.5; clipped at 2 that is 0.25, 0.25, 2 (sum 2.5); times 3 / 2.5
    assert normalise([1.0, 1.0, 10.0], [True] * 3, max_weight=2.0) == pytest.approx([0.3, 0.3, 2.4])
    # a floor lifts the smallest: 0.1, 1.9 -> 0.5, 1.9 -> times 2 / 2.4
    assert normalise([1.0, 19.0], [True, True], min_weight=0.5) == pytest.approx(
        [0.5 * 2 / 2.4, 1.9 * 2 / 2.4]
    )


def test_the_effective_sample_size():
    assert ess([1.0, 1.0, 1.0, 1.0]) == 4.0
    assert ess([3.0, 1.0, 0.0]) == pytest.approx(16 / 10)  # (3 + 1)^2 / (9 + 1); 0 left out
    assert ess([4.0, 0.0, 0.0, 0.0]) == 1.0
    assert ess([0.0, 0.0]) == 0.0


def test_the_kernel_density_by_hand():
    z = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    # h = 1: the two at (1, 0) are 0 apart (kernel 1), each sqrt(2) from (0, 1) (kernel e^-1)
    assert kernel_density(z, 1.0) == pytest.approx([(1 + E(-1)) / 2, (1 + E(-1)) / 2, E(-1)])
    # bandwidth 0: h = the median distance, sqrt(2): kernels 1 and e^-1/2
    assert kernel_density(z) == pytest.approx([(1 + E(-0.5)) / 2] * 2 + [E(-0.5)])
    assert kernel_density(z[:1]).tolist() == [0.0]  # one rollout: no crowd
    assert kernel_density(np.ones((3, 2))) == pytest.approx([1.0, 1.0, 1.0])


# -- the weights, on a constructed space ---------------------------------------------------------

POINTS = {"a": [1.0, 0.0], "b": [0.0, 1.0], "c": [-1.0, 0.0]}


def space():
    """Two clusters at a and b; a text embeds at its POINTS entry (centred on 0: unchanged)."""
    return BehaviourSpace(
        {},
        np.zeros(2),
        np.array(list(POINTS.values())[:2]),
        [0.5, 0.5],
        2,
        embed=lambda texts: [POINTS[t] for t in texts],
    )


def spec(**fields):
    return CurationSpec(**({"enabled": True, "alpha": 1.0, "bandwidth": 1.0} | fields))


def test_crowded_rollouts_weigh_less_by_the_formula():
    rollouts = [
        Summary("training", ["a"], []),
        Summary("training", ["a"], []),
        Summary("training", ["b"], []),
    ]
    weights, row = Curation(spec(), space()).weigh(rollouts)
    raw = [E(-(1 + E(-1)) / 2)] * 2 + [E(-E(-1))]  # exp(-alpha density); 1/MCI alike (one sim)
    assert weights == pytest.approx([3 * r / sum(raw) for r in raw])
    assert weights[2] > weights[0]
    assert row["curation/ess"] == pytest.approx(sum(weights) ** 2 / sum(w * w for w in weights))
    assert row["curation/kept"] == 3 and row["curation/gated"] == 0
    assert row["curation/modes"] == 2 and row["curation/mci/training"] == pytest.approx(5 / 9)
    # alpha = 0: the density is ignored, every weight 1
    assert Curation(spec(alpha=0.0), space()).weigh(rollouts)[0] == pytest.approx([1.0] * 3)


def test_a_high_mci_simulator_weighs_less():
    """alpha = 0: w = 1/MCI, from the probe replies where the simulator was probed."""
    rollouts = [Summary("x", ["a"], []), Summary("y", ["b"], [])]
    probed = {
        "x": [Reply("a", None), Reply("a", None)],  # one mode: MCI 1
        "y": [  # two even: MCI 1/2
            Reply("a", None),
            Reply("b", None),
            Reply("$2", Decision(USER, ["$0", "$2"], [0.5, 0.5], 1)),
        ],
    }
    weights, row = Curation(spec(alpha=0.0), space()).weigh(rollouts, probed)
    assert weights == pytest.approx([2 / 3, 4 / 3])  # 1 and 2, mean 1
    assert row["curation/mci/x"] == 1.0 and row["curation/mci/y"] == 0.5
    # not probed: each simulator's MCI from its turns in the step (one mode each: alike)
    assert Curation(spec(alpha=0.0), space()).weigh(rollouts)[0] == pytest.approx([1.0, 1.0])


def test_mode_balance_gives_each_cluster_present_an_equal_share():
    rollouts = [Summary("training", [t], []) for t in ("a", "a", "a", "b")]
    balanced = Curation(spec(diversity=False, mode_balance=True), space())
    weights, row = balanced.weigh(rollouts)
    assert weights == pytest.approx([2 / 3, 2 / 3, 2 / 3, 2.0])  # each cluster 2 of the 4
    assert row["curation/modes"] == 2
    # one cluster present: nothing to balance
    weights, row = balanced.weigh(rollouts[:3])
    assert weights == [1.0, 1.0, 1.0] and row["curation/modes"] == 1
    # a lone rollout of a rare mode is held to max_weight (then the mean is 1 again)
    rare = [Summary("training", ["a"], [])] * 9 + [Summary("training", ["b"], [])]
    weights, _ = Curation(spec(diversity=False, mode_balance=True, max_weight=2.0), space()).weigh(
        rare
    )
    assert weights[-1] == pytest.approx(2 * 10 / (9 * 5 / 9 + 2))
    assert sum(weights) == pytest.approx(10)


def test_the_gate_comes_before_any_weighting():
    """A gated rollout gets 0 and is no one's neighbour: the kept two, a and b, are alike."""
    rollouts = [
        Summary("training", ["a"], ["cut"]),
        Summary("training", ["a"], []),
        Summary("training", ["b"], []),
    ]
    weights, row = Curation(spec(), space()).weigh(rollouts)
    assert weights == pytest.approx([0.0, 1.0, 1.0])
    assert row["curation/gated"] == 1 and row["curation/gated/cut"] == 1
    assert row["curation/gated/fallback"] == 0 and row["curation/kept"] == 2
    assert row["curation/ess"] == pytest.approx(2.0)
    assert row["curation/ess_share"] == pytest.approx(1.0)


def test_a_rollout_without_free_text_gets_the_measured_ones_mean():
    rollouts = [
        Summary("training", ["a"], []),
        Summary("training", ["a"], []),
        Summary("training", ["b"], []),
        Summary("training", [], []),
    ]
    weights, _ = Curation(spec(), space()).weigh(rollouts)
    raw = [E(-(1 + E(-1)) / 2)] * 2 + [E(-E(-1))]
    raw.append(sum(raw) / 3)
    assert weights == pytest.approx([4 * r / sum(raw) for r in raw])


def test_the_gate_alone_needs_no_space_and_weighs_every_kept_rollout_one():
    weights, row = Curation(spec(diversity=False)).weigh(
        [Summary("training", ["x"], []), Summary("training", [], ["fallback", "empty"])]
    )
    assert weights == [1.0, 0.0]
    assert row["curation/gated/fallback"] == 1 and row["curation/gated/empty"] == 1
    assert row["curation/ess"] == 1.0 and "curation/density_mean" not in row
    with pytest.raises(ValueError, match="need the run's behaviour space"):
        Curation(spec()).weigh([Summary("training", ["x"], [])])


def test_a_step_gives_each_rank_its_own_rows_weights():
    mine = [rollout("a"), rollout("", member="current"), rollout("b")]
    weights, row = Curation(spec(bandwidth=0.0), space()).step(
        mine, {}, Ranks(), lambda member: "training"
    )
    assert weights.tolist() == pytest.approx([1.0, 0.0, 1.0]) and row["curation/gated/empty"] == 1


# -- the config -----------------------------------------------------------------------------------


def config(curation, behaviour=None):
    return parse_config(
        {"name": "c", "domain": "letters", "curation": curation, "behaviour": behaviour or {}}
    )


def test_curation_is_off_by_default_and_its_gates_are_the_modules():
    c = parse_config({"name": "c", "domain": "letters"}).curation
    assert not c.enabled and not c.weighs
    assert tuple(CURATION_GATES) == GATES and c.gate == list(GATES)


@pytest.mark.parametrize(
    "curation, behaviour, key, message",
    [
        ({"enabled": True}, None, "curation.diversity", "set behaviour.reference"),
        (
            {"enabled": True, "diversity": False, "mode_balance": True},
            None,
            "curation.mode_balance",
            "set behaviour.reference",
        ),
        (
            {"enabled": True, "gate": [], "diversity": False},
            None,
            "curation.enabled",
            "curates nothing",
        ),
        (
            {"gate": ["cut", "late"]},
            None,
            "curation.gate[1]",
            "must be one of fallback, empty, cut, parse",
        ),
        ({"gate": ["cut", "cut"]}, None, "curation.gate", "names a reason twice"),
        ({"alpha": -0.5}, None, "curation.alpha", "must be >= 0 and <= 50"),
        ({"max_weight": 0.5}, None, "curation.max_weight", "must be >= 1"),
        ({"min_weight": 1.5}, None, "curation.min_weight", "must be >= 0 and <= 1"),
        ({"bandwidth": 9.0}, None, "curation.bandwidth", "must be >= 0 and <= 4"),
        ({"alhpa": 1.0}, None, "curation.alhpa", "did you mean 'alpha'"),
    ],
)
def test_bad_curation_settings_are_refused_by_name(curation, behaviour, key, message):
    with pytest.raises(ConfigError, match=message) as refused:
        config(curation, behaviour)
    assert refused.value.key == key


def test_diversity_weights_with_a_behaviour_space_are_accepted():
    c = config({"enabled": True, "mode_balance": True}, {"reference": "texts:/x.jsonl"})
    assert c.curation.weighs and c.behaviour.enabled
