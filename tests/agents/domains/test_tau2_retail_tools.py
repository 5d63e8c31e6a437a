"""tau2 retail tools: each tool's happy path and error paths, on a small hand-made DB.

Expected values follow tau2-bench v0.2.0 (errors come back as "Error: ..." text, never raise;
an error leaves the DB as the official tool would: untouched, or changed up to the failing check).
"""

import json

import pytest

from agents.domains.tau2.retail import RETAIL_DB, RetailTools
from agents.domains.tau2.store import Store, canonical_json

CARD, GIFT, PAYPAL, GIFT2 = (
    "credit_card_1111111",
    "gift_card_2222222",
    "paypal_3333333",
    "gift_card_4444444",
)


def item(product, item_id, price, **options):
    return {
        "name": product,
        "product_id": {"Lamp": "100", "Mug": "200"}[product],
        "item_id": item_id,
        "price": price,
        "options": options,
    }


def order(order_id, status, items, paid_with, user="ana_ruiz_1"):
    total = round(sum(i["price"] for i in items), 2)
    return {
        "order_id": order_id,
        "user_id": user,
        "address": {
            "address1": "1 Oak St",
            "address2": "",
            "city": "Reno",
            "country": "USA",
            "state": "NV",
            "zip": "89501",
        },
        "items": items,
        "status": status,
        "fulfillments": [],
        "payment_history": [
            {"transaction_type": "payment", "amount": total, "payment_method_id": paid_with}
        ],
    }


RAW = {
    "products": {
        "100": {
            "name": "Lamp",
            "product_id": "100",
            "variants": {
                "101": {
                    "item_id": "101",
                    "options": {"color": "red"},
                    "available": True,
                    "price": 10.0,
                },
                "102": {
                    "item_id": "102",
                    "options": {"color": "blue"},
                    "available": True,
                    "price": 15.5,
                },
                "103": {
                    "item_id": "103",
                    "options": {"color": "gold"},
                    "available": False,
                    "price": 99.0,
                },
            },
        },
        "200": {
            "name": "Mug",
            "product_id": "200",
            "variants": {
                "201": {"item_id": "201", "options": {"size": "S"}, "available": True, "price": 5},
                "202": {
                    "item_id": "202",
                    "options": {"size": "L"},
                    "available": True,
                    "price": 8.25,
                },
            },
        },
    },
    "users": {
        "ana_ruiz_1": {
            "user_id": "ana_ruiz_1",
            "name": {"first_name": "Ana", "last_name": "Ruiz"},
            "address": {
                "address1": "1 Oak St",
                "address2": "",
                "city": "Reno",
                "country": "USA",
                "state": "NV",
                "zip": "89501",
            },
            "email": "ana.ruiz@example.com",
            "payment_methods": {
                CARD: {"source": "credit_card", "id": CARD, "brand": "visa", "last_four": "4242"},
                GIFT: {"source": "gift_card", "id": GIFT, "balance": 20},
                PAYPAL: {"source": "paypal", "id": PAYPAL},
                GIFT2: {"source": "gift_card", "id": GIFT2, "balance": 1.0},
            },
            "orders": ["#W1", "#W2", "#W3", "#W4", "#W5"],
        },
    },
    "orders": {
        "#W1": order(
            "#W1",
            "pending",
            [item("Lamp", "101", 10.0, color="red"), item("Mug", "201", 5.0, size="S")],
            GIFT,
        ),
        "#W2": order(
            "#W2",
            "delivered",
            [item("Lamp", "101", 10.0, color="red"), item("Lamp", "101", 10.0, color="red")],
            CARD,
        ),
        "#W3": order("#W3", "processed", [item("Mug", "202", 8.25, size="L")], CARD),
        "#W4": order(
            "#W4",
            "pending",
            [item("Lamp", "102", 15.5, color="blue"), item("Mug", "201", 5.0, size="S")],
            CARD,
        ),
        "#W5": order("#W5", "pending", [item("Mug", "201", 5.0, size="S")], PAYPAL),
    },
}
BASE = RETAIL_DB(RAW)


@pytest.fixture
def tools():
    return RetailTools(Store(BASE))


def ok(tools, name, **arguments):
    content, error = tools.run(name, arguments)
    assert not error, content
    try:
        return json.loads(content)
    except json.JSONDecodeError:
        return content


def fails(tools, name, expected, **arguments):
    """The call errors with `expected` in its message and leaves the DB as it was."""
    before = canonical_json(tools.db.tables)
    content, error = tools.run(name, arguments)
    assert error and content.startswith("Error:") and expected in content, content
    assert canonical_json(tools.db.tables) == before
    return content


def test_db_is_put_in_the_official_canonical_form():
    balance = BASE["users"]["ana_ruiz_1"]["payment_methods"][GIFT]["balance"]
    assert balance == 20.0 and isinstance(
        balance, float
    )  # pydantic's float field, as tau2 hashes it
    assert isinstance(BASE["products"]["200"]["variants"]["201"]["price"], float)
    assert list(BASE["orders"]["#W1"])[-7:] == [
        "cancel_reason",
        "exchange_items",
        "exchange_new_items",
        "exchange_payment_method_id",
        "exchange_price_difference",
        "return_items",
        "return_payment_method_id",
    ]
    assert BASE["orders"]["#W1"]["cancel_reason"] is None
    with pytest.raises(ValueError, match="unknown field"):
        RETAIL_DB({**RAW, "stores": {}})
    with pytest.raises(ValueError, match="status"):
        RETAIL_DB({**RAW, "orders": {"#W9": {**RAW["orders"]["#W1"], "status": "lost"}}})


def test_schemas_have_the_official_names_and_arguments():
    names = [s["function"]["name"] for s in RetailTools.schemas()]
    assert sorted(names) == sorted(
        [
            "find_user_id_by_email",
            "find_user_id_by_name_zip",
            "get_order_details",
            "get_product_details",
            "get_user_details",
            "list_all_product_types",
            "cancel_pending_order",
            "modify_pending_order_address",
            "modify_pending_order_items",
            "modify_pending_order_payment",
            "modify_user_address",
            "return_delivered_order_items",
            "exchange_delivered_order_items",
            "calculate",
            "transfer_to_human_agents",
        ]
    )
    by_name = {s["function"]["name"]: s["function"] for s in RetailTools.schemas()}
    assert by_name["exchange_delivered_order_items"]["parameters"]["required"] == [
        "order_id",
        "item_ids",
        "new_item_ids",
        "payment_method_id",
    ]
    assert by_name["find_user_id_by_name_zip"]["parameters"]["required"] == [
        "first_name",
        "last_name",
        "zip",
    ]
    assert by_name["list_all_product_types"]["parameters"]["required"] == []
    for schema in RetailTools.schemas():
        assert schema["type"] == "function" and schema["function"]["description"]
        params = schema["function"]["parameters"]
        assert params["type"] == "object" and set(params["required"]) == set(params["properties"])


def test_bad_calls_are_error_messages(tools):
    assert tools.run("drop_database", {}) == ("Error: Tool 'drop_database' not found.", True)
    content, error = tools.run("get_order_details", "{not json")
    assert error and "not valid JSON" in content
    content, error = tools.run("get_order_details", "[1]")
    assert error and "JSON object" in content
    fails(tools, "get_order_details", "order_id")  # missing argument
    fails(tools, "get_order_details", "unexpected", order_id="#W1", note="x")
    fails(tools, "get_order_details", "unhashable", order_id=["#W1"])
    assert tools.run("get_order_details", '{"order_id": "#W1"}')[1] is False  # JSON text works too


def test_find_user(tools):
    assert ok(tools, "find_user_id_by_email", email="ANA.Ruiz@example.com") == "ana_ruiz_1"
    fails(tools, "find_user_id_by_email", "User not found", email="ana@example.com")
    assert (
        ok(tools, "find_user_id_by_name_zip", first_name="ana", last_name="RUIZ", zip="89501")
        == "ana_ruiz_1"
    )
    fails(
        tools,
        "find_user_id_by_name_zip",
        "User not found",
        first_name="Ana",
        last_name="Ruiz",
        zip="89502",
    )


def test_read_tools(tools):
    assert ok(tools, "get_order_details", order_id="#W1") == BASE["orders"]["#W1"]
    fails(tools, "get_order_details", "Order not found", order_id="W1")
    assert (
        ok(tools, "get_product_details", product_id="100")["variants"]["103"]["available"] is False
    )
    fails(tools, "get_product_details", "Product not found", product_id="101")  # an item id
    assert ok(tools, "get_user_details", user_id="ana_ruiz_1")["orders"] == [
        "#W1",
        "#W2",
        "#W3",
        "#W4",
        "#W5",
    ]
    fails(tools, "get_user_details", "User not found", user_id="ana")
    assert ok(tools, "list_all_product_types") == {"Lamp": "100", "Mug": "200"}


def test_cancel_pending_order_refunds_gift_cards_at_once(tools):
    result = ok(tools, "cancel_pending_order", order_id="#W1", reason="ordered by mistake")
    assert result["status"] == "cancelled" and result["cancel_reason"] == "ordered by mistake"
    assert result["payment_history"][-1] == {
        "transaction_type": "refund",
        "amount": 15.0,
        "payment_method_id": GIFT,
    }
    assert tools.db.get("users", "ana_ruiz_1")["payment_methods"][GIFT]["balance"] == 35.0
    fails(
        tools,
        "cancel_pending_order",
        "Non-pending order cannot be cancelled",
        order_id="#W1",
        reason="no longer needed",
    )
    card = ok(tools, "cancel_pending_order", order_id="#W4", reason="no longer needed")
    assert card["payment_history"][-1] == {
        "transaction_type": "refund",
        "amount": 20.5,
        "payment_method_id": CARD,
    }


def test_modify_pending_order_address(tools):
    new = dict(
        address1="9 Elm", address2="Apt 2", city="Ely", state="NV", country="USA", zip="89301"
    )
    result = ok(tools, "modify_pending_order_address", order_id="#W1", **new)
    assert result["address"] == {
        "address1": "9 Elm",
        "address2": "Apt 2",
        "city": "Ely",
        "country": "USA",
        "state": "NV",
        "zip": "89301",
    }
    fails(
        tools,
        "modify_pending_order_address",
        "Non-pending order cannot be modified",
        order_id="#W2",
        **new,
    )
    fails(
        tools,
        "modify_pending_order_address",
        "expected a string",
        order_id="#W4",
        **{**new, "zip": 89301},
    )


def test_modify_pending_order_items_pays_by_gift_card(tools):
    result = ok(
        tools,
        "modify_pending_order_items",
        order_id="#W1",
        item_ids=["101"],
        new_item_ids=["102"],
        payment_method_id=GIFT,
    )
    assert result["status"] == "pending (item modified)"
    assert result["items"][0] == {
        "name": "Lamp",
        "product_id": "100",
        "item_id": "102",
        "price": 15.5,
        "options": {"color": "blue"},
    }
    assert result["payment_history"][-1] == {
        "transaction_type": "payment",
        "amount": 5.5,
        "payment_method_id": GIFT,
    }
    assert tools.db.get("users", "ana_ruiz_1")["payment_methods"][GIFT]["balance"] == 14.5
    # Once per order: the status is no longer exactly "pending".
    fails(
        tools,
        "modify_pending_order_items",
        "Non-pending",
        order_id="#W1",
        item_ids=["201"],
        new_item_ids=["202"],
        payment_method_id=GIFT,
    )


def test_modify_pending_order_items_gives_every_item_the_last_variant_price(tools):
    # tau2 v0.2.0 prices each modified item with the last new variant of the call.
    result = ok(
        tools,
        "modify_pending_order_items",
        order_id="#W4",
        item_ids=["102", "201"],
        new_item_ids=["101", "202"],
        payment_method_id=CARD,
    )
    assert [(i["item_id"], i["price"], i["options"]) for i in result["items"]] == [
        ("101", 8.25, {"size": "L"}),
        ("202", 8.25, {"size": "L"}),
    ]
    assert result["payment_history"][-1]["transaction_type"] == "refund"
    assert result["payment_history"][-1]["amount"] == pytest.approx(2.25)


def test_modify_pending_order_payment(tools):
    result = ok(tools, "modify_pending_order_payment", order_id="#W4", payment_method_id=PAYPAL)
    assert result["payment_history"][1:] == [
        {"transaction_type": "payment", "amount": 20.5, "payment_method_id": PAYPAL},
        {"transaction_type": "refund", "amount": 20.5, "payment_method_id": CARD},
    ]
    fails(
        tools,
        "modify_pending_order_payment",
        "exactly one payment",
        order_id="#W4",
        payment_method_id=GIFT,
    )


def test_modify_pending_order_payment_refunds_an_old_gift_card(tools):
    ok(tools, "modify_pending_order_payment", order_id="#W1", payment_method_id=PAYPAL)
    assert tools.db.get("users", "ana_ruiz_1")["payment_methods"][GIFT]["balance"] == 35.0


def test_modify_pending_order_payment_fails_late_like_tau2(tools):
    # The old method is looked up after the new payment is recorded: if it is gone, the
    # official tool has already changed the order and the new gift card before failing.
    user = tools.db.edit("users", "ana_ruiz_1")
    del user["payment_methods"][PAYPAL]
    content, error = tools.run(
        "modify_pending_order_payment", {"order_id": "#W5", "payment_method_id": GIFT}
    )
    assert error and "Payment method not found" in content
    assert len(tools.db.get("orders", "#W5")["payment_history"]) == 3
    assert tools.db.get("users", "ana_ruiz_1")["payment_methods"][GIFT]["balance"] == 15.0


def test_modify_user_address(tools):
    new = dict(address1="2 Pine", address2="", city="Elko", state="NV", country="USA", zip="89801")
    assert (
        ok(tools, "modify_user_address", user_id="ana_ruiz_1", **new)["address"]["city"] == "Elko"
    )
    assert tools.db.get("orders", "#W1")["address"]["city"] == "Reno"  # orders keep their address
    fails(tools, "modify_user_address", "User not found", user_id="bob", **new)


def test_return_delivered_order_items(tools):
    result = ok(
        tools,
        "return_delivered_order_items",
        order_id="#W2",
        item_ids=["101", "101"],
        payment_method_id=CARD,
    )
    assert (result["status"], result["return_items"], result["return_payment_method_id"]) == (
        "return requested",
        ["101", "101"],
        CARD,
    )
    fails(
        tools,
        "return_delivered_order_items",
        "Non-delivered",
        order_id="#W2",
        item_ids=["101"],
        payment_method_id=CARD,
    )


def test_return_goes_to_the_original_method_or_any_gift_card(tools):
    fails(
        tools,
        "return_delivered_order_items",
        "should be the original payment method",
        order_id="#W2",
        item_ids=["101"],
        payment_method_id=PAYPAL,
    )
    fails(
        tools,
        "return_delivered_order_items",
        "Some item not found",
        order_id="#W2",
        item_ids=["101", "101", "101"],
        payment_method_id=CARD,
    )
    fails(
        tools,
        "return_delivered_order_items",
        "Non-delivered",
        order_id="#W1",
        item_ids=["101"],
        payment_method_id=GIFT,
    )
    assert (
        ok(
            tools,
            "return_delivered_order_items",
            order_id="#W2",
            item_ids=["101"],
            payment_method_id=GIFT2,
        )["return_payment_method_id"]
        == GIFT2
    )


def test_exchange_delivered_order_items(tools):
    result = ok(
        tools,
        "exchange_delivered_order_items",
        order_id="#W2",
        item_ids=["101"],
        new_item_ids=["102"],
        payment_method_id=CARD,
    )
    assert result["status"] == "exchange requested"
    assert (
        result["exchange_items"],
        result["exchange_new_items"],
        result["exchange_price_difference"],
    ) == (["101"], ["102"], 5.5)
    assert result["items"][0]["item_id"] == "101"  # items change only when the exchange completes
    fails(
        tools,
        "exchange_delivered_order_items",
        "Non-delivered",
        order_id="#W2",
        item_ids=["101"],
        new_item_ids=["102"],
        payment_method_id=CARD,
    )


W1_GIFT = {"order_id": "#W1", "payment_method_id": GIFT}
ERRORS = [
    ("cancel_pending_order", "Non-pending", {"order_id": "#W3", "reason": "no longer needed"}),
    ("cancel_pending_order", "Invalid reason", {"order_id": "#W4", "reason": "too slow"}),
    ("cancel_pending_order", "Order not found", {"order_id": "#W0", "reason": "no longer needed"}),
    (
        "modify_pending_order_items",
        "should be different",
        {**W1_GIFT, "item_ids": ["101"], "new_item_ids": ["101"]},
    ),
    (
        "modify_pending_order_items",
        "should match",
        {**W1_GIFT, "item_ids": ["101"], "new_item_ids": ["102", "103"]},
    ),
    (
        "modify_pending_order_items",
        "102 not found",
        {**W1_GIFT, "item_ids": ["102"], "new_item_ids": ["101"]},
    ),
    (
        "modify_pending_order_items",
        "New item 103 not found or available",
        {**W1_GIFT, "item_ids": ["101"], "new_item_ids": ["103"]},
    ),
    (
        "modify_pending_order_items",
        "Variant not found",
        {**W1_GIFT, "item_ids": ["101"], "new_item_ids": ["202"]},
    ),
    (
        "modify_pending_order_items",
        "Insufficient gift card balance",
        {**W1_GIFT, "item_ids": ["101"], "new_item_ids": ["102"], "payment_method_id": GIFT2},
    ),
    (
        "modify_pending_order_items",
        "Payment method not found",
        {
            **W1_GIFT,
            "item_ids": ["101"],
            "new_item_ids": ["102"],
            "payment_method_id": "gift_card_0",
        },
    ),
    (
        "modify_pending_order_payment",
        "different from the current one",
        {"order_id": "#W5", "payment_method_id": PAYPAL},
    ),
    (
        "modify_pending_order_payment",
        "Insufficient gift card balance",
        {"order_id": "#W5", "payment_method_id": GIFT2},
    ),
    ("modify_pending_order_payment", "Non-pending", {"order_id": "#W2", "payment_method_id": GIFT}),
    (
        "modify_pending_order_payment",
        "Payment method not found",
        {"order_id": "#W5", "payment_method_id": "paypal_0"},
    ),
    (
        "exchange_delivered_order_items",
        "Number of 102 not found.",
        {
            "order_id": "#W2",
            "item_ids": ["102"],
            "new_item_ids": ["101"],
            "payment_method_id": CARD,
        },
    ),
    (
        "exchange_delivered_order_items",
        "should match.",
        {"order_id": "#W2", "item_ids": ["101"], "new_item_ids": [], "payment_method_id": CARD},
    ),
    (
        "exchange_delivered_order_items",
        "New item 103 not found or available",
        {
            "order_id": "#W2",
            "item_ids": ["101"],
            "new_item_ids": ["103"],
            "payment_method_id": CARD,
        },
    ),
    (
        "exchange_delivered_order_items",
        "Insufficient gift card balance",
        {
            "order_id": "#W2",
            "item_ids": ["101"],
            "new_item_ids": ["102"],
            "payment_method_id": GIFT2,
        },
    ),
    (
        "exchange_delivered_order_items",
        "Non-delivered",
        {
            "order_id": "#W3",
            "item_ids": ["202"],
            "new_item_ids": ["201"],
            "payment_method_id": CARD,
        },
    ),
    ("calculate", "Invalid characters", {"expression": "__import__('os')"}),
    ("calculate", "division by zero", {"expression": "1 / 0"}),
    ("calculate", "Exponent too large", {"expression": "9 ** 9 ** 9"}),
    ("calculate", "Invalid expression", {"expression": "2 +"}),
]


@pytest.mark.parametrize(
    "name, expected, arguments", ERRORS, ids=[f"{n}:{e}" for n, e, _ in ERRORS]
)
def test_errors_leave_the_db_as_it_was(tools, name, expected, arguments):
    fails(tools, name, expected, **arguments)


def test_calculate_and_transfer(tools):
    assert tools.run("calculate", {"expression": "(2 + 3) * 4 / 3"}) == ("6.67", False)
    assert tools.run("calculate", {"expression": "2 ** 10"}) == ("1024.0", False)
    assert ok(tools, "transfer_to_human_agents", summary="wants a person") == "Transfer successful"


def test_writes_never_touch_the_shared_base(tools):
    before = canonical_json(BASE)
    ok(tools, "cancel_pending_order", order_id="#W1", reason="no longer needed")
    ok(
        tools,
        "modify_pending_order_items",
        order_id="#W4",
        item_ids=["102"],
        new_item_ids=["101"],
        payment_method_id=GIFT,
    )
    ok(tools, "modify_pending_order_payment", order_id="#W5", payment_method_id=GIFT)
    ok(
        tools,
        "modify_pending_order_address",
        order_id="#W5",
        address1="a",
        address2="b",
        city="c",
        state="d",
        country="e",
        zip="f",
    )
    ok(
        tools,
        "modify_user_address",
        user_id="ana_ruiz_1",
        address1="a",
        address2="b",
        city="c",
        state="d",
        country="e",
        zip="f",
    )
    ok(
        tools,
        "exchange_delivered_order_items",
        order_id="#W2",
        item_ids=["101"],
        new_item_ids=["102"],
        payment_method_id=CARD,
    )
    assert canonical_json(BASE) == before
    assert canonical_json(RetailTools(Store(BASE)).db.tables) == before
