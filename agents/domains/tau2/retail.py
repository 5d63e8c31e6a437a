"""tau2 retail: the DB shape and the 15 agent tools, with tau2-bench v0.2.0 behaviour.

Faithful means the same outcome for every call, errors included: the same checks in the same
order, the same changes made before a late check fails, the same arithmetic on prices (so the
floats match bit for bit), and the same quirks (a modified item takes the price and options of the
last new item in the call; a return may go to any gift card of the customer).
"""

from __future__ import annotations

import copy
import json

from .schema import BOOL, FLOAT, STR, DictOf, ListOf, Maybe, OneOf, Record, Tagged
from .toolkit import GENERIC, READ, WRITE, Toolkit, array, choice, string, tool

ADDRESS = Record(
    "UserAddress",
    ("address1", STR),
    ("address2", STR),
    ("city", STR),
    ("country", STR),
    ("state", STR),
    ("zip", STR),
)
VARIANT = Record(
    "Variant", ("item_id", STR), ("options", DictOf(STR)), ("available", BOOL), ("price", FLOAT)
)
PRODUCT = Record("Product", ("name", STR), ("product_id", STR), ("variants", DictOf(VARIANT)))
PAYMENT_METHOD = Tagged(
    "source",
    {
        "credit_card": Record(
            "CreditCard", ("source", STR), ("id", STR), ("brand", STR), ("last_four", STR)
        ),
        "gift_card": Record("GiftCard", ("source", STR), ("id", STR), ("balance", FLOAT)),
        "paypal": Record("Paypal", ("source", STR), ("id", STR)),
    },
)
USER = Record(
    "User",
    ("user_id", STR),
    ("name", Record("UserName", ("first_name", STR), ("last_name", STR))),
    ("address", ADDRESS),
    ("email", STR),
    ("payment_methods", DictOf(PAYMENT_METHOD)),
    ("orders", ListOf(STR)),
)
ORDER_STATUSES = (
    "processed",
    "pending",
    "pending (item modified)",
    "delivered",
    "cancelled",
    "exchange requested",
    "return requested",
)
CANCEL_REASONS = ("no longer needed", "ordered by mistake")
ORDER = Record(
    "Order",
    ("order_id", STR),
    ("user_id", STR),
    ("address", ADDRESS),
    (
        "items",
        ListOf(
            Record(
                "OrderItem",
                ("name", STR),
                ("product_id", STR),
                ("item_id", STR),
                ("price", FLOAT),
                ("options", DictOf(STR)),
            )
        ),
    ),
    ("status", OneOf(*ORDER_STATUSES)),
    (
        "fulfillments",
        ListOf(Record("OrderFullfilment", ("tracking_id", ListOf(STR)), ("item_ids", ListOf(STR)))),
    ),
    (
        "payment_history",
        ListOf(
            Record(
                "OrderPayment",
                ("transaction_type", OneOf("payment", "refund")),
                ("amount", FLOAT),
                ("payment_method_id", STR),
            )
        ),
    ),
    ("cancel_reason", Maybe(OneOf(*CANCEL_REASONS)), None),
    ("exchange_items", Maybe(ListOf(STR)), None),
    ("exchange_new_items", Maybe(ListOf(STR)), None),
    ("exchange_payment_method_id", Maybe(STR), None),
    ("exchange_price_difference", Maybe(FLOAT), None),
    ("return_items", Maybe(ListOf(STR)), None),
    ("return_payment_method_id", Maybe(STR), None),
)
RETAIL_DB = Record(
    "RetailDB",
    ("products", DictOf(PRODUCT)),
    ("users", DictOf(USER)),
    ("orders", DictOf(ORDER)),
    strict=True,
)

ORDER_ID = string("The order id, starting with '#', e.g. '#W0000000'.")
USER_ID = string("The user id, e.g. 'sara_doe_496'.")
ITEM_IDS = array("Item ids, e.g. '1008292230'; an id may repeat.", {"type": "string"})
PAYMENT_METHOD_ID = string(
    "A payment method id from the user's profile, e.g. 'gift_card_0000000' or 'credit_card_0000000'."
)
NEW_ITEM_IDS = array(
    "The new item ids, position by position, each a variant of the same product.",
    {"type": "string"},
)
# Exchanging delivered items and modifying pending ones take the same arguments.
SWAP_PARAMS = dict(
    order_id=ORDER_ID,
    item_ids=ITEM_IDS,
    new_item_ids=NEW_ITEM_IDS,
    payment_method_id=PAYMENT_METHOD_ID,
)
ADDRESS_PARAMS = {
    "address1": string("First address line, e.g. '123 Main St'."),
    "address2": string("Second address line, e.g. 'Apt 1', or ''."),
    "city": string("City, e.g. 'San Francisco'."),
    "state": string("State, e.g. 'CA'."),
    "country": string("Country, e.g. 'USA'."),
    "zip": string("Zip code, e.g. '12345'."),
}


def address_of(*values: str) -> dict:
    """An address record from the tools' arguments, in ADDRESS_PARAMS order."""
    return ADDRESS(dict(zip(ADDRESS_PARAMS, values, strict=True)))


def payment(kind: str, amount: float, method_id: str) -> dict:
    return {"transaction_type": kind, "amount": FLOAT(amount), "payment_method_id": method_id}


class RetailTools(Toolkit):
    # -- lookups (KeyError-free: a missing id is a ValueError with the official text) -------

    def _order(self, order_id, edit=False):
        if order_id not in self.db.tables["orders"]:
            raise ValueError("Order not found")
        return self.db.edit("orders", order_id) if edit else self.db.get("orders", order_id)

    def _user(self, user_id, edit=False):
        if user_id not in self.db.tables["users"]:
            raise ValueError("User not found")
        return self.db.edit("users", user_id) if edit else self.db.get("users", user_id)

    def _product(self, product_id):
        if product_id not in self.db.tables["products"]:
            raise ValueError("Product not found")
        return self.db.get("products", product_id)

    def _variant(self, product_id, item_id):
        variants = self._product(product_id)["variants"]
        if item_id not in variants:
            raise ValueError("Variant not found")
        return variants[item_id]

    def _payment_method(self, user_id, method_id, edit=False):
        methods = self._user(user_id, edit)["payment_methods"]
        if method_id not in methods:
            raise ValueError("Payment method not found")
        return methods[method_id]

    @staticmethod
    def _check_items_in_order(order, item_ids, message):
        held = [item["item_id"] for item in order["items"]]
        for item_id in item_ids:
            if item_ids.count(item_id) > held.count(item_id):
                raise ValueError(message(item_id))

    def _price_difference(self, order, item_ids, new_item_ids, forbid_same=False):
        """Sum of (new price - old price) over the pairs, plus the last new variant (the official
        tools give every modified item that variant's price and options)."""
        diff, variant = 0, None
        for item_id, new_item_id in zip(item_ids, new_item_ids, strict=False):
            if forbid_same and item_id == new_item_id:
                raise ValueError("The new item id should be different from the old item id")
            item = next((i for i in order["items"] if i["item_id"] == item_id), None)
            if item is None:
                raise ValueError(f"Item {item_id} not found")
            variant = self._variant(item["product_id"], new_item_id)
            if not variant["available"]:
                raise ValueError(f"New item {new_item_id} not found or available")
            diff += variant["price"] - item["price"]
        return diff, variant

    # -- read tools ---------------------------------------------------------------------------

    @tool(
        READ,
        "Look up a customer's user id by email. Try this first; returns an error if no user matches.",
        email=string("The customer's email, e.g. 'someone@example.com'."),
    )
    def find_user_id_by_email(self, email: str) -> str:
        for user_id, user in self.db.tables["users"].items():
            if user["email"].lower() == email.lower():
                return user_id
        raise ValueError("User not found")

    @tool(
        READ,
        "Look up a customer's user id by first name, last name and zip code, for customers who "
        "cannot give their email. Returns an error if no user matches.",
        first_name=string("First name, e.g. 'John'."),
        last_name=string("Last name, e.g. 'Doe'."),
        zip=string("Zip code, e.g. '12345'."),
    )
    def find_user_id_by_name_zip(self, first_name: str, last_name: str, zip: str) -> str:
        for user_id, user in self.db.tables["users"].items():
            name = user["name"]
            if (
                name["first_name"].lower() == first_name.lower()
                and name["last_name"].lower() == last_name.lower()
                and user["address"]["zip"] == zip
            ):
                return user_id
        raise ValueError("User not found")

    @tool(READ, "Status, items, address, fulfillments and payments of an order.", order_id=ORDER_ID)
    def get_order_details(self, order_id: str) -> dict:
        return self._order(order_id)

    @tool(
        READ,
        "Inventory of a product: every variant (item) with its options, availability and price.",
        product_id=string("The product id, e.g. '6086499569' (not an item id)."),
    )
    def get_product_details(self, product_id: str) -> dict:
        return self._product(product_id)

    @tool(
        READ,
        "A customer's profile: name, address, email, payment methods and orders.",
        user_id=USER_ID,
    )
    def get_user_details(self, user_id: str) -> dict:
        return self._user(user_id)

    @tool(READ, "All product types in the store as a JSON object mapping name to product id.")
    def list_all_product_types(self) -> str:
        names = {
            product["name"]: product["product_id"]
            for product in self.db.tables["products"].values()
        }
        return json.dumps(names, sort_keys=True)

    # -- write tools (explain the change and get an explicit yes first) ------------------------

    @tool(
        WRITE,
        "Cancel a pending order and refund its payments (gift cards at once, others in 5-7 "
        "business days). Only after the customer explicitly confirms.",
        order_id=ORDER_ID,
        reason=choice("Why the order is cancelled.", *CANCEL_REASONS),
    )
    def cancel_pending_order(self, order_id: str, reason: str) -> dict:
        order = self._order(order_id)
        if order["status"] != "pending":
            raise ValueError("Non-pending order cannot be cancelled")
        if reason not in CANCEL_REASONS:
            raise ValueError("Invalid reason")
        order = self._order(order_id, edit=True)
        refunds = []
        for paid in order["payment_history"]:
            refunds.append(payment("refund", paid["amount"], paid["payment_method_id"]))
            method = self._payment_method(order["user_id"], paid["payment_method_id"], edit=True)
            if method["source"] == "gift_card":
                method["balance"] = round(method["balance"] + paid["amount"], 2)
        order["status"] = "cancelled"
        order["cancel_reason"] = reason
        order["payment_history"].extend(refunds)
        return order

    @tool(
        WRITE,
        "Change the shipping address of a pending order. Only after the customer explicitly confirms.",
        order_id=ORDER_ID,
        **ADDRESS_PARAMS,
    )
    def modify_pending_order_address(
        self,
        order_id: str,
        address1: str,
        address2: str,
        city: str,
        state: str,
        country: str,
        zip: str,
    ) -> dict:
        order = self._order(order_id)
        if "pending" not in order["status"]:
            raise ValueError("Non-pending order cannot be modified")
        address = address_of(address1, address2, city, state, country, zip)
        order = self._order(order_id, edit=True)
        order["address"] = address
        return order

    @tool(
        WRITE,
        "Swap items of a pending order for other variants of the same products, paying or "
        "refunding the difference. Possible once per order. Only after the customer explicitly confirms.",
        **SWAP_PARAMS,
    )
    def modify_pending_order_items(
        self, order_id: str, item_ids: list, new_item_ids: list, payment_method_id: str
    ) -> dict:
        order = self._order(order_id)
        if order["status"] != "pending":
            raise ValueError("Non-pending order cannot be modified")
        self._check_items_in_order(order, item_ids, lambda item_id: f"{item_id} not found")
        if len(item_ids) != len(new_item_ids):
            raise ValueError("The number of items to be exchanged should match")
        diff, variant = self._price_difference(order, item_ids, new_item_ids, forbid_same=True)
        method = self._payment_method(order["user_id"], payment_method_id)
        if method["source"] == "gift_card" and method["balance"] < diff:
            raise ValueError("Insufficient gift card balance to pay for the new item")

        order = self._order(order_id, edit=True)
        order["payment_history"].append(
            payment("payment" if diff > 0 else "refund", abs(diff), payment_method_id)
        )
        if method["source"] == "gift_card":
            method = self._payment_method(order["user_id"], payment_method_id, edit=True)
            method["balance"] = round(method["balance"] - diff, 2)
        for item_id, new_item_id in zip(item_ids, new_item_ids, strict=False):
            item = next((i for i in order["items"] if i["item_id"] == item_id), None)
            if item is None:
                raise ValueError(f"Item {item_id} not found")
            item["item_id"] = new_item_id
            item["price"] = variant["price"]
            item["options"] = copy.deepcopy(variant["options"])
        order["status"] = "pending (item modified)"
        return order

    @tool(
        WRITE,
        "Pay a pending order with another of the customer's payment methods; the old one is "
        "refunded. Only after the customer explicitly confirms.",
        order_id=ORDER_ID,
        payment_method_id=PAYMENT_METHOD_ID,
    )
    def modify_pending_order_payment(self, order_id: str, payment_method_id: str) -> dict:
        order = self._order(order_id)
        if "pending" not in order["status"]:
            raise ValueError("Non-pending order cannot be modified")
        method = self._payment_method(order["user_id"], payment_method_id)
        history = order["payment_history"]
        if len(history) != 1 or history[0]["transaction_type"] != "payment":
            raise ValueError("There should be exactly one payment for a pending order")
        old_method_id = history[0]["payment_method_id"]
        if old_method_id == payment_method_id:
            raise ValueError("The new payment method should be different from the current one")
        amount = history[0]["amount"]
        if method["source"] == "gift_card" and method["balance"] < amount:
            raise ValueError("Insufficient gift card balance to pay for the order")

        order = self._order(order_id, edit=True)
        order["payment_history"].extend(
            [
                payment("payment", amount, payment_method_id),
                payment("refund", amount, old_method_id),
            ]
        )
        if method["source"] == "gift_card":
            method = self._payment_method(order["user_id"], payment_method_id, edit=True)
            method["balance"] = round(method["balance"] - amount, 2)
        old_method = self._payment_method(order["user_id"], old_method_id)
        if old_method["source"] == "gift_card":
            old_method = self._payment_method(order["user_id"], old_method_id, edit=True)
            old_method["balance"] = round(old_method["balance"] + amount, 2)
        return order

    @tool(
        WRITE,
        "Change a customer's default address. Only after the customer explicitly confirms.",
        user_id=USER_ID,
        **ADDRESS_PARAMS,
    )
    def modify_user_address(
        self,
        user_id: str,
        address1: str,
        address2: str,
        city: str,
        state: str,
        country: str,
        zip: str,
    ) -> dict:
        self._user(user_id)
        address = address_of(address1, address2, city, state, country, zip)
        user = self._user(user_id, edit=True)
        user["address"] = address
        return user

    @tool(
        WRITE,
        "Request the return of items of a delivered order; the refund goes to the original payment "
        "method or a gift card, and the customer gets an email with instructions. Once per order. "
        "Only after the customer explicitly confirms.",
        order_id=ORDER_ID,
        item_ids=ITEM_IDS,
        payment_method_id=PAYMENT_METHOD_ID,
    )
    def return_delivered_order_items(
        self, order_id: str, item_ids: list, payment_method_id: str
    ) -> dict:
        order = self._order(order_id)
        if order["status"] != "delivered":
            raise ValueError("Non-delivered order cannot be returned")
        user = self._user(order["user_id"])
        method = self._payment_method(user["user_id"], payment_method_id)
        if (
            method["source"] != "gift_card"
            and payment_method_id != order["payment_history"][0]["payment_method_id"]
        ):
            raise ValueError("Payment method should be the original payment method")
        self._check_items_in_order(order, item_ids, lambda item_id: "Some item not found")
        order = self._order(order_id, edit=True)
        order["status"] = "return requested"
        order["return_items"] = sorted(item_ids)
        order["return_payment_method_id"] = payment_method_id
        return order

    @tool(
        WRITE,
        "Request the exchange of items of a delivered order for other variants of the same "
        "products; the price difference is paid or refunded with the given method. Once per order. "
        "Only after the customer explicitly confirms.",
        **SWAP_PARAMS,
    )
    def exchange_delivered_order_items(
        self, order_id: str, item_ids: list, new_item_ids: list, payment_method_id: str
    ) -> dict:
        order = self._order(order_id)
        if order["status"] != "delivered":
            raise ValueError("Non-delivered order cannot be exchanged")
        self._check_items_in_order(
            order, item_ids, lambda item_id: f"Number of {item_id} not found."
        )
        if len(item_ids) != len(new_item_ids):
            raise ValueError("The number of items to be exchanged should match.")
        diff, _ = self._price_difference(order, item_ids, new_item_ids)
        diff = round(diff, 2)
        method = self._payment_method(order["user_id"], payment_method_id)
        if method["source"] == "gift_card" and method["balance"] < diff:
            raise ValueError("Insufficient gift card balance to pay for the price difference")
        order = self._order(order_id, edit=True)
        order["status"] = "exchange requested"
        order["exchange_items"] = sorted(item_ids)
        order["exchange_new_items"] = sorted(new_item_ids)
        order["exchange_payment_method_id"] = payment_method_id
        order["exchange_price_difference"] = diff
        return order


class RetailToolsV1(RetailTools):
    """tau2-bench v1.0.0's retail tools: v0.2.0's and `get_item_details` (versions.py)."""

    @tool(
        READ,
        "Inventory details of one item (a product variant): its options, availability and price.",
        item_id=string("The item id, e.g. '6086499569' (not a product id)."),
    )
    def get_item_details(self, item_id: str) -> dict:
        # the official tool looks through every product's variants, in the DB's order
        for product_id in self.db.tables["products"]:
            variants = self.db.get("products", product_id)["variants"]
            if item_id in variants:
                return variants[item_id]
        raise ValueError("Item not found")


assert GENERIC  # calculate and transfer_to_human_agents come from Toolkit
