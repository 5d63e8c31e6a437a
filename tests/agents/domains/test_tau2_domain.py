"""The tau2 Domains: scenarios, prompts, per-conversation state, ending and scoring."""

import copy
import hashlib
import json

import pytest

from agents.domains import get_domain
from agents.domains.base import Domain, Scenario
from agents.domains.tau2 import AirlineDomain, RetailDomain
from agents.domains.tau2.replay import gold_conversation
from agents.domains.tau2.scoring import tool_calls_of
from agents.domains.tau2.store import Store, canonical_json
from agents.domains.tau2.taskset import load_task_set


@pytest.fixture(scope="module")
def retail():
    return RetailDomain()


@pytest.fixture(scope="module")
def airline():
    return AirlineDomain()


def task_with(domain, test):
    return next(s for s in domain.scenarios() if test(s.payload["evaluation_criteria"]))


def writes_something(criteria):
    return any(
        a["name"].startswith(("cancel", "modify", "return", "exchange", "book", "update", "send"))
        for a in criteria["actions"]
    )


def played(domain, scenario):
    """A fresh state and the gold conversation played on it."""
    state = domain.new_state(scenario)
    conversation, _ = gold_conversation(domain, scenario, state)
    return conversation, state


def replayed(domain, scenario, conversation):
    """A fresh state with the conversation's own tool calls run on it, through the Domain."""
    state = domain.new_state(scenario)
    for name, arguments in tool_calls_of(conversation):
        domain.execute_tool(state, name, arguments)
    return state


def without_last_write(conversation):
    """The conversation minus its last tool call that changes the DB (and its result)."""
    index = max(
        i
        for i, m in enumerate(conversation)
        if m.get("tool_calls")
        and m["tool_calls"][0]["function"]["name"].startswith(
            ("cancel", "modify", "return", "exchange", "book", "update", "send")
        )
    )
    return conversation[:index] + conversation[index + 2 :]


def test_registry_and_interface():
    assert isinstance(get_domain("retail"), RetailDomain) and isinstance(
        get_domain("airline"), AirlineDomain
    )
    assert isinstance(get_domain("retail"), Domain)
    with pytest.raises(ValueError, match="unknown domain 'shop'"):
        get_domain("shop")
    with pytest.raises(FileNotFoundError, match="no retail tasks.json"):
        get_domain("retail", data_dir="/nonexistent").scenarios()


def test_bundled_scenarios_and_splits(retail, airline):
    for domain in (retail, airline):
        scenarios = domain.scenarios()
        assert len(scenarios) >= 10 and len({s.id for s in scenarios}) == len(scenarios)
        train, test = domain.scenarios("train"), domain.scenarios("test")
        assert train and test and {s.id for s in train}.isdisjoint({s.id for s in test})
        assert {s.id for s in train} | {s.id for s in test} == {s.id for s in scenarios}
        assert all(s.domain == domain.name and s.title for s in scenarios)
        assert (
            sum(bool(s.payload["evaluation_criteria"]["communicate_info"]) for s in scenarios) >= 3
        )
        json.dumps([s.to_dict() for s in scenarios])
        with pytest.raises(ValueError, match="no split 'dev'"):
            domain.scenarios("dev")


def test_prompts(retail, airline):
    scenario = retail.scenarios()[1]
    policy = load_task_set("retail").policy
    assert policy.strip() in retail.agent_system_prompt(scenario)
    assert retail.greeting(scenario) == "Hi! How can I help you today?"
    instructions = scenario.payload["user_scenario"]["instructions"]
    sim = retail.simulator_system_prompt(scenario)
    for marker in ("###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###"):
        assert marker in sim
    assert " ".join(instructions["reason_for_call"].split()) in " ".join(sim.split())
    assert instructions["known_info"] in sim and instructions["unknown_info"] in sim
    human = retail.user_instructions(scenario)
    assert instructions["reason_for_call"] in human and instructions["known_info"] in human
    assert "###" not in human and "Domain:" not in human
    assert "2024-05-15 15:00:00" in airline.agent_system_prompt(airline.scenarios()[0])


def test_tools_run_on_the_state_and_errors_are_text(retail):
    scenario = retail.scenarios()[0]
    state = retail.new_state(scenario)
    assert {t["function"]["name"] for t in retail.tools(scenario)} >= {
        "cancel_pending_order",
        "calculate",
    }
    assert (
        retail.execute_tool(state, "get_order_details", {"order_id": "nope"})
        == "Error: Order not found"
    )
    assert retail.execute_tool(state, "get_order_details", "not json").startswith("Error:")
    assert retail.execute_tool(state, "no_such_tool", {}).startswith("Error:")


def test_each_conversation_has_its_own_db(retail):
    scenario = task_with(retail, writes_something)
    base = load_task_set("retail")
    before = Store(base.db).digest()
    first, second = retail.new_state(scenario), retail.new_state(scenario)
    gold_conversation(retail, scenario, first)
    assert first.db.digest() != second.db.digest()
    assert second.db.digest() == before == Store(base.db).digest()


def test_state_survives_a_json_round_trip(retail, airline):
    for domain in (retail, airline):
        scenario = task_with(domain, writes_something)
        conversation, state = played(domain, scenario)
        stored = json.loads(json.dumps(domain.dump_state(state)))
        assert len(json.dumps(stored)) < 5000  # the write calls, not the DB
        restored = domain.load_state(scenario, stored)
        assert restored.db.digest() == state.db.digest()
        assert domain.score(conversation, restored, "user_stop").reward == 1.0
        assert replayed(domain, scenario, conversation).db.digest() == state.db.digest()
        other = (
            domain.scenarios()[-1]
            if domain.scenarios()[-1].id != scenario.id
            else domain.scenarios()[0]
        )
        with pytest.raises(ValueError, match="belongs to task"):
            domain.load_state(other, stored)
        with pytest.raises(ValueError, match="not a dumped"):
            domain.load_state(scenario, {"db": "?"})


def test_scenario_from_other_data_is_refused(retail):
    scenario = retail.scenarios()[0]
    foreign = Scenario(
        scenario.id, "retail", {**scenario.payload, "data_source": "/elsewhere/tau2/retail"}
    )
    with pytest.raises(ValueError, match="create the domain with that data_dir"):
        retail.new_state(foreign)


def test_gold_conversation_scores_one(retail, airline):
    for domain in (retail, airline):
        for scenario in domain.scenarios():
            conversation, state = played(domain, scenario)
            outcome = domain.score(conversation, state, domain.is_done(conversation))
            assert (outcome.reward, outcome.success) == (1.0, True), (
                domain.name,
                scenario.id,
                outcome,
            )
            assert outcome.components["DB"] == 1.0 and outcome.components["COMMUNICATE"] == 1.0
            assert outcome.details["db"].get("match", True)


def test_db_mismatch_scores_zero(retail, airline):
    for domain in (retail, airline):
        scenario = task_with(domain, writes_something)
        conversation, _ = played(domain, scenario)
        missing = without_last_write(conversation)
        state = replayed(domain, scenario, missing)
        outcome = domain.score(missing, state, "user_stop")
        assert outcome.reward == 0.0 and not outcome.success
        assert outcome.components["DB"] == 0.0 and outcome.details["db"]["match"] is False
        assert outcome.details["db"]["agent_hash"] != outcome.details["db"]["gold_hash"]


def test_a_different_change_scores_zero(retail):
    scenario = task_with(
        retail, lambda c: any(a["name"] == "cancel_pending_order" for a in c["actions"])
    )
    conversation, state = played(retail, scenario)
    cancel = next(
        a
        for a in scenario.payload["evaluation_criteria"]["actions"]
        if a["name"] == "cancel_pending_order"
    )
    other_reason = {
        "no longer needed": "ordered by mistake",
        "ordered by mistake": "no longer needed",
    }[cancel["arguments"]["reason"]]
    wrong = retail.new_state(scenario)
    retail.execute_tool(
        wrong, "cancel_pending_order", {**cancel["arguments"], "reason": other_reason}
    )
    assert retail.score(conversation, wrong, "user_stop").components["DB"] == 0.0
    assert retail.score(conversation, state, "user_stop").components["DB"] == 1.0


def test_missing_communicate_info_scores_zero(airline):
    scenario = task_with(airline, lambda c: c["communicate_info"])
    conversation, state = played(airline, scenario)
    info = scenario.payload["evaluation_criteria"]["communicate_info"][0]
    silent = [
        m
        for m in conversation
        if not (m["role"] == "assistant" and m.get("content") and info in m["content"])
    ]
    outcome = airline.score(silent, state, "user_stop")
    assert outcome.reward == 0.0 and outcome.components == {
        **outcome.components,
        "DB": 1.0,
        "COMMUNICATE": 0.0,
    }
    assert {"info": info, "met": False} in outcome.details["communicate"]
    # Case and commas do not matter; the tool results (role "tool") do not count.
    spoken = (
        silent[:-1]
        + [{"role": "assistant", "content": f"That comes to ${info[:1]},{info[1:]}.".upper()}]
        + silent[-1:]
    )
    assert airline.score(spoken, state, "user_stop").components["COMMUNICATE"] == 1.0
    heard = (
        silent[:-1]
        + [{"role": "tool", "tool_call_id": "x", "name": "calculate", "content": info}]
        + silent[-1:]
    )
    assert airline.score(heard, state, "user_stop").components["COMMUNICATE"] == 0.0


def test_step_and_error_limits_score_zero(retail):
    scenario = task_with(retail, writes_something)
    conversation, state = played(retail, scenario)
    for reason in ("max_steps", "too_many_errors", "max_turns"):
        outcome = retail.score(conversation, state, reason)
        assert (outcome.reward, outcome.success) == (0.0, False) and reason in outcome.details[
            "note"
        ]


def test_nl_assertions_need_a_judge(retail):
    scenario = task_with(retail, lambda c: c.get("nl_assertions"))
    conversation, state = played(retail, scenario)
    outcome = retail.score(conversation, state, "user_stop")
    assert outcome.components["NL_ASSERTION"] == "not in the reward basis" and outcome.reward == 1.0
    payload = copy.deepcopy(scenario.payload)
    payload["evaluation_criteria"]["reward_basis"] = ["DB", "NL_ASSERTION"]
    judged = Scenario(scenario.id, "retail", payload)
    state = retail.new_state(judged)
    conversation, _ = gold_conversation(retail, judged, state)
    unjudged = retail.score(conversation, state, "user_stop")
    # left out of the reward and named: never a success, never a silent 0
    assert (unjudged.reward, unjudged.success) == (1.0, False)
    assert unjudged.components["NL_ASSERTION"] == "unjudged"
    assert "nl_judge" in unjudged.details["unjudged"]["NL_ASSERTION"]
    seen = []

    def judge(assertions, messages):
        seen.append((assertions, len(messages)))
        return [True] * len(assertions)

    assert RetailDomain(nl_judge=judge).score(conversation, state, "user_stop").reward == 1.0
    assert seen == [(payload["evaluation_criteria"]["nl_assertions"], len(conversation))]
    assert (
        RetailDomain(nl_judge=lambda a, m: [False] * len(a))
        .score(conversation, state, "user_stop")
        .reward
        == 0.0
    )

    def broken(assertions, messages):
        raise ConnectionError("judge endpoint down")

    outcome = RetailDomain(nl_judge=broken).score(conversation, state, "user_stop")
    assert not outcome.success and outcome.components["NL_ASSERTION"] == "unjudged"
    assert "judge endpoint down" in outcome.details["unjudged"]["NL_ASSERTION"]


def test_action_basis(retail):
    scenario = task_with(retail, writes_something)
    payload = copy.deepcopy(scenario.payload)
    payload["evaluation_criteria"]["reward_basis"] = ["ACTION"]
    scenario = Scenario(scenario.id, "retail", payload)
    conversation, state = played(retail, scenario)
    assert retail.score(conversation, state, "user_stop").reward == 1.0
    assert retail.score(without_last_write(conversation), state, "user_stop").reward == 0.0


def test_initial_state_changes_the_start_and_the_gold_db(retail):
    scenario = task_with(
        retail, lambda c: any(a["name"] == "cancel_pending_order" for a in c["actions"])
    )
    order_id = next(
        a["arguments"]["order_id"]
        for a in scenario.payload["evaluation_criteria"]["actions"]
        if a["name"] == "cancel_pending_order"
    )
    payload = copy.deepcopy(scenario.payload)
    payload["initial_state"] = {
        "initialization_data": {"agent_data": {"orders": {order_id: {"status": "processed"}}}}
    }
    started = Scenario(scenario.id, "retail", payload)
    state = retail.new_state(started)
    assert state.db.get("orders", order_id)["status"] == "processed"
    assert load_task_set("retail").db["orders"][order_id]["status"] == "pending"
    conversation, errors = gold_conversation(retail, started, state)
    assert errors == 1  # the cancel now fails, for the agent and for the gold replay alike
    assert retail.score(conversation, state, "user_stop").reward == 1.0
    payload["initial_state"] = {"initialization_data": {"agent_data": {"shops": {}}}}
    with pytest.raises(ValueError, match="not a table"):
        retail.new_state(Scenario(scenario.id, "retail", payload))


def test_is_done(retail):
    greeting = {"role": "assistant", "content": "Hi! How can I help you today?"}
    assert retail.is_done([greeting, {"role": "user", "content": "Cancel my order."}]) is None
    assert (
        retail.is_done([greeting, {"role": "user", "content": "Thanks! ###STOP###"}]) == "user_stop"
    )
    assert (
        retail.is_done([greeting, {"role": "user", "content": "###TRANSFER###"}]) == "user_transfer"
    )
    assert (
        retail.is_done([greeting, {"role": "user", "content": "###OUT-OF-SCOPE###"}])
        == "user_out_of_scope"
    )
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "transfer_to_human_agents", "arguments": "{}"},
            }
        ],
    }
    result = {
        "role": "tool",
        "tool_call_id": "c1",
        "name": "transfer_to_human_agents",
        "content": "Transfer successful",
    }
    assert retail.is_done([greeting, call, result]) is None
    bye = {
        "role": "assistant",
        "content": "YOU ARE BEING TRANSFERRED TO A HUMAN AGENT. PLEASE HOLD ON.",
    }
    assert retail.is_done([greeting, call, result, bye]) == "agent_transfer"
    error = {
        "role": "tool",
        "tool_call_id": "c",
        "name": "get_order_details",
        "content": "Error: Order not found",
    }
    assert retail.is_done([greeting] + [error] * 9) is None
    assert retail.is_done([greeting] + [error] * 10) == "too_many_errors"
    chatter = [greeting] + [
        {"role": "tool", "tool_call_id": "c", "name": "calculate", "content": "2.0"}
    ] * 99
    assert retail.is_done(chatter) == "max_steps"
    talk = [{"role": r, "content": "hm"} for _ in range(30) for r in ("user", "assistant")]
    assert retail.is_done(talk) == "max_turns"


def test_digest_is_the_hash_of_the_canonical_json(retail):
    scenario = task_with(retail, writes_something)
    _, state = played(retail, scenario)
    full = hashlib.sha256(canonical_json(state.db.tables).encode()).hexdigest()
    assert state.db.digest() == full == state.db.digest(load_task_set("retail").json_cache)
    fresh = retail.new_state(scenario).db
    assert (
        fresh.digest()
        == hashlib.sha256(canonical_json(load_task_set("retail").db).encode()).hexdigest()
    )
    assert state.db.digest() != fresh.digest()
    state.db.edit("users", next(iter(state.db.tables["users"])))["email"] = "changed@example.com"
    assert (
        state.db.digest()
        == hashlib.sha256(canonical_json(state.db.tables).encode()).hexdigest()
        != full
    )
