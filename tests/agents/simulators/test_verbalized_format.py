"""Verbalized Sampling's pure parts: the parser, the draw and the JSON schema."""

import json
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.domains.p4g import parse_donation
from agents.simulators import (
    VerbalizedSampling,
    draw,
    parse_verbalized,
    response_format,
    verbalized_schema,
)


def answer(items, **wrap):
    return json.dumps({"responses": items, **wrap})


FIVE = [{"text": f"reply {i}", "probability": p} for i, p in enumerate([0.4, 0.3, 0.15, 0.1, 0.05])]


def test_valid_output_gives_texts_and_probabilities():
    candidates = parse_verbalized(answer(FIVE))
    assert [c.text for c in candidates] == [f"reply {i}" for i in range(5)]
    assert [c.probability for c in candidates] == pytest.approx([0.4, 0.3, 0.15, 0.1, 0.05])


def test_probabilities_not_summing_to_one_are_normalized():
    items = [{"text": f"r{i}", "probability": p} for i, p in enumerate([4, 3, 2, 1, 0])]
    probabilities = [c.probability for c in parse_verbalized(answer(items))]
    assert sum(probabilities) == pytest.approx(1.0)
    assert probabilities[:4] == pytest.approx([0.4, 0.3, 0.2, 0.1], abs=1e-6)
    assert 0 < probabilities[4] < 1e-6  # zero is floored, so it can still be drawn


def test_all_zero_probabilities_become_uniform():
    items = [{"text": f"r{i}", "probability": 0} for i in range(5)]
    assert [c.probability for c in parse_verbalized(answer(items))] == pytest.approx([0.2] * 5)


@pytest.mark.parametrize(
    "wrapped",
    [
        "```json\n{}\n```",
        "```\n{}\n```",
        "Sure! Here are five replies:\n{}\nHope this helps.",
        'Thinking {{"draft": 1}} then {}',
    ],
)
def test_code_fences_and_text_around_the_json_are_ignored(wrapped):
    text = (
        wrapped.replace("{}", answer(FIVE), 1)
        if "{{" not in wrapped
        else wrapped.format(answer(FIVE))
    )
    assert [c.text for c in parse_verbalized(text)] == [f"reply {i}" for i in range(5)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("I think I'll donate $1.", "not JSON"),
        ("", "not JSON"),
        ('{"responses": [{"text": "a", "probability": 0.5}', "not as valid JSON"),  # cut off
        ('{"replies": []}', 'no JSON object with a "responses"'),
        ('[{"text": "a", "probability": 1}]', 'no JSON object with a "responses"'),
        ('{"responses": "hello"}', "must be a list"),
        (answer(FIVE[:4]), "expected exactly 5 responses, got 4"),
        (answer(FIVE + FIVE[:1]), "expected exactly 5 responses, got 6"),
        (answer([*FIVE[:4], {"text": "x"}]), "response 4: missing probability"),
        (answer([*FIVE[:4], {"probability": 0.1}]), "response 4: missing or empty text"),
        (answer([*FIVE[:4], {"text": "  ", "probability": 0.1}]), "missing or empty text"),
        (answer([*FIVE[:4], "just text"]), "response 4: expected an object"),
        (answer([*FIVE[:4], {"text": "x", "probability": -0.1}]), "finite and >= 0"),
        (answer([*FIVE[:4], {"text": "x", "probability": "high"}]), "must be a number"),
        (answer([*FIVE[:4], {"text": "x", "probability": None}]), "must be a number"),
        (answer([*FIVE[:4], {"text": "x", "probability": True}]), "must be a number"),
        (answer([*FIVE[:4], {"text": "x", "probability": 1e400}]), "finite"),
    ],
)
def test_malformed_output_raises_a_clear_error(text, message):
    with pytest.raises(ValueError, match=message):
        parse_verbalized(text)


def test_k_is_respected():
    assert len(parse_verbalized(answer(FIVE[:3]), k=3)) == 3
    with pytest.raises(ValueError, match="expected exactly 3"):
        parse_verbalized(answer(FIVE), k=3)


def test_donation_markers_survive_parsing():
    items = [{"text": f"Okay. [DONATE ${i * 0.5:.2f}]", "probability": 0.2} for i in range(5)]
    candidates = parse_verbalized(answer(items))
    assert [parse_donation(c.text) for c in candidates] == [0.0, 0.5, 1.0, 1.5, 2.0]


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.text(max_size=300),
        st.recursive(
            st.none() | st.booleans() | st.floats() | st.text(max_size=10),
            lambda inner: (
                st.lists(inner, max_size=6)
                | st.dictionaries(
                    st.sampled_from(["responses", "text", "probability", "x"]), inner, max_size=4
                )
            ),
            max_leaves=30,
        ).map(json.dumps),
    )
)
def test_any_output_parses_or_raises_value_error(text):
    try:
        candidates = parse_verbalized(text)
    except ValueError:
        return
    assert len(candidates) == 5
    assert sum(c.probability for c in candidates) == pytest.approx(1.0)


def test_draw_follows_the_probabilities():
    candidates = parse_verbalized(answer(FIVE))
    rng = random.Random(1234)
    counts = Counter(draw(candidates, rng).text for _ in range(20000))
    for candidate in candidates:
        assert counts[candidate.text] / 20000 == pytest.approx(candidate.probability, abs=0.015)


def test_random_mode_draws_uniformly():
    candidates = parse_verbalized(answer(FIVE))
    rng = random.Random(99)
    counts = Counter(draw(candidates, rng, mode="uniform").text for _ in range(20000))
    assert all(counts[c.text] / 20000 == pytest.approx(0.2, abs=0.015) for c in candidates)


def test_draw_is_reproducible_with_a_seed_and_checks_its_input():
    candidates = parse_verbalized(answer(FIVE))
    first = [draw(candidates, random.Random(7)).text for _ in range(3)]
    assert first == [draw(candidates, random.Random(7)).text for _ in range(3)]
    with pytest.raises(ValueError, match="mode"):
        draw(candidates, random.Random(), mode="greedy")
    with pytest.raises(ValueError, match="no candidates"):
        draw([], random.Random())


def test_schema_pins_exactly_k_items():
    schema = verbalized_schema(5)
    responses = schema["properties"]["responses"]
    assert responses["minItems"] == responses["maxItems"] == 5
    assert schema["required"] == ["responses"]
    assert set(responses["items"]["required"]) == {"text", "probability"}
    assert verbalized_schema(3)["properties"]["responses"]["maxItems"] == 3
    wrapped = response_format(5)
    assert wrapped["type"] == "json_schema" and wrapped["json_schema"]["schema"] == schema
    with pytest.raises(ValueError, match="positive integer"):
        verbalized_schema(0)


def test_an_answer_is_read_until_it_parses_then_falls_back_to_the_raw_text():
    """The retry rule both the endpoint simulator and the trainer's in-process one follow."""
    sampling = VerbalizedSampling(k=5, retries=1)
    answer_ = sampling.answer(random.Random(0), ["reply 0", "reply 1"])
    answer_.take("not json")
    assert not answer_.done and answer_.attempts == 1
    answer_.take(answer(FIVE))  # reply 2..4 are not allowed on this choice turn: a failed read
    assert answer_.done and answer_.turn.fell_back and answer_.turn.attempts == 2
    assert answer_.turn.text == answer(FIVE).strip() and "allowed texts" in answer_.turn.errors[1]

    allowed = [{"text": f"reply {i % 2}", "probability": 0.2} for i in range(5)]
    read = sampling.answer(random.Random(0), ["reply 0", "reply 1"])
    read.take(answer(allowed))
    assert read.done and not read.turn.fell_back and read.turn.text in ("reply 0", "reply 1")


@pytest.mark.parametrize(
    ("mode", "expected"), [("probability", [0.7, 0.3]), ("uniform", [0.6, 0.4])]
)
def test_a_choice_turns_distribution_is_the_one_the_draw_uses(mode, expected):
    texts = ["yes", "no", "yes", "no", "yes"]
    items = [
        {"text": t, "probability": p} for t, p in zip(texts, [0.4, 0.2, 0.2, 0.1, 0.1], strict=True)
    ]
    candidates = parse_verbalized(answer(items))
    sampling = VerbalizedSampling(mode=mode)
    assert sampling.distribution(candidates, ["yes", "no"]) == pytest.approx(expected)
    rng = random.Random(1)
    drawn = Counter(draw(candidates, rng, mode).text for _ in range(4000))
    assert drawn["yes"] / 4000 == pytest.approx(expected[0], abs=0.03)
