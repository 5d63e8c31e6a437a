"""Tool results' sizes in tokens, per tau2 Domain, from the Domains' own data: the figure the dry
run counts for each tool result in a conversation (training/tools/dryrun.py TOOL_RESULT_TOKENS).

    python bench/tool_result_tokens.py [--tokenizer MODEL_FOLDER]

Runs every read tool of each Domain on every record it can return (retail: each product's,
order's and user's details and the product types; airline: each user's and reservation's
details, every flight's status on each of its dates, direct and one-stop searches between every
pair of airports on every date the flights fly, the airport list) through the Domain's own
`execute_tool` on a fresh conversation state, and tokenizes each result string as the agent
reads it (the tokenizer of the given model folder: SmolLM2's by default, the one on this
machine; Qwen3's BPE gives counts of the same order on JSON). Prints the median, the 90th
percentile and the largest per tool, over all of a Domain's results, and over its records (a
result of at least 8 tokens: not an empty search or a flight's status word); the dry run takes
the records' 90th percentile. Deterministic (no sampling): the figures depend on the data and the tokenizer only.
"""

import argparse
import itertools
import json
import os
import statistics
from pathlib import Path

from transformers import AutoTokenizer

from agents.domains import get_domain

DATA = Path(__file__).resolve().parents[1] / "agents" / "domains" / "tau2" / "data"
RECORD = 8  # tokens: shorter results are "[]" (a search that finds nothing) or a flight status


def calls(name: str, db: dict) -> list[tuple[str, dict]]:
    """(tool, arguments) of every read call the Domain's data answers."""
    if name == "retail":
        return (
            [("get_product_details", {"product_id": p}) for p in db["products"]]
            + [("get_order_details", {"order_id": o}) for o in db["orders"]]
            + [("get_user_details", {"user_id": u}) for u in db["users"]]
            + [("list_all_product_types", {})]
        )
    flights = db["flights"].values()
    airports = sorted({f["origin"] for f in flights} | {f["destination"] for f in flights})
    dates = sorted({d for f in flights for d in f["dates"]})
    out = [("get_user_details", {"user_id": u}) for u in db["users"]]
    out += [("get_reservation_details", {"reservation_id": r}) for r in db["reservations"]]
    out += [
        ("get_flight_status", {"flight_number": f["flight_number"], "date": d})
        for f in flights
        for d in f["dates"]
    ]
    for (a, b), d in itertools.product(itertools.permutations(airports, 2), dates):
        out.append(("search_direct_flight", {"origin": a, "destination": b, "date": d}))
        out.append(("search_onestop_flight", {"origin": a, "destination": b, "date": d}))
    return out + [("list_all_airports", {})]


def percentile(values: list[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    default = os.environ.get("PARLEY_BASE_MODEL", "data/models/SmolLM2-135M-Instruct")
    parser.add_argument("--tokenizer", default=default)
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    print(f"tokenizer: {Path(args.tokenizer).name}")
    for name in ("retail", "airline"):
        domain = get_domain(name)
        scenario = domain.scenarios(None)[0]
        db = json.loads((DATA / name / "db.json").read_text())  # the bundled data
        sizes: dict[str, list[int]] = {}
        for tool, arguments in calls(name, db):
            state = domain.new_state(scenario)
            text = domain.execute_tool(state, tool, arguments)
            if text.startswith("Error"):
                continue  # a search with no flight, say: not a record
            sizes.setdefault(tool, []).append(len(tokenizer.encode(text)))
        every = [n for found in sizes.values() for n in found]
        print(f"\n{name}: {len(every)} results")
        print(f"  {'tool':<28}{'n':>5}{'median':>8}{'p90':>7}{'max':>7}")
        records = [n for n in every if n >= RECORD]
        rows = [*sorted(sizes.items()), ("(all)", every), (f"(records, >= {RECORD})", records)]
        for tool, found in rows:
            print(
                f"  {tool:<28}{len(found):>5}{statistics.median(found):>8.0f}"
                f"{percentile(found, 0.9):>7}{max(found):>7}"
            )


if __name__ == "__main__":
    main()
