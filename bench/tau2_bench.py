"""tau2 domain speed: loading, a fresh per-conversation state, scoring, state round trip, replay.

Prints milliseconds per operation on the official data when ../shared/reference is there (else
the bundled data). Targets on the 2-core dev machine: a fresh state under 5 ms, a score under
30 ms, the whole official replay (114 retail + 50 airline tasks) under 10 s.

    .venv/bin/python bench/tau2_bench.py
"""

import json
import time

from agents import paths
from agents.domains.tau2 import AirlineDomain, RetailDomain
from agents.domains.tau2.replay import gold_conversation, replay_task


def timed(label, fn, repeat=1):
    start = time.perf_counter()
    for _ in range(repeat):
        result = fn()
    print(f"  {label:<42} {(time.perf_counter() - start) / repeat * 1000:9.1f} ms")
    return result


def bench(cls, data_dir) -> float:
    domain = cls(data_dir=data_dir)
    print(domain.name)
    scenarios = timed("load data and tasks (first time)", domain.scenarios)
    scenario = max(scenarios, key=lambda s: len(s.payload["evaluation_criteria"]["actions"] or []))
    state = timed("new_state (a fresh DB)", lambda: domain.new_state(scenario), repeat=50)
    conversation, _ = gold_conversation(domain, scenario, state)
    timed(
        "score (first: gold replay, cold row cache)",
        lambda: domain.score(conversation, state, "user_stop"),
    )
    timed(
        "score again (hashes cached)",
        lambda: domain.score(conversation, state, "user_stop"),
        repeat=20,
    )
    stored = json.dumps(domain.dump_state(state))
    print(f"  {'dumped state size':<42} {len(stored):9d} bytes")
    timed(
        "load_state (replay the writes)",
        lambda: domain.load_state(scenario, json.loads(stored)),
        repeat=20,
    )
    start = time.perf_counter()
    for s in scenarios:
        replay_task(domain, s)
    elapsed = time.perf_counter() - start
    print(f"  {'replay all ' + str(len(scenarios)) + ' tasks':<42} {elapsed * 1000:9.1f} ms")
    return elapsed


def main():
    reference = paths.reference_dir()
    data_dir = reference / "tau2" if reference and (reference / "tau2").is_dir() else None
    print(f"data: {data_dir or 'bundled'}")
    total = sum(bench(cls, data_dir) for cls in (RetailDomain, AirlineDomain))
    print(f"replay total: {total:.2f} s")


if __name__ == "__main__":
    main()
