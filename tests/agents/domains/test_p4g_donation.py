"""The P4G donation parser: markers, plain statements, negations, last amount wins."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.domains.p4g import conversation_donation, parse_donation

STATED = [
    ("[DONATE $1]", 1.0),
    ("[DONATE $0]", 0.0),
    ("[donate $1.25]", 1.25),
    ("Okay, you convinced me. [DONATE $0.50]", 0.5),
    ("[DONATE 2]", 2.0),
    ("I'll donate $1.50", 1.5),
    ("I will give 50 cents", 0.5),
    ("I'd like to donate 1 dollar", 1.0),
    ("count me in for $0.5", 0.5),
    ("Sure, happy to give $1!", 1.0),
    ("No problem, I'll donate $1", 1.0),
    ("I can chip in $0.25 for the kids.", 0.25),
    ("put me down for a dollar", 1.0),
    ("I would like to give twenty five cents", 0.25),
    ("I can give half a dollar", 0.5),
    ("I'll give half", 1.0),
    ("I'll donate 50%", 1.0),
    ("I'll donate my whole bonus", 2.0),
    ("I'll give 1.5 dollars.", 1.5),
    ("I'll donate .5", 0.5),
    ("I’m donating $1", 1.0),  # curly apostrophe as typed on phones
]

NOT_STATED = [
    "I won't donate $1",
    "I don't want to give $2",
    "not donating",
    "I'm not donating $1",
    "I can’t donate $1",
    "I'd rather not give $2",
    "I will never give $2 to a charity I do not know.",
    "I love to, but I can't give $1",
    "I'm not sure I'll donate $1",
    "Should I donate $1?",
    "I'll donate $1?",
    "I think you should donate $2",
    "Donating $2 is a lot for me.",
    "I donated $5 last year.",
    "I'll give it 5 stars",
    "I have $2 and I want to keep it",
    "Hi. I am doing good. How about you?",
    "",
]


@pytest.mark.parametrize(("text", "amount"), STATED)
def test_stated_donations_are_read(text, amount):
    assert parse_donation(text) == pytest.approx(amount)


@pytest.mark.parametrize("text", NOT_STATED)
def test_negations_questions_and_other_talk_are_not_donations(text):
    assert parse_donation(text) is None


@pytest.mark.parametrize(
    ("text", "amount"),
    [
        ("I'll donate $1. Actually make it $2.", 2.0),
        ("I won't donate $2, but I'll donate $1", 1.0),
        ("I'll give you $1 for the kids, not $2", 1.0),
        ("I'll donate $1 [DONATE $0.5]", 0.5),
        ("[DONATE $1] Hmm, I'll donate $2 instead.", 2.0),
        ("[DONATE $0.2] [DONATE $1.8]", 1.8),
    ],
)
def test_last_amount_in_a_message_wins(text, amount):
    assert parse_donation(text) == pytest.approx(amount)


@pytest.mark.parametrize(("text", "amount"), [("[DONATE $5]", 2.0), ("I'll donate $100", 2.0)])
def test_amounts_are_clamped_to_the_payment(text, amount):
    assert parse_donation(text) == amount


def test_conversation_takes_the_last_persuadee_amount_and_ignores_the_persuader():
    conversation = [
        {"role": "assistant", "content": "Hi! Would you donate $2? [DONATE $2]"},
        {"role": "user", "content": "I'll give $0.50."},
        {"role": "assistant", "content": "Could you do $1?"},
        {"role": "user", "content": "Fine. [DONATE $1]"},
        {"role": "user", "content": "Thanks, bye!"},  # no amount: the earlier one stands
        {"role": "user", "content": None},
        {"role": "user", "content": [{"type": "text", "text": "hmm"}]},
    ]
    assert conversation_donation(conversation) == 1.0
    assert conversation_donation(conversation[:3]) == 0.5
    assert conversation_donation(conversation[:1]) is None
    assert conversation_donation([]) is None


def test_content_parts_are_read():
    message = {"role": "user", "content": [{"type": "text", "text": "[DONATE $0.75]"}]}
    assert conversation_donation([message]) == 0.75


# Random text alone rarely says anything about money; this mixes the parser's own words in.
WORDS = (
    "I I'll I'd we you not never won't don't donate give giving donated count me in for "
    "$1 $0.50 $ 2 1.5 .5 50 cents dollar a half all of it [DONATE $1] [DONATE [donate $ ] , . ? ! ; "
    "but sure happy to should can make it the kids charity 5 stars \n ’"
).split(" ")
CHAT = st.one_of(st.text(max_size=200), st.lists(st.sampled_from(WORDS), max_size=40).map(" ".join))


@settings(max_examples=400, deadline=None)
@given(CHAT)
def test_random_text_never_crashes_and_stays_in_range(text):
    amount = parse_donation(text)
    assert amount is None or 0.0 <= amount <= 2.0


@settings(max_examples=300, deadline=None)
@given(CHAT, st.integers(min_value=0, max_value=400))
def test_a_marker_at_the_end_wins(text, cents):
    amount = parse_donation(f"{text} [DONATE ${cents / 100:.2f}]")
    assert amount == pytest.approx(min(cents / 100, 2.0))


NEGATED = st.builds(
    "{} {} {} {}".format,
    st.sampled_from(["I", "Honestly I", "Sorry, I", "we"]),
    st.sampled_from(
        [
            "won't",
            "will not",
            "don't want to",
            "can't",
            "cannot",
            "am not going to",
            "would rather not",
            "refuse to",
            "never",
            "do not plan to",
            "wouldn't",
        ]
    ),
    st.sampled_from(["donate", "give", "contribute", "pledge", "chip in", "spare"]),
    st.sampled_from(["$1", "$0.50", "2 dollars", "50 cents", "a dollar", "1.5", "half"]),
)


@settings(max_examples=300, deadline=None)
@given(NEGATED)
def test_negated_statements_never_count(statement):
    assert parse_donation(statement) is None


@settings(max_examples=300, deadline=None)
@given(CHAT, NEGATED)
def test_appending_a_negated_statement_changes_nothing(text, statement):
    assert parse_donation(f"{text}. {statement}") == parse_donation(text)
