"""Write the project's own small tau2 retail and airline data (same schemas as tau2-bench).

Deterministic: the same files on every run. Names, products, flights and tasks are invented here.

    python -m agents.domains.tau2.data.make_data            # rewrite retail/ and airline/ beside this file
    python -m agents.domains.tau2.data.make_data --check    # exit 1 if the files differ from a fresh run

Tasks pick their customers from the generated records by what the story needs (a pending order
paid by gift card, a reservation booked yesterday, ...). Amounts the agent must state are worked
out here with the same arithmetic the tools use.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIRST = [
    "Ada",
    "Bruno",
    "Celia",
    "Dmitri",
    "Elena",
    "Farid",
    "Greta",
    "Hugo",
    "Ines",
    "Jonas",
    "Keiko",
    "Lars",
    "Maya",
    "Nico",
    "Olga",
    "Pavel",
    "Quinn",
    "Rosa",
    "Sami",
    "Tara",
    "Umar",
    "Vera",
    "Wendell",
    "Yara",
]
LAST = [
    "Abara",
    "Brandt",
    "Castell",
    "Dorsey",
    "Eklund",
    "Fontaine",
    "Galvez",
    "Halloran",
    "Ibsen",
    "Jaffe",
    "Kowal",
    "Lindqvist",
    "Moreau",
    "Nakamura",
    "Okafor",
    "Petrov",
    "Quist",
    "Rinaldi",
    "Sorensen",
    "Tamura",
    "Ulloa",
    "Varga",
    "Whitlock",
    "Zeller",
]
PLACES = [
    ("Portland", "OR", "972"),
    ("Austin", "TX", "787"),
    ("Columbus", "OH", "432"),
    ("Tucson", "AZ", "857"),
    ("Madison", "WI", "537"),
    ("Raleigh", "NC", "276"),
    ("Boise", "ID", "837"),
    ("Omaha", "NE", "681"),
]
STREETS = [
    "Alder Lane",
    "Birch Road",
    "Cedar Court",
    "Dune Street",
    "Elm Row",
    "Fern Avenue",
    "Granite Way",
]


def money(rng: random.Random, low: float, high: float) -> float:
    return round(rng.uniform(low, high), 2)


def digits(rng: random.Random, n: int) -> str:
    return str(rng.randint(10 ** (n - 1), 10**n - 1))


def person(rng: random.Random, n: int) -> tuple[str, str, str]:
    first, last = FIRST[n % len(FIRST)], LAST[(n * 7) % len(LAST)]
    return first, last, f"{first.lower()}_{last.lower()}_{digits(rng, 4)}"


def address(rng: random.Random) -> dict:
    city, state, zip3 = rng.choice(PLACES)
    return {
        "address1": f"{rng.randint(10, 999)} {rng.choice(STREETS)}",
        "address2": rng.choice(["", f"Apt {rng.randint(1, 40)}", f"Unit {rng.randint(100, 400)}"]),
        "city": city,
        "country": "USA",
        "state": state,
        "zip": zip3 + digits(rng, 2),
    }


def task(tid, domain, purpose, reason, known, unknown, how, actions, communicate=(), nl=()):
    return {
        "id": str(tid),
        "description": {"purpose": purpose, "relevant_policies": None, "notes": None},
        "user_scenario": {
            "persona": None,
            "instructions": {
                "task_instructions": how,
                "domain": domain,
                "reason_for_call": reason,
                "known_info": known,
                "unknown_info": unknown,
            },
        },
        "initial_state": None,
        "evaluation_criteria": {
            "actions": [
                {"action_id": f"{tid}_{n}", "name": name, "arguments": args, "info": None}
                for n, (name, args) in enumerate(actions)
            ],
            "communicate_info": list(communicate),
            "nl_assertions": list(nl) or None,
        },
    }


# --- retail -------------------------------------------------------------------------------------

PRODUCTS = {
    "Desk Lamp": {
        "color": ["black", "white", "silver"],
        "brightness": ["low", "medium", "high"],
        "power source": ["battery", "USB", "AC"],
    },
    "Water Bottle": {
        "capacity": ["500ml", "750ml", "1000ml"],
        "material": ["stainless steel", "plastic", "glass"],
    },
    "Running Shoes": {"size": ["8", "9", "10", "11"], "color": ["black", "white"]},
    "Backpack": {"color": ["navy", "grey", "olive"], "size": ["small", "medium", "large"]},
    "Wireless Earbuds": {
        "color": ["black", "white"],
        "battery life": ["6 hours", "8 hours"],
        "water resistance": ["yes", "no"],
    },
    "Coffee Maker": {"capacity": ["4 cups", "8 cups", "12 cups"], "type": ["drip", "espresso"]},
    "Yoga Mat": {"thickness": ["4mm", "6mm", "8mm"], "material": ["PVC", "TPE", "natural rubber"]},
    "Mechanical Keyboard": {
        "switch type": ["linear", "tactile", "clicky"],
        "backlight": ["none", "white", "RGB"],
    },
    "Electric Kettle": {
        "capacity": ["1L", "1.5L", "2L"],
        "material": ["glass", "plastic", "stainless steel"],
    },
    "Notebook": {"size": ["A5", "A4"], "cover type": ["soft cover", "hard cover"]},
    "Sunglasses": {
        "lens type": ["polarized", "non-polarized"],
        "frame material": ["plastic", "metal"],
    },
    "Bluetooth Speaker": {
        "color": ["red", "blue", "black"],
        "battery life": ["10 hours", "20 hours"],
    },
}


def retail_db(rng: random.Random) -> dict:
    products = {}
    for name, options in PRODUCTS.items():
        pid = digits(rng, 10)
        combos = list(itertools.product(*options.values()))
        rng.shuffle(combos)
        base = money(rng, 20, 300)
        variants = {}
        for combo in combos[: rng.randint(4, 6)]:
            iid = digits(rng, 10)
            variants[iid] = {
                "item_id": iid,
                "options": dict(zip(options, combo, strict=True)),
                "available": rng.random() < 0.8,
                "price": round(base * rng.uniform(0.85, 1.2), 2),
            }
        products[pid] = {"name": name, "product_id": pid, "variants": variants}

    users, orders = {}, {}
    for n in range(24):
        first, last, uid = person(rng, n)
        methods = {}
        for source in rng.sample(["credit_card", "gift_card", "paypal"], rng.randint(1, 3)):
            mid = f"{source}_{digits(rng, 7)}"
            if source == "credit_card":
                methods[mid] = {
                    "source": source,
                    "id": mid,
                    "brand": rng.choice(["visa", "mastercard"]),
                    "last_four": digits(rng, 4),
                }
            elif source == "gift_card":
                methods[mid] = {"source": source, "id": mid, "balance": money(rng, 0, 400)}
            else:
                methods[mid] = {"source": source, "id": mid}
        home = address(rng)
        user = {
            "user_id": uid,
            "name": {"first_name": first, "last_name": last},
            "address": home,
            "email": f"{first.lower()}.{last.lower()}{digits(rng, 3)}@example.com",
            "payment_methods": methods,
            "orders": [],
        }
        for _ in range(rng.randint(1, 3)):
            oid = f"#W{digits(rng, 7)}"
            status = rng.choice(
                ["pending", "pending", "processed", "delivered", "delivered", "cancelled"]
            )
            items = []
            for product in rng.sample(list(products.values()), rng.randint(1, 4)):
                variant = rng.choice(list(product["variants"].values()))
                items.append(
                    {
                        "name": product["name"],
                        "product_id": product["product_id"],
                        "item_id": variant["item_id"],
                        "price": variant["price"],
                        "options": dict(variant["options"]),
                    }
                )
            total = round(sum(item["price"] for item in items), 2)
            method = rng.choice(list(methods))
            history = [
                {"transaction_type": "payment", "amount": total, "payment_method_id": method}
            ]
            if status == "cancelled":
                history.append(
                    {"transaction_type": "refund", "amount": total, "payment_method_id": method}
                )
            fulfilled = status in ("processed", "delivered")
            orders[oid] = {
                "order_id": oid,
                "user_id": uid,
                "address": dict(home),
                "items": items,
                "status": status,
                "fulfillments": [
                    {"tracking_id": [digits(rng, 12)], "item_ids": [i["item_id"] for i in items]}
                ]
                if fulfilled
                else [],
                "payment_history": history,
            }
            user["orders"].append(oid)
        users[uid] = user
    return {"products": products, "users": users, "orders": orders}


def retail_tasks(db: dict) -> list[dict]:
    users, orders, products = db["users"], db["orders"], db["products"]

    def find_order(test):
        for order in orders.values():
            if test(order, users[order["user_id"]]):
                return order, users[order["user_id"]]
        raise AssertionError("no order fits a retail task: change the seed")

    def methods_of(user, source):
        return [m for m in user["payment_methods"].values() if m["source"] == source]

    def swap(order, item, *, cheaper=None):
        """Another available variant of the item's product (cheaper/dearer when asked)."""
        for variant in products[item["product_id"]]["variants"].values():
            if variant["item_id"] == item["item_id"] or not variant["available"]:
                continue
            if cheaper is None or (variant["price"] < item["price"]) == cheaper:
                return variant
        return None

    def who(user):
        return f"You are {user['name']['first_name']} {user['name']['last_name']}, email {user['email']}."

    def who_zip(user):
        return f"You are {user['name']['first_name']} {user['name']['last_name']}, living in zip code {user['address']['zip']}."

    def by_email(user):
        return ("find_user_id_by_email", {"email": user["email"]})

    def by_zip(user):
        n = user["name"]
        return (
            "find_user_id_by_name_zip",
            {
                "first_name": n["first_name"],
                "last_name": n["last_name"],
                "zip": user["address"]["zip"],
            },
        )

    tasks, used = [], set()

    def pick(test):
        order, user = find_order(lambda o, u: u["user_id"] not in used and test(o, u))
        used.add(user["user_id"])
        return order, user

    # 0: cancel a pending order
    order, user = pick(lambda o, u: o["status"] == "pending")
    tasks.append(
        task(
            0,
            "retail",
            "Cancel a pending order.",
            f"You want to cancel order {order['order_id']} because you no longer need it.",
            who(user),
            None,
            "Confirm when the agent asks.",
            [
                by_email(user),
                ("get_order_details", {"order_id": order["order_id"]}),
                (
                    "cancel_pending_order",
                    {"order_id": order["order_id"], "reason": "no longer needed"},
                ),
            ],
        )
    )

    # 1: new shipping address for a pending order, found by name and zip
    order, user = pick(lambda o, u: "pending" in o["status"])
    new = {
        "address1": "48 Harbor View",
        "address2": "Suite 5",
        "city": "Duluth",
        "state": "MN",
        "country": "USA",
        "zip": "55802",
    }
    tasks.append(
        task(
            1,
            "retail",
            "Change the shipping address of a pending order.",
            f"Order {order['order_id']} should go to 48 Harbor View, Suite 5, Duluth, MN 55802, USA instead.",
            who_zip(user),
            "You do not remember your email address.",
            "You are polite but in a hurry.",
            [
                by_zip(user),
                ("get_order_details", {"order_id": order["order_id"]}),
                ("modify_pending_order_address", {"order_id": order["order_id"], **new}),
            ],
        )
    )

    # 2: exchange one delivered item for a cheaper variant, difference back to the original method
    order, user = pick(
        lambda o, u: (
            o["status"] == "delivered"
            and o["payment_history"][0]["payment_method_id"].startswith("credit_card")
            and any(swap(o, i, cheaper=True) for i in o["items"])
        )
    )
    item = next(i for i in order["items"] if swap(order, i, cheaper=True))
    variant = swap(order, item, cheaper=True)
    diff = round(variant["price"] - item["price"], 2)
    wanted = ", ".join(f"{k} {v}" for k, v in variant["options"].items())
    tasks.append(
        task(
            2,
            "retail",
            "Exchange a delivered item; state the refund.",
            f"In your delivered order {order['order_id']} you want to exchange the {item['name'].lower()} for the one with {wanted}.",
            who(user),
            None,
            "Ask how much money you get back before confirming. Use the original card.",
            [
                by_email(user),
                ("get_order_details", {"order_id": order["order_id"]}),
                ("get_product_details", {"product_id": item["product_id"]}),
                (
                    "exchange_delivered_order_items",
                    {
                        "order_id": order["order_id"],
                        "item_ids": [item["item_id"]],
                        "new_item_ids": [variant["item_id"]],
                        "payment_method_id": order["payment_history"][0]["payment_method_id"],
                    },
                ),
            ],
            communicate=[str(-diff)],
        )
    )

    # 3: return all items of a delivered order to a gift card
    order, user = pick(lambda o, u: o["status"] == "delivered" and methods_of(u, "gift_card"))
    card = methods_of(user, "gift_card")[0]["id"]
    refund = round(sum(i["price"] for i in order["items"]), 2)
    tasks.append(
        task(
            3,
            "retail",
            "Return a whole delivered order to a gift card; state the refund.",
            f"You want to return everything in order {order['order_id']} and get the money on your gift card.",
            who_zip(user),
            "You do not remember your email address.",
            "Ask for the total refund.",
            [
                by_zip(user),
                ("get_order_details", {"order_id": order["order_id"]}),
                (
                    "return_delivered_order_items",
                    {
                        "order_id": order["order_id"],
                        "item_ids": [i["item_id"] for i in order["items"]],
                        "payment_method_id": card,
                    },
                ),
            ],
            communicate=[str(refund)],
        )
    )

    # 4: swap an item of a pending order for a dearer variant paid by gift card
    def dearer_ok(o, u):
        if o["status"] != "pending" or not methods_of(u, "gift_card"):
            return False
        return any(
            swap(o, i, cheaper=False)
            and methods_of(u, "gift_card")[0]["balance"]
            >= swap(o, i, cheaper=False)["price"] - i["price"]
            for i in o["items"]
        )

    order, user = pick(dearer_ok)
    item = next(i for i in order["items"] if swap(order, i, cheaper=False))
    variant = swap(order, item, cheaper=False)
    card = methods_of(user, "gift_card")[0]
    wanted = ", ".join(f"{k} {v}" for k, v in variant["options"].items())
    extra = variant["price"] - item["price"]
    tasks.append(
        task(
            4,
            "retail",
            "Modify a pending item; pay the difference by gift card.",
            f"In pending order {order['order_id']} you want the {item['name'].lower()} changed to the one with {wanted}.",
            who(user),
            None,
            "Pay any difference with your gift card. Ask what your gift card balance will be afterwards.",
            [
                by_email(user),
                ("get_order_details", {"order_id": order["order_id"]}),
                ("get_product_details", {"product_id": item["product_id"]}),
                (
                    "modify_pending_order_items",
                    {
                        "order_id": order["order_id"],
                        "item_ids": [item["item_id"]],
                        "new_item_ids": [variant["item_id"]],
                        "payment_method_id": card["id"],
                    },
                ),
            ],
            communicate=[str(round(card["balance"] - extra, 2))],
        )
    )

    # 5: pay a pending order with another method
    order, user = pick(
        lambda o, u: (
            o["status"] == "pending"
            and len(o["payment_history"]) == 1
            and any(
                m["id"] != o["payment_history"][0]["payment_method_id"]
                and m["source"] != "gift_card"
                for m in u["payment_methods"].values()
            )
        )
    )
    other = next(
        m["id"]
        for m in user["payment_methods"].values()
        if m["id"] != order["payment_history"][0]["payment_method_id"]
        and m["source"] != "gift_card"
    )
    tasks.append(
        task(
            5,
            "retail",
            "Change the payment method of a pending order.",
            f"You want order {order['order_id']} to be paid with your {other.split('_')[0]} account ({other}) instead.",
            who(user),
            None,
            "Confirm when asked.",
            [
                by_email(user),
                ("get_order_details", {"order_id": order["order_id"]}),
                (
                    "modify_pending_order_payment",
                    {"order_id": order["order_id"], "payment_method_id": other},
                ),
            ],
        )
    )

    # 6: update the default address
    order, user = pick(lambda o, u: True)
    new = {
        "address1": "7 Quarry Hill",
        "address2": "",
        "city": "Burlington",
        "state": "VT",
        "country": "USA",
        "zip": "05401",
    }
    tasks.append(
        task(
            6,
            "retail",
            "Change the default address.",
            "You moved to 7 Quarry Hill, Burlington, VT 05401, USA and want your account address updated.",
            who(user),
            None,
            "Only the account address, not any order.",
            [
                by_email(user),
                ("get_user_details", {"user_id": user["user_id"]}),
                ("modify_user_address", {"user_id": user["user_id"], **new}),
            ],
        )
    )

    # 7: a question only: how many variants of a product are in stock
    order, user = pick(lambda o, u: True)
    product = next(p for p in products.values() if p["name"] == "Yoga Mat")
    in_stock = sum(v["available"] for v in product["variants"].values())
    tasks.append(
        task(
            7,
            "retail",
            "Answer a stock question; no change.",
            "You want to know how many yoga mat variants the store has in stock right now.",
            who(user),
            None,
            "You only want the number; do not buy anything.",
            [
                by_email(user),
                ("list_all_product_types", {}),
                ("get_product_details", {"product_id": product["product_id"]}),
            ],
            communicate=[str(in_stock)],
        )
    )

    # 8: refuse to cancel a delivered order
    order, user = pick(lambda o, u: o["status"] == "delivered")
    tasks.append(
        task(
            8,
            "retail",
            "Refuse to cancel a delivered order.",
            f"You want to cancel order {order['order_id']}; if that is impossible, you give up.",
            who(user),
            None,
            "Do not ask for a return.",
            [by_email(user), ("get_order_details", {"order_id": order["order_id"]})],
            nl=["The agent does not cancel the delivered order."],
        )
    )

    # 9: cancel by mistake, and state the total refunded
    order, user = pick(
        lambda o, u: (
            o["status"] == "pending"
            and methods_of(u, "gift_card")
            and o["payment_history"][0]["payment_method_id"].startswith("gift_card")
        )
    )
    total = order["payment_history"][0]["amount"]
    tasks.append(
        task(
            9,
            "retail",
            "Cancel a gift-card order; state the refund.",
            f"You ordered {order['order_id']} by mistake and want it cancelled.",
            who_zip(user),
            "You do not remember your email address.",
            "Ask how much goes back to your gift card.",
            [
                by_zip(user),
                ("get_order_details", {"order_id": order["order_id"]}),
                (
                    "cancel_pending_order",
                    {"order_id": order["order_id"], "reason": "ordered by mistake"},
                ),
            ],
            communicate=[str(total)],
        )
    )

    # 10: a return to a credit card that is not the original method fails; the gift card works
    def wrong_card(o, u):
        if o["status"] != "delivered" or not methods_of(u, "gift_card"):
            return False
        return any(
            m["source"] == "credit_card" and m["id"] != o["payment_history"][0]["payment_method_id"]
            for m in u["payment_methods"].values()
        )

    order, user = pick(wrong_card)
    card = next(
        m["id"]
        for m in methods_of(user, "credit_card")
        if m["id"] != order["payment_history"][0]["payment_method_id"]
    )
    gift = methods_of(user, "gift_card")[0]["id"]
    item = order["items"][0]
    tasks.append(
        task(
            10,
            "retail",
            "A refused return destination, then a gift card (the first return errors).",
            f"You want to return the {item['name'].lower()} from order {order['order_id']} and get the money on your credit card {card}.",
            who(user),
            None,
            "If the card is refused, accept your gift card instead.",
            [
                by_email(user),
                ("get_order_details", {"order_id": order["order_id"]}),
                (
                    "return_delivered_order_items",
                    {
                        "order_id": order["order_id"],
                        "item_ids": [item["item_id"]],
                        "payment_method_id": card,
                    },
                ),
                (
                    "return_delivered_order_items",
                    {
                        "order_id": order["order_id"],
                        "item_ids": [item["item_id"]],
                        "payment_method_id": gift,
                    },
                ),
            ],
        )
    )

    # 11: out of scope: transfer
    order, user = pick(lambda o, u: o["status"] == "processed")
    tasks.append(
        task(
            11,
            "retail",
            "Transfer a request the tools cannot serve.",
            f"Order {order['order_id']} has shipped and you want the courier to deliver it on a Saturday.",
            who(user),
            None,
            "Insist on the Saturday delivery; accept a transfer to a person.",
            [
                by_email(user),
                ("get_order_details", {"order_id": order["order_id"]}),
                (
                    "transfer_to_human_agents",
                    {
                        "summary": f"Customer wants a Saturday delivery for shipped order {order['order_id']}."
                    },
                ),
            ],
        )
    )
    return tasks


# --- airline ------------------------------------------------------------------------------------

AIRPORTS = ["JFK", "LAX", "ORD", "SFO", "SEA", "BOS", "MIA", "DEN", "ATL", "PHX"]
DATES = [f"2024-05-{day:02d}" for day in range(10, 29)]
TODAY = "2024-05-15"


def clock(minutes: int) -> str:
    day, minutes = divmod(minutes, 24 * 60)
    text = f"{minutes // 60:02d}:{minutes % 60:02d}:00"
    return text + "+1" if day else text


def airline_db(rng: random.Random) -> dict:
    routes = [(a, b) for a in AIRPORTS for b in AIRPORTS if a != b]
    rng.shuffle(routes)
    # Hubs first so one-stop trips exist: everything into and out of ORD and DEN.
    hubs = [(a, h) for h in ("ORD", "DEN") for a in AIRPORTS if a != h] + [
        (h, b) for h in ("ORD", "DEN") for b in AIRPORTS if b != h
    ]
    chosen = list(dict.fromkeys(hubs[::3] + routes[:14]))
    flights = {}
    for n, (origin, destination) in enumerate(chosen):
        number = f"HAT{101 + n:03d}"
        leave = rng.randrange(6 * 60, 22 * 60, 15)
        arrive = leave + rng.randrange(70, 330, 5)
        prices = {
            "basic_economy": rng.randint(50, 100),
            "economy": rng.randint(110, 200),
            "business": rng.randint(250, 500),
        }
        dates = {}
        for date in DATES:
            if date < TODAY or (date == TODAY and arrive < 15 * 60):
                if rng.random() < 0.08:
                    dates[date] = {"status": "cancelled"}
                else:
                    late = rng.randint(-10, 40)
                    dates[date] = {
                        "status": "landed",
                        "actual_departure_time_est": f"{date}T{clock(leave + late)[:8]}",
                        "actual_arrival_time_est": f"{date}T{clock(arrive + late)[:8]}",
                    }
            elif date == TODAY and leave < 15 * 60:
                dates[date] = {
                    "status": "flying",
                    "actual_departure_time_est": f"{date}T{clock(leave)[:8]}",
                    "estimated_arrival_time_est": f"{date}T{clock(arrive)[:8]}",
                }
            elif date == TODAY:
                delay = rng.choice([0, 0, 95])
                dates[date] = {
                    "status": "delayed" if delay else "on time",
                    "estimated_departure_time_est": f"{date}T{clock(leave + delay)[:8]}",
                    "estimated_arrival_time_est": f"{date}T{clock(arrive + delay)[:8]}",
                }
            elif rng.random() < 0.05:
                dates[date] = {"status": "cancelled"}
            else:
                dates[date] = {
                    "status": "available",
                    "available_seats": {
                        "basic_economy": rng.randint(0, 12),
                        "economy": rng.randint(2, 20),
                        "business": rng.randint(0, 8),
                    },
                    "prices": {
                        cabin: max(1, round(price * rng.uniform(0.8, 1.25)))
                        for cabin, price in prices.items()
                    },
                }
        flights[number] = {
            "flight_number": number,
            "origin": origin,
            "destination": destination,
            "scheduled_departure_time_est": clock(leave),
            "scheduled_arrival_time_est": clock(arrive),
            "dates": dates,
        }

    users, reservations = {}, {}
    for n in range(20):
        first, last, uid = person(rng, n + 3)
        methods = {}
        for source in rng.sample(
            ["credit_card", "gift_card", "certificate", "credit_card"], rng.randint(1, 3)
        ):
            mid = f"{source}_{digits(rng, 7)}"
            if source == "credit_card":
                methods[mid] = {
                    "source": source,
                    "id": mid,
                    "brand": rng.choice(["visa", "mastercard"]),
                    "last_four": digits(rng, 4),
                }
            else:
                methods[mid] = {
                    "source": source,
                    "id": mid,
                    "amount": float(rng.choice([50, 100, 150, 250, 400])),
                }
        if not any(m["source"] == "credit_card" for m in methods.values()):
            mid = f"credit_card_{digits(rng, 7)}"
            methods[mid] = {
                "source": "credit_card",
                "id": mid,
                "brand": "visa",
                "last_four": digits(rng, 4),
            }
        dob = f"19{rng.randint(50, 99)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
        companions = [
            {
                "first_name": FIRST[(n * 5 + k) % len(FIRST)],
                "last_name": LAST[(n * 3 + k) % len(LAST)],
                "dob": f"19{rng.randint(60, 99)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
            }
            for k in range(rng.randint(0, 2))
        ]
        home = address(rng)
        users[uid] = {
            "user_id": uid,
            "name": {"first_name": first, "last_name": last},
            "address": home,
            "email": f"{first.lower()}.{last.lower()}{digits(rng, 3)}@example.com",
            "dob": dob,
            "payment_methods": methods,
            "saved_passengers": companions,
            "membership": rng.choice(["regular", "regular", "silver", "gold"]),
            "reservations": [],
        }
        for _ in range(rng.randint(1, 3)):
            flight = rng.choice(list(flights.values()))
            date = rng.choice([d for d in DATES if d > "2024-05-11"])
            cabin = rng.choice(["basic_economy", "economy", "economy", "business"])
            legs = [flight]
            round_trip = rng.random() < 0.4
            back = [
                f
                for f in flights.values()
                if f["origin"] == flight["destination"] and f["destination"] == flight["origin"]
            ]
            if round_trip and back:
                legs.append(back[0])
            dates = [date] + [DATES[min(DATES.index(date) + 3, len(DATES) - 1)]] * (len(legs) - 1)
            party = [{"first_name": first, "last_name": last, "dob": dob}] + companions[
                : rng.randint(0, len(companions))
            ]
            segs = []
            for leg, day in zip(legs, dates, strict=True):
                status = leg["dates"][day]
                price = (
                    status["prices"][cabin]
                    if status["status"] == "available"
                    else rng.randint(60, 450)
                )
                segs.append(
                    {
                        "flight_number": leg["flight_number"],
                        "origin": leg["origin"],
                        "destination": leg["destination"],
                        "date": day,
                        "price": price,
                    }
                )
            insurance = rng.choice(["yes", "no"])
            bags = rng.randint(0, len(party) * 2)
            nonfree = max(0, bags - len(party))
            total = (
                sum(s["price"] for s in segs) * len(party)
                + (30 * len(party) if insurance == "yes" else 0)
                + 50 * nonfree
            )
            payer = rng.choice([m for m in methods.values() if m["source"] != "certificate"])["id"]
            rid = "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ23456789") for _ in range(6))
            created = rng.choice(
                [
                    "2024-05-01T09:12:00",
                    "2024-05-08T17:40:00",
                    "2024-05-12T11:05:00",
                    "2024-05-14T20:30:00",
                ]
            )
            reservations[rid] = {
                "reservation_id": rid,
                "user_id": uid,
                "origin": legs[0]["origin"],
                "destination": legs[0]["destination"],
                "flight_type": "round_trip" if len(legs) == 2 else "one_way",
                "cabin": cabin,
                "flights": segs,
                "passengers": party,
                "payment_history": [{"payment_id": payer, "amount": total}],
                "created_at": created,
                "total_baggages": bags,
                "nonfree_baggages": nonfree,
                "insurance": insurance,
                "status": None,
            }
            users[uid]["reservations"].append(rid)
    # The airline cancels one upcoming flight of a silver or gold member (a compensation story).
    res = next(
        r
        for r in reservations.values()
        if users[r["user_id"]]["membership"] != "regular" and r["flights"][0]["date"] > TODAY
    )
    flights[res["flights"][0]["flight_number"]]["dates"][res["flights"][0]["date"]] = {
        "status": "cancelled"
    }
    return {"flights": flights, "users": users, "reservations": reservations}


def airline_tasks(db: dict) -> list[dict]:
    users, reservations, flights = db["users"], db["reservations"], db["flights"]
    used: set[str] = set()

    def pick(test):
        for res in reservations.values():
            user = users[res["user_id"]]
            if user["user_id"] not in used and res["status"] is None and test(res, user):
                used.add(user["user_id"])
                return res, user
        raise AssertionError("no reservation fits an airline task: change the seed")

    def future(res):
        return all(s["date"] > TODAY for s in res["flights"])

    def available(number, date, cabin, seats):
        day = flights[number]["dates"].get(date, {})
        return day.get("status") == "available" and day["available_seats"][cabin] >= seats

    def who(user):
        return f"You are {user['name']['first_name']} {user['name']['last_name']}, user id {user['user_id']}."

    def card_of(user):
        return next(
            m["id"] for m in user["payment_methods"].values() if m["source"] == "credit_card"
        )

    def cancelled_leg(r, u):
        covered = (
            u["membership"] in ("gold", "silver")
            or r["insurance"] == "yes"
            or r["cabin"] == "business"
        )
        return covered and any(
            flights[s["flight_number"]]["dates"][s["date"]]["status"] == "cancelled"
            for s in r["flights"]
        )

    compensated = pick(cancelled_leg)  # rare, so chosen before the other stories take customers
    tasks = []

    # 0: cancel within 24 hours of booking
    res, user = pick(lambda r, u: r["created_at"] >= "2024-05-14T15:00:00" and future(r))
    tasks.append(
        task(
            0,
            "airline",
            "Cancel a reservation booked less than 24 hours ago.",
            f"You booked reservation {res['reservation_id']} yesterday evening and changed your mind; cancel it.",
            who(user),
            None,
            "Your reason: change of plans. Confirm when asked.",
            [
                ("get_user_details", {"user_id": user["user_id"]}),
                ("get_reservation_details", {"reservation_id": res["reservation_id"]}),
                ("cancel_reservation", {"reservation_id": res["reservation_id"]}),
            ],
        )
    )

    # 1: refuse a cancellation (old economy booking, no insurance)
    res, user = pick(
        lambda r, u: (
            r["created_at"] < "2024-05-14"
            and r["cabin"] != "business"
            and r["insurance"] == "no"
            and future(r)
        )
    )
    tasks.append(
        task(
            1,
            "airline",
            "Refuse a cancellation the policy does not allow.",
            f"You want to cancel reservation {res['reservation_id']} for a full refund because your plans changed.",
            who(user),
            None,
            "If refused, do not accept anything else and end the conversation.",
            [
                ("get_user_details", {"user_id": user["user_id"]}),
                ("get_reservation_details", {"reservation_id": res["reservation_id"]}),
            ],
            nl=["The agent refuses to cancel the reservation."],
        )
    )

    # 2: add one paid bag
    def free_bags(user, cabin):
        table = {"regular": (0, 1, 2), "silver": (1, 2, 3), "gold": (2, 3, 3)}[user["membership"]]
        return table[("basic_economy", "economy", "business").index(cabin)]

    res, user = pick(
        lambda r, u: (
            future(r) and r["total_baggages"] >= free_bags(u, r["cabin"]) * len(r["passengers"])
        )
    )
    card = card_of(user)
    tasks.append(
        task(
            2,
            "airline",
            "Add a checked bag and state its cost.",
            f"You want to add one checked bag to reservation {res['reservation_id']}.",
            who(user),
            None,
            f"Pay with your credit card {card}. Ask what it costs.",
            [
                ("get_user_details", {"user_id": user["user_id"]}),
                ("get_reservation_details", {"reservation_id": res["reservation_id"]}),
                (
                    "update_reservation_baggages",
                    {
                        "reservation_id": res["reservation_id"],
                        "total_baggages": res["total_baggages"] + 1,
                        "nonfree_baggages": res["nonfree_baggages"] + 1,
                        "payment_id": card,
                    },
                ),
            ],
            communicate=["50"],
        )
    )

    # 3: upgrade to business, state the fare difference
    def upgradable(r, u):
        return (
            r["cabin"] == "economy"
            and future(r)
            and all(
                available(s["flight_number"], s["date"], "business", len(r["passengers"]))
                for s in r["flights"]
            )
        )

    res, user = pick(upgradable)
    card = card_of(user)
    new_total = sum(
        flights[s["flight_number"]]["dates"][s["date"]]["prices"]["business"]
        for s in res["flights"]
    ) * len(res["passengers"])
    old_total = sum(s["price"] for s in res["flights"]) * len(res["passengers"])
    tasks.append(
        task(
            3,
            "airline",
            "Upgrade a reservation to business; state the fare difference.",
            f"You want to upgrade reservation {res['reservation_id']} to business class.",
            who(user),
            None,
            f"Ask for the price difference first; pay it with {card}.",
            [
                ("get_user_details", {"user_id": user["user_id"]}),
                ("get_reservation_details", {"reservation_id": res["reservation_id"]}),
                (
                    "update_reservation_flights",
                    {
                        "reservation_id": res["reservation_id"],
                        "cabin": "business",
                        "flights": [
                            {"flight_number": s["flight_number"], "date": s["date"]}
                            for s in res["flights"]
                        ],
                        "payment_id": card,
                    },
                ),
            ],
            communicate=[str(new_total - old_total)],
        )
    )

    # 4: correct a passenger's name
    res, user = pick(lambda r, u: future(r))
    fixed = [dict(p) for p in res["passengers"]]
    fixed[0]["last_name"] = fixed[0]["last_name"] + "-" + LAST[3]
    tasks.append(
        task(
            4,
            "airline",
            "Correct a passenger's name.",
            f"On reservation {res['reservation_id']} your last name should read {fixed[0]['last_name']} (you married recently).",
            who(user),
            None,
            "Keep everything else as it is.",
            [
                ("get_user_details", {"user_id": user["user_id"]}),
                ("get_reservation_details", {"reservation_id": res["reservation_id"]}),
                (
                    "update_reservation_passengers",
                    {"reservation_id": res["reservation_id"], "passengers": fixed},
                ),
            ],
        )
    )

    # 5: book a one-way economy flight, certificate plus credit card
    def bookable(u):
        return any(m["source"] == "certificate" for m in u["payment_methods"].values())

    user = next(u for u in users.values() if u["user_id"] not in used and bookable(u))
    used.add(user["user_id"])
    date = "2024-05-22"
    flight = next(
        f
        for f in flights.values()
        if available(f["flight_number"], date, "economy", 1)
        and f["dates"][date]["prices"]["economy"] > 60
    )
    price = flight["dates"][date]["prices"]["economy"]
    cert = next(m for m in user["payment_methods"].values() if m["source"] == "certificate")
    card = card_of(user)
    split = [{"payment_id": cert["id"], "amount": min(price, int(cert["amount"]))}]
    if price > cert["amount"]:
        split.append({"payment_id": card, "amount": price - int(cert["amount"])})
    me = {
        "first_name": user["name"]["first_name"],
        "last_name": user["name"]["last_name"],
        "dob": user["dob"],
    }
    tasks.append(
        task(
            5,
            "airline",
            "Book a one-way economy flight paid by certificate and card.",
            f"You want a one-way economy ticket from {flight['origin']} to {flight['destination']} on {date}, flight {flight['flight_number']}, just for yourself.",
            who(user),
            None,
            f"No insurance, no checked bags. Use your certificate {cert['id']} first and your credit card {card} for the rest.",
            [
                ("get_user_details", {"user_id": user["user_id"]}),
                (
                    "search_direct_flight",
                    {
                        "origin": flight["origin"],
                        "destination": flight["destination"],
                        "date": date,
                    },
                ),
                (
                    "book_reservation",
                    {
                        "user_id": user["user_id"],
                        "origin": flight["origin"],
                        "destination": flight["destination"],
                        "flight_type": "one_way",
                        "cabin": "economy",
                        "flights": [{"flight_number": flight["flight_number"], "date": date}],
                        "passengers": [me],
                        "payment_methods": split,
                        "total_baggages": 0,
                        "nonfree_baggages": 0,
                        "insurance": "no",
                    },
                ),
            ],
            communicate=[str(price)],
        )
    )

    # 6: flight status question
    delayed = next(f for f in flights.values() if f["dates"][TODAY]["status"] == "delayed")
    user = next(u for u in users.values() if u["user_id"] not in used)
    used.add(user["user_id"])
    tasks.append(
        task(
            6,
            "airline",
            "Answer a flight status question.",
            f"You are meeting someone arriving today on flight {delayed['flight_number']} and want to know its status.",
            who(user),
            None,
            "Do not ask for compensation.",
            [("get_flight_status", {"flight_number": delayed["flight_number"], "date": TODAY})],
            communicate=["delayed"],
        )
    )

    # 7: business reservation: cancellation allowed
    res, user = pick(
        lambda r, u: r["cabin"] == "business" and future(r) and r["created_at"] < "2024-05-14"
    )
    refund = sum(p["amount"] for p in res["payment_history"])
    tasks.append(
        task(
            7,
            "airline",
            "Cancel a business reservation; state the refund.",
            f"You can no longer travel and want to cancel reservation {res['reservation_id']}.",
            who(user),
            None,
            "Ask how much will be refunded.",
            [
                ("get_user_details", {"user_id": user["user_id"]}),
                ("get_reservation_details", {"reservation_id": res["reservation_id"]}),
                ("cancel_reservation", {"reservation_id": res["reservation_id"]}),
            ],
            communicate=[str(refund)],
        )
    )

    # 8: move an economy flight to another date (same route), paying the difference
    def movable(r, u):
        if r["cabin"] != "economy" or r["flight_type"] != "one_way" or not future(r):
            return False
        seg = r["flights"][0]
        later = DATES[min(DATES.index(seg["date"]) + 2, len(DATES) - 1)]
        return later != seg["date"] and available(
            seg["flight_number"], later, "economy", len(r["passengers"])
        )

    res, user = pick(movable)
    seg = res["flights"][0]
    later = DATES[DATES.index(seg["date"]) + 2]
    card = card_of(user)
    diff = (
        flights[seg["flight_number"]]["dates"][later]["prices"]["economy"] - seg["price"]
    ) * len(res["passengers"])
    tasks.append(
        task(
            8,
            "airline",
            "Move a flight two days later; state the fare difference.",
            f"You want to fly two days later, on {later}, on the same flight as in reservation {res['reservation_id']}.",
            who(user),
            None,
            f"Ask for the fare difference; settle it with {card}.",
            [
                ("get_user_details", {"user_id": user["user_id"]}),
                ("get_reservation_details", {"reservation_id": res["reservation_id"]}),
                (
                    "search_direct_flight",
                    {"origin": seg["origin"], "destination": seg["destination"], "date": later},
                ),
                (
                    "update_reservation_flights",
                    {
                        "reservation_id": res["reservation_id"],
                        "cabin": "economy",
                        "flights": [{"flight_number": seg["flight_number"], "date": later}],
                        "payment_id": card,
                    },
                ),
            ],
            communicate=[str(diff)],
        )
    )

    # 9: compensation for an airline-cancelled flight (customer reserved above)
    res, user = compensated
    amount = 100 * len(res["passengers"])
    tasks.append(
        task(
            9,
            "airline",
            "Compensate a cancelled flight with a certificate.",
            f"A flight in your reservation {res['reservation_id']} was cancelled by the airline and you are upset about it.",
            who(user),
            None,
            "Complain and ask for compensation; accept a certificate. Do not cancel or change the reservation.",
            [
                ("get_user_details", {"user_id": user["user_id"]}),
                ("get_reservation_details", {"reservation_id": res["reservation_id"]}),
                ("send_certificate", {"user_id": user["user_id"], "amount": amount}),
            ],
            communicate=[str(amount)],
        )
    )

    # 10: basic economy change refused, then transfer when the customer insists on a person
    res, user = pick(lambda r, u: r["cabin"] == "basic_economy" and future(r))
    tasks.append(
        task(
            10,
            "airline",
            "Refuse a basic economy change; transfer on request.",
            f"You want to move reservation {res['reservation_id']} to another day.",
            who(user),
            None,
            "If refused, ask for a human agent.",
            [
                ("get_user_details", {"user_id": user["user_id"]}),
                ("get_reservation_details", {"reservation_id": res["reservation_id"]}),
                (
                    "transfer_to_human_agents",
                    {
                        "summary": f"Customer wants to change basic economy reservation {res['reservation_id']}, which policy does not allow."
                    },
                ),
            ],
        )
    )

    # 11: a one-stop search, then a booking for two on a trip with a connection
    user = next(u for u in users.values() if u["user_id"] not in used and u["saved_passengers"])
    used.add(user["user_id"])
    date = "2024-05-24"
    pairs = [
        (a, b)
        for a in flights.values()
        for b in flights.values()
        if a["destination"] == b["origin"]
        and a["origin"] != b["destination"]
        and "+1" not in a["scheduled_arrival_time_est"]
        and b["scheduled_departure_time_est"] >= a["scheduled_arrival_time_est"]
        and available(a["flight_number"], date, "business", 2)
        and available(b["flight_number"], date, "business", 2)
    ]
    first_leg, second_leg = pairs[0]
    people = [
        {
            "first_name": user["name"]["first_name"],
            "last_name": user["name"]["last_name"],
            "dob": user["dob"],
        },
        dict(user["saved_passengers"][0]),
    ]
    fare = (
        first_leg["dates"][date]["prices"]["business"]
        + second_leg["dates"][date]["prices"]["business"]
    ) * 2
    total = fare + 30 * 2
    card = card_of(user)
    tasks.append(
        task(
            11,
            "airline",
            "Book a connecting business trip for two with insurance.",
            f"You want to fly business class from {first_leg['origin']} to {second_leg['destination']} on {date} with {people[1]['first_name']} {people[1]['last_name']}, with one connection.",
            who(user),
            None,
            f"Take the connection through {first_leg['destination']}, buy insurance, no checked bags, pay with {card}. Ask for the total.",
            [
                ("get_user_details", {"user_id": user["user_id"]}),
                (
                    "search_onestop_flight",
                    {
                        "origin": first_leg["origin"],
                        "destination": second_leg["destination"],
                        "date": date,
                    },
                ),
                (
                    "book_reservation",
                    {
                        "user_id": user["user_id"],
                        "origin": first_leg["origin"],
                        "destination": second_leg["destination"],
                        "flight_type": "one_way",
                        "cabin": "business",
                        "flights": [
                            {"flight_number": first_leg["flight_number"], "date": date},
                            {"flight_number": second_leg["flight_number"], "date": date},
                        ],
                        "passengers": people,
                        "payment_methods": [{"payment_id": card, "amount": total}],
                        "total_baggages": 0,
                        "nonfree_baggages": 0,
                        "insurance": "yes",
                    },
                ),
            ],
            communicate=[str(total)],
        )
    )
    for t in tasks:
        t["annotations"] = None
    return tasks


def splits(tasks: list[dict]) -> dict[str, list[str]]:
    ids = [t["id"] for t in tasks]
    return {"train": ids[: len(ids) * 2 // 3], "test": ids[len(ids) * 2 // 3 :], "base": ids}


def build() -> dict[str, str]:
    """Relative path -> file text."""
    files = {}
    for domain, make_db, make_tasks, seed in (
        ("retail", retail_db, retail_tasks, 20250),
        ("airline", airline_db, airline_tasks, 20251),
    ):
        db = make_db(random.Random(seed))
        tasks = make_tasks(db)
        files[f"{domain}/db.json"] = json.dumps(db, indent=2) + "\n"
        files[f"{domain}/tasks.json"] = json.dumps(tasks, indent=2) + "\n"
        files[f"{domain}/split_tasks.json"] = json.dumps(splits(tasks), indent=2) + "\n"
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare with the files on disk")
    args = parser.parse_args(argv)
    stale = []
    for relative, text in build().items():
        path = HERE / relative
        if args.check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(relative)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    for relative in stale:
        print(f"stale: {relative}", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
