"""P4GDomain: prompts, 10-message episodes that end at a donation, scoring, human outcome."""

import json

import pytest

from agents.domains.base import Domain, Outcome
from agents.domains.p4g import P4GDomain, human_outcome


@pytest.fixture(scope="module")
def domain():
    return P4GDomain()


@pytest.fixture(scope="module")
def persona(domain):
    return domain.scenarios()[0]


def exchange(*user_replies):
    """The persuader's greeting, then one persuader message before each reply after the first."""
    conversation = [{"role": "assistant", "content": "Hi there! How are you doing today?"}]
    for i, reply in enumerate(user_replies):
        if i:
            conversation.append({"role": "assistant", "content": f"Point number {i}."})
        conversation.append({"role": "user", "content": reply})
    return conversation


def test_bundled_personas_split_and_ids(domain):
    scenarios = domain.scenarios()
    train, test = domain.scenarios("train"), domain.scenarios("test")
    assert isinstance(domain, Domain) and domain.name == "p4g"
    assert len(scenarios) == 30 and len(train) + len(test) == 30 and test
    assert {s.id for s in train}.isdisjoint({s.id for s in test})
    assert len({s.id for s in scenarios}) == 30
    assert all(s.domain == "p4g" and s.title for s in scenarios)
    json.dumps([s.to_dict() for s in scenarios])  # a study stores payloads as JSON
    with pytest.raises(ValueError, match="split"):
        domain.scenarios("dev")


def test_prompts_keep_the_persona_away_from_the_persuader_and_the_human(domain):
    first, second = domain.scenarios()[:2]
    agent = domain.agent_system_prompt(first)
    assert "Save the Children" in agent and "$2" in agent and "honest" in agent.lower()
    assert agent == domain.agent_system_prompt(second)
    briefing = domain.user_instructions(first)
    assert "charity" in briefing and "bonus" in briefing
    assert briefing == domain.user_instructions(second)
    assert "personality" not in briefing.lower() and "[DONATE" not in briefing
    assert domain.greeting(first)


def test_the_texts_say_the_conversations_own_length(domain):
    scenario = domain.scenarios()[0]
    assert "up to 5 messages from each side" in domain.agent_system_prompt(scenario)  # 10 turns
    study = domain.with_turn_limit(16)  # a study allowing 8 messages from the participant
    assert "up to 8 messages from each side" in study.agent_system_prompt(scenario)
    assert "up to 8 messages from each side" in study.user_instructions(scenario)
    assert "five" not in study.agent_system_prompt(scenario) + study.user_instructions(scenario)
    assert domain.max_turns == 10 and study.scenarios() is not None  # the shared one unchanged


def test_simulated_persuadee_prompt_renders_the_traits(domain):
    scenarios = domain.scenarios()
    prompts = {domain.simulator_system_prompt(s) for s in scenarios}
    assert len(prompts) == len(scenarios)  # every persona reads differently
    skeptic = next(s for s in scenarios if s.payload["persona"]["big_five"]["agreeable"] <= 2.4)
    prompt = domain.simulator_system_prompt(skeptic)
    assert "[DONATE $N]" in prompt and "[DONATE $0]" in prompt
    assert "skeptical" in prompt
    assert f"{skeptic.payload['persona']['demographics']['age']}-year-old" in prompt


def test_state_is_fresh_and_serialisable(domain, persona):
    first, second = domain.new_state(persona), domain.new_state(persona)
    assert first is not second
    assert domain.load_state(persona, json.loads(json.dumps(domain.dump_state(first)))) == first
    assert domain.tools(persona) == []


def test_episode_ends_early_once_a_donation_is_made(domain):
    assert domain.is_done(exchange("Hi, fine thanks.")) is None
    assert domain.is_done(exchange("Hi.", "I won't donate $1, sorry.")) is None
    assert domain.is_done(exchange("Hi.", "Alright. [DONATE $0.50]")) == "donation"
    assert domain.is_done(exchange("Hi.", "No. [DONATE $0]")) == "donation"
    assert domain.is_done(exchange("Hi.", "I'll give 50 cents.")) == "donation"
    # The persuader naming an amount decides nothing.
    pitch = exchange("Hi.") + [{"role": "assistant", "content": "Please [DONATE $2]"}]
    assert domain.is_done(pitch) is None


def test_episode_lasts_ten_messages_without_a_donation(domain):
    five = exchange("Hi.", "Hmm.", "Tell me more.", "Not sure.", "Maybe later.")
    assert len(five) == 10
    assert domain.is_done(five[:9]) is None
    assert domain.is_done(five) == "max_turns"


@pytest.mark.parametrize(
    ("reply", "reward", "donation"),
    [("[DONATE $2]", 1.0, 2.0), ("[DONATE $0.50]", 0.25, 0.5), ("[DONATE $5]", 1.0, 2.0)],
)
def test_reward_is_half_the_donation(domain, reply, reward, donation):
    outcome = domain.score(exchange("Hi.", reply), {}, "donation")
    assert isinstance(outcome, Outcome)
    assert outcome.reward == pytest.approx(reward) and outcome.success
    assert outcome.components == {"donation": donation}
    assert outcome.details["donation_stated"] and outcome.details["end_reason"] == "donation"


def test_no_donation_and_zero_donation_score_nothing(domain):
    none = domain.score(exchange("Hi.", "Maybe another time."), {}, "max_turns")
    assert (none.reward, none.success, none.components["donation"]) == (0.0, False, 0.0)
    assert not none.details["donation_stated"]
    zero = domain.score(exchange("Hi.", "[DONATE $0]"), {}, "donation")
    assert (zero.reward, zero.success) == (0.0, False) and zero.details["donation_stated"]


def test_last_stated_amount_is_scored(domain):
    conversation = exchange("Hi.", "I'll give $0.50.", "Okay, make it $1.50 then.")
    assert domain.score(conversation, {}).components["donation"] == 1.5


def test_human_outcome_uses_the_questionnaire_and_records_the_chat():
    conversation = exchange("Hello!", "I'll donate $1.")
    outcome = human_outcome(0.5, conversation)
    assert outcome.reward == 0.25 and outcome.success
    assert outcome.components == {"donation": 0.5}
    assert outcome.details["chat_donation"] == 1.0 and outcome.details["answered"]
    silent = human_outcome(0, exchange("Hello!", "Interesting."))
    assert (silent.reward, silent.success, silent.details["chat_donation"]) == (0.0, False, None)
    unanswered = human_outcome(None, conversation)
    assert unanswered.reward == 0.0 and not unanswered.details["answered"]
    # through the Domain interface, as a study asks: the answer to its declared input decides
    (donation,) = P4GDomain.questionnaire_inputs
    assert (donation.name, donation.min_value, donation.max_value) == ("donation", 0, 2)
    assert "dollars from 0 to 2" in donation.describe()
    assert P4GDomain().outcome_from_answers({"donation": 2}, conversation).reward == 1.0
    # an answer it needs and did not get is an error, never "no donation"
    with pytest.raises(ValueError, match="no answer for donation"):
        P4GDomain().outcome_from_answers({"intended_donation": 1}, conversation)


def test_the_confirmation_never_turns_a_missing_decision_into_no_donation():
    domain = P4GDomain()
    silent = domain.score(exchange("Hello!", "Interesting."), {})
    assert silent.components["donation"] == 0.0  # the training reward's 0
    assert domain.confirmation(silent) == "You did not choose a donation."
    declined = domain.score(exchange("Hello!", "[DONATE $0]"), {})
    assert declined.details["chat_donation"] == 0.0
    assert "chose not to donate" in domain.confirmation(declined)
    answered = human_outcome(1.0, exchange("Hello!", "Interesting."))
    assert "donate $1.00" in domain.confirmation(answered)


@pytest.mark.parametrize("bad", [-0.5, 2.5, float("nan"), "1", True])
def test_human_outcome_rejects_bad_answers(bad):
    with pytest.raises(ValueError, match="intended donation"):
        human_outcome(bad, [])


def test_registry_serves_the_bundled_personas():
    from agents.domains import get_domain

    domain = get_domain("p4g")
    assert isinstance(domain, P4GDomain) and len(domain.scenarios()) == 30
