"""Personal details in participants' own turns are replaced before a simulator learns them;
what the scenario gave the participant stays."""

from collections import Counter

import pytest

from studies.lib.redact import redact


@pytest.mark.parametrize(
    "text, expected",
    [
        ("write to jo.smith+x@example.co.uk please", "write to [email] please"),
        ("call +44 20 7946 0958 or (555) 123-4567", "call [phone] or [phone]"),
        ("see https://evil.example/a?b=1 and www.x.org", "see [link] and [link]"),
        ("my id is 5f0c0ffee0ddba11c0ffee01.", "my id is [id]."),
        # what is not a personal detail is left alone
        ("I give $1,000 from zip 94107, order #W2378156", None),
        ("I'm 34 and earn 52000 a year", None),
    ],
)
def test_details_are_replaced_and_ordinary_words_and_numbers_kept(text, expected):
    assert redact(text) == (text if expected is None else expected)


def test_what_the_scenario_gave_the_participant_is_kept_and_the_rest_counted():
    scenario = '{"email": "yusuf.rossi@example.com", "zip": "19122"}'
    counts = Counter()
    text = "I'm yusuf.rossi@example.com (really me@home.net), phone 415 555 0199"
    out = redact(text, scenario, counts)
    assert out == "I'm yusuf.rossi@example.com (really [email]), phone [phone]"
    assert counts == {"email": 1, "phone": 1}
