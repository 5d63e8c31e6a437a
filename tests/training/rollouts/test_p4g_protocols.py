"""P4G's two protocols, each played for one episode by the real rollout loop (play) against a
scripted persuadee: parley's honest persuader (the studies' default) and the paper's release
(agents/domains/p4g/release.py). The release's data is a fixture in the official format
(tests/fixtures/p4g_release: full_info.csv and the release's train/ and test/ folders), written
for these tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.domains import get_domain
from agents.domains.p4g import P4GDomain
from agents.domains.p4g.release import release_donation
from training.rollouts.rollout import play

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "p4g_release"


class ScriptedPersuader:
    """The policy's seat: numbered messages, and what the Domain showed it."""

    role = "agent"

    def __init__(self):
        self.seen: list[list[dict]] = []

    def respond(self, domain, rollouts):
        for r in rollouts:
            self.seen.append(list(r.conversation))
            sent = sum(m["role"] == "assistant" for m in r.conversation)
            r.add_message("agent", f"Persuader message {sent + 1}.", [], domain)


class ScriptedPersuadee:
    """Replies in order; on a turn where the Domain constrains the reply (parley's final
    decision) it takes the choice named by `pick` and records the choices it was offered."""

    role = "user"

    def __init__(self, replies: list[str], pick: str = "[DONATE $0]"):
        self.replies, self.pick = list(replies), pick
        self.offered: list[list[str] | None] = []

    def respond(self, domain, rollouts):
        for r in rollouts:
            choices = domain.user_choices(r.scenario, r.conversation, r.user_final)
            self.offered.append(choices)
            text = self.replies.pop(0)
            r.add_user_reply(domain, self.pick if choices else text)


def test_the_release_protocol_plays_as_released():
    domain = get_domain("p4g", FIXTURE, "release")
    train, test = domain.scenarios("train"), domain.scenarios("test")
    # the release's split: the file names of train/ and test/, read in sorted order; a corpus
    # dialogue in neither (fx-0005) is no task, and its donation outside 0..2 filters nothing
    assert [s.payload["dialogue_id"] for s in train] == ["fx-0001", "fx-0002", "fx-0003"]
    assert [s.payload["dialogue_id"] for s in test] == ["fx-0004"]
    scenario = train[2]  # fx-0003: persuader fx_user_11 (29, Female), persuadee fx_user_12
    agent_prompt = domain.agent_system_prompt(scenario)
    # the persuader's own persona, a bonus equal to the donation, not too early, under 50 words
    assert "Age: 29, Sex: Female" in agent_prompt and "Age: 61" not in agent_prompt
    assert "bonus equal to whatever amount your partner donates" in agent_prompt
    assert "Do not propose or agree to a donation too early" in agent_prompt
    assert "under 50 words" in agent_prompt and "for 5 chat turns" in agent_prompt
    user_prompt = domain.simulator_system_prompt(scenario)
    assert "Age: 61, Sex: Male" in user_prompt and "Age: 29" not in user_prompt
    assert "[DONATE $N] or [GIVE $N]" in user_prompt and "make decision wisely" in user_prompt

    # no amount stated: the last reply is free text (never forced to a marker), 5 exchanges
    replies = ["Hi, fine thanks.", "Hmm.", "Why?", "Tell me more.", "Let me think about it."]
    persuader, persuadee = ScriptedPersuader(), ScriptedPersuadee(replies)
    (rollout,) = play(domain, [scenario], persuader, persuadee, max_turns=10)
    conversation = rollout.conversation
    assert conversation[0] == {"role": "assistant", "content": "Persuader message 1."}
    assert persuader.seen[0] == []  # the policy opens: no greeting before its first message
    assert [m["role"] for m in conversation] == ["assistant", "user"] * 5
    assert persuadee.offered == [None] * 5  # no turn constrained, the last one included
    assert conversation[-1]["content"] == replies[-1]
    assert rollout.end_reason == "max_turns" and rollout.reward == 0.0

    # $0 talks on; a donation above $0 ends the episode at once, on the persuadee's message
    # ([GIVE $N]); a statement counts by the release's reading, negation or not
    for reply, reward in (("OK, [GIVE $0.75]", 0.375), ("No. I won't donate $1.", 0.5)):
        persuadee = ScriptedPersuadee(["Hello.", "[DONATE $0]", reply, "unused"])
        (rollout,) = play(domain, [scenario], ScriptedPersuader(), persuadee, max_turns=10)
        assert rollout.end_reason == "donation" and len(rollout.conversation) == 6
        assert rollout.conversation[-1]["role"] == "user" and rollout.reward == reward
    assert not domain.closing_reply("donation")


def test_parley_protocol_keeps_its_honest_persuader():
    domain = P4GDomain()  # the default: the studies' protocol on the bundled personas
    assert domain.protocol == get_domain("p4g").protocol == "parley"
    scenario = domain.scenarios("train")[0]
    assert "honest" in domain.agent_system_prompt(scenario).lower()
    assert "bonus" not in domain.agent_system_prompt(scenario)
    # no donation stated: the persuadee's last reply is forced to one of the five markers
    persuadee = ScriptedPersuadee(["Hi.", "Hmm.", "Tell me more.", "Why?", "free text"])
    (rollout,) = play(domain, [scenario], ScriptedPersuader(), persuadee, max_turns=10)
    assert rollout.conversation[0]["content"] == domain.greeting(scenario)  # the fixed greeting
    assert persuadee.offered[:4] == [None] * 4
    assert persuadee.offered[4] == [
        "[DONATE $0]",
        "[DONATE $0.50]",
        "[DONATE $1]",
        "[DONATE $1.50]",
        "[DONATE $2]",
    ]
    assert rollout.conversation[-1]["content"] == "[DONATE $0]"
    # a stated $0 ends parley's chat, and parley's reader does not count a refusal
    persuadee = ScriptedPersuadee(["I won't donate $1.", "[DONATE $0]", "unused"])
    (rollout,) = play(domain, [scenario], ScriptedPersuader(), persuadee, max_turns=10)
    assert rollout.end_reason == "donation" and len(rollout.conversation) == 4
    assert rollout.reward == 0.0 and domain.closing_reply("donation")


@pytest.mark.parametrize(
    "text, amount",
    [
        ("[DONATE $1.25]", 1.25),
        ("[give $0.2] and then [DONATE $1]", 1.0),  # a message's last marker
        ("I will donate $0.50 and give 1", 1.0),  # else its last statement
        ("I won't donate $1", 1.0),  # negation is not read
        ("I'll give you $1", None),  # a word between the verb and the amount
        ("contributing the whole $2", 2.0),
        ("[DONATE $5]", 5.0),  # not clamped: the reward caps at 1
        ("Sure, happy to help", None),
    ],
)
def test_the_release_reader_of_donations(text, amount):
    assert release_donation([{"role": "user", "content": text}]) == amount
    assert release_donation([{"role": "assistant", "content": text}]) is None  # persuadee only


def test_the_release_protocol_needs_its_data_and_split(tmp_path):
    with pytest.raises(ValueError, match="needs the official data"):
        P4GDomain(protocol="release")
    with pytest.raises(ValueError, match="no protocol 'honest'"):
        get_domain("p4g", None, "honest")
    (tmp_path / "full_info.csv").write_text((FIXTURE / "full_info.csv").read_text())
    with pytest.raises(FileNotFoundError, match="data/p4g/train"):
        P4GDomain(tmp_path, "release").scenarios()
    with pytest.raises(FileNotFoundError, match="full_info.csv"):
        P4GDomain(tmp_path / "absent", "release").scenarios()


def test_a_persons_chat_amount_is_read_by_the_studys_protocol():
    """The questionnaire's answer decides a person's outcome under either protocol; the amount
    stated in the chat beside it is read as the protocol reads a persuadee."""
    chat = [
        {"role": "assistant", "content": "Hi!"},
        {"role": "user", "content": "I won't donate $1"},
    ]
    parley = P4GDomain().outcome_from_answers({"donation": 0.5}, chat)
    released = get_domain("p4g", FIXTURE, "release").outcome_from_answers({"donation": 0.5}, chat)
    assert parley.reward == released.reward == 0.25
    assert parley.details["chat_donation"] is None and released.details["chat_donation"] == 1.0
