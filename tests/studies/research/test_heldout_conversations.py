"""studies' held-out conversations play by training's turn rules (agents/domains/episode.py):
the Domain says who speaks next, how turns count and whether tool rounds end a conversation.
Before, studies kept its own copy of the rules, which alternated the speakers, counted every
visible message and always applied max_tool_rounds, whatever the Domain said."""

import random
from types import SimpleNamespace

from agents.domains.base import Domain, Outcome, Scenario
from agents.llm import ChatResult
from studies.research.heldout_conversations import Agent, User, make_user, play

SCENARIO = Scenario(id="t", domain="pair", payload={})
CALL = {"id": "c1", "type": "function", "function": {"name": "look", "arguments": "{}"}}


class Pair(Domain):
    """The user opens; then the agent takes two messages in a row before the user answers."""

    name = "pair"
    max_turns = 30

    def scenarios(self, split=None):
        return [SCENARIO]

    def agent_system_prompt(self, scenario):
        return ""

    def tools(self, scenario):
        return [{"type": "function", "function": {"name": "look", "parameters": {}}}]

    def execute_tool(self, state, name, arguments):
        return "seen"

    def new_state(self, scenario):
        return {}

    def user_instructions(self, scenario):
        return ""

    def simulator_system_prompt(self, scenario):
        return ""

    def next_speaker(self, conversation, agent_first):
        if not conversation or conversation[-1]["role"] == "user":
            return "agent"
        if conversation[-1]["role"] == "tool":
            return "agent"
        spoken = [m for m in conversation if m["role"] != "tool"]
        two = len(spoken) >= 2 and spoken[-2]["role"] == "assistant"
        return "user" if two else "agent"

    def score(self, conversation, state, end_reason=None):
        return Outcome(0.0, False)


class Stream:
    def __init__(self, result):
        self.result = result

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return False

    def __aiter__(self):
        return self

    async def __anext__(self):
        raise StopAsyncIteration


class Client:
    """The arm's endpoint: each turn calls the tool when `calls` says so."""

    def __init__(self, calls=False):
        self.calls = calls

    def stream_chat(self, model, messages, tools=None, tool_format="json", **params):
        return Stream(ChatResult(content="ok", tool_calls=[CALL] if self.calls else []))


class Simulator:
    async def reply(self, domain, scenario, conversation, choices):
        return SimpleNamespace(text="hi")


def agent(calls=False):
    return Agent(Client(calls), "arm", "", "", {}, "json")


def user():
    return User({}, random.Random(0), simulator=Simulator())


def speakers(played):
    return [m["role"] for m in played.conversation if m["role"] != "tool"]


async def test_the_domain_says_who_speaks_next():
    played = await play(Pair(), SCENARIO, agent(), user(), max_turns=7)
    assert speakers(played) == ["assistant", "assistant", "user"] * 2 + ["assistant"]
    assert played.end_reason == "max_turns"


async def test_turns_count_as_the_domain_counts_them():
    domain = Pair()
    domain.turn_count = lambda conversation: sum(m["role"] == "user" for m in conversation)
    played = await play(domain, SCENARIO, agent(), user(), max_turns=2)
    assert speakers(played) == ["assistant", "assistant", "user"] * 2


async def test_tool_rounds_end_it_only_where_the_domain_lets_them():
    domain = Pair()
    played = await play(domain, SCENARIO, agent(calls=True), user(), 10, max_tool_rounds=2)
    assert played.end_reason == "max_tool_rounds" and len(played.conversation) == 4
    domain.limits_tool_rounds = False  # e.g. CooperBench's steps, each a tool call
    domain.turn_count = lambda conversation: len(conversation)
    played = await play(domain, SCENARIO, agent(calls=True), user(), 10, max_tool_rounds=2)
    assert played.end_reason == "max_turns"


def test_a_heldout_table_is_validated_as_training_validates_it():
    """A human-like simulator's table (its replicas a list, studies' own keys beside) plays;
    a table training would refuse is refused here too."""
    table = {
        "name": "h",
        "kind": "plain",
        "model": "m",
        "endpoint": ["http://a/v1", "http://b/v1"],
        "humanlike": True,
        "imitates": "s",
    }
    assert make_user(table, random.Random(0)).simulator.model == "m"
    try:
        make_user({"name": "h", "endpoint": "http://a/v1", "model": "m", "k": 1}, random.Random(0))
    except ValueError as error:
        assert "k" in str(error)
    else:
        raise AssertionError("k = 1 was accepted")
