"""agents/domains/episode.py: the turn rules training's rollouts and studies' held-out
conversations share, read from the Domain where it has its own."""

from agents.domains import episode
from agents.domains.base import Domain, Outcome


class Chat(Domain):
    """A bare Domain: every rule is the interface's default unless a test sets it."""

    name = "chat"
    max_turns = 6

    def scenarios(self, split=None):
        return []

    def agent_system_prompt(self, scenario):
        return ""

    def new_state(self, scenario):
        return {}

    def user_instructions(self, scenario):
        return ""

    def simulator_system_prompt(self, scenario):
        return ""

    def score(self, conversation, state, end_reason=None):
        return Outcome(0.0, False)


def said(*roles):
    return [{"role": r, "content": "hi"} for r in roles]


def test_the_turn_limit_is_the_runs_capped_by_the_domains():
    assert episode.turn_limit(Chat(), 10) == 6 and episode.turn_limit(Chat(), 4) == 4


def test_the_agent_opens_when_the_domain_says_so():
    opens = Chat()
    assert not episode.agent_first(opens)
    opens.first_speaker = episode.AGENT
    assert episode.agent_first(opens)


def test_the_users_last_message_is_the_one_before_the_limit():
    assert not episode.user_final(said("assistant"), 3)
    assert episode.user_final(said("assistant", "user"), 3)


def test_tool_rounds_count_consecutive_calling_turns():
    assert episode.tool_rounds_after(0, True) == 1 and episode.tool_rounds_after(1, True) == 2
    assert episode.tool_rounds_after(2, False) == 0


def test_a_conversation_ends_at_the_turn_limit_as_the_domain_counts_turns():
    domain = Chat()
    assert episode.end_reason(domain, said("user", "assistant"), 3, 0, 4) is None
    assert episode.end_reason(domain, said("user", "assistant", "user"), 3, 0, 4) == "max_turns"
    domain.turn_count = lambda conversation: 0  # e.g. CooperBench counts its own steps
    assert episode.end_reason(domain, said("user", "assistant", "user"), 3, 0, 4) is None


def test_tool_rounds_end_it_only_where_the_domain_lets_them():
    domain = Chat()
    assert episode.end_reason(domain, said("user"), 10, 3, 4) is None
    assert episode.end_reason(domain, said("user"), 10, 4, 4) == "max_tool_rounds"
    domain.limits_tool_rounds = False
    assert episode.end_reason(domain, said("user"), 10, 4, 4) is None


def test_the_domains_own_reason_comes_first():
    domain = Chat()
    domain.is_done = lambda conversation: "user_stop"
    assert episode.end_reason(domain, said("user"), 1, 9, 4) == "user_stop"
