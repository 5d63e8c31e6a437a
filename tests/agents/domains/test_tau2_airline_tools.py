"""tau2 airline tools: each tool's happy path and error paths, on a small hand-made DB.

Expected values follow tau2-bench v0.2.0: errors are "Error: ..." text; cancelling does not
release seats; a certificate is used up whole; new ids are HATHAT... and certificate_3221322...
"""

import json

import pytest

from agents.domains.tau2.airline import AIRLINE_DB, AirlineTools
from agents.domains.tau2.store import Store, canonical_json

CARD, GIFT, CERT = "credit_card_1000001", "gift_card_1000002", "certificate_1000003"


def open_day(economy_seats=5, business_seats=2, economy=120, business=400):
    return {
        "status": "available",
        "available_seats": {
            "basic_economy": 3,
            "economy": economy_seats,
            "business": business_seats,
        },
        "prices": {"basic_economy": 60, "economy": economy, "business": business},
    }


def flight(number, origin, destination, leave, arrive, dates):
    return {
        "flight_number": number,
        "origin": origin,
        "destination": destination,
        "scheduled_departure_time_est": leave,
        "scheduled_arrival_time_est": arrive,
        "dates": dates,
    }


def reservation(rid, cabin, flights, passengers, paid, **extra):
    return {
        "reservation_id": rid,
        "user_id": "lea_park_1",
        "origin": flights[0]["origin"],
        "destination": flights[-1]["destination"],
        "flight_type": "one_way",
        "cabin": cabin,
        "flights": flights,
        "passengers": passengers,
        "payment_history": [{"payment_id": CARD, "amount": paid}],
        "created_at": "2024-05-10T10:00:00",
        "total_baggages": 1,
        "nonfree_baggages": 0,
        "insurance": "no",
        **extra,
    }


LEA = {"first_name": "Lea", "last_name": "Park", "dob": "1980-02-03"}
TOM = {"first_name": "Tom", "last_name": "Park", "dob": "1979-07-08"}
RAW = {
    "flights": {
        "HAT001": flight(
            "HAT001",
            "JFK",
            "ORD",
            "08:00:00",
            "10:00:00",
            {
                "2024-05-20": open_day(),
                "2024-05-21": open_day(economy_seats=1),
                "2024-05-14": {
                    "status": "landed",
                    "actual_departure_time_est": "2024-05-14T08:05:00",
                    "actual_arrival_time_est": "2024-05-14T10:01:00",
                },
            },
        ),
        "HAT002": flight(
            "HAT002",
            "ORD",
            "LAX",
            "11:00:00",
            "13:30:00",
            {"2024-05-20": open_day(economy=90), "2024-05-21": open_day()},
        ),
        "HAT003": flight(
            "HAT003",
            "JFK",
            "LAX",
            "09:00:00",
            "12:00:00",
            {
                "2024-05-20": open_day(economy_seats=1),
                "2024-05-21": open_day(economy=150),
                "2024-05-22": {"status": "cancelled"},
            },
        ),
        "HAT004": flight(
            "HAT004",
            "LAX",
            "SEA",
            "22:00:00",
            "01:00:00+1",
            {"2024-05-20": open_day(), "2024-05-05": open_day()},
        ),
        "HAT005": flight(
            "HAT005",
            "SEA",
            "BOS",
            "06:00:00",
            "14:00:00",
            {"2024-05-21": open_day(), "2024-05-06": open_day()},
        ),
    },
    "users": {
        "lea_park_1": {
            "user_id": "lea_park_1",
            "name": {"first_name": "Lea", "last_name": "Park"},
            "address": {
                "address1": "5 Bay Rd",
                "city": "Salem",
                "country": "USA",
                "state": "MA",
                "zip": "01970",
            },
            "email": "lea.park@example.com",
            "dob": "1980-02-03",
            "payment_methods": {
                CARD: {"source": "credit_card", "id": CARD, "brand": "visa", "last_four": "1234"},
                GIFT: {"source": "gift_card", "id": GIFT, "amount": 100},
                CERT: {"source": "certificate", "id": CERT, "amount": 250},
            },
            "saved_passengers": [TOM],
            "membership": "gold",
            "reservations": ["AAA111", "BBB222"],
        }
    },
    "reservations": {
        "AAA111": reservation(
            "AAA111",
            "economy",
            [
                {
                    "flight_number": "HAT003",
                    "origin": "JFK",
                    "destination": "LAX",
                    "date": "2024-05-20",
                    "price": 130,
                }
            ],
            [LEA, TOM],
            260,
        ),
        "BBB222": reservation(
            "BBB222",
            "basic_economy",
            [
                {
                    "flight_number": "HAT001",
                    "origin": "JFK",
                    "destination": "ORD",
                    "date": "2024-05-20",
                    "price": 60,
                }
            ],
            [LEA],
            60,
        ),
    },
}
BASE = AIRLINE_DB(RAW)


@pytest.fixture
def tools():
    return AirlineTools(Store(BASE))


def ok(tools, name, **arguments):
    content, error = tools.run(name, arguments)
    assert not error, content
    try:
        return json.loads(content)
    except json.JSONDecodeError:
        return content


def fails(tools, name, expected, **arguments):
    before = canonical_json(tools.db.tables)
    content, error = tools.run(name, arguments)
    assert error and content.startswith("Error:") and expected in content, content
    assert canonical_json(tools.db.tables) == before
    return content


def booking(**changes):
    call = dict(
        user_id="lea_park_1",
        origin="JFK",
        destination="LAX",
        flight_type="one_way",
        cabin="economy",
        flights=[
            {"flight_number": "HAT001", "date": "2024-05-20"},
            {"flight_number": "HAT002", "date": "2024-05-20"},
        ],
        passengers=[LEA, TOM],
        payment_methods=[{"payment_id": GIFT, "amount": 100}, {"payment_id": CARD, "amount": 370}],
        total_baggages=3,
        nonfree_baggages=1,
        insurance="no",
    )
    return {**call, **changes}


def test_db_is_put_in_the_official_canonical_form():
    user = BASE["users"]["lea_park_1"]
    assert user["address"]["address2"] is None and list(user["address"]) == [
        "address1",
        "address2",
        "city",
        "country",
        "state",
        "zip",
    ]
    assert isinstance(user["payment_methods"][GIFT]["amount"], float)
    assert BASE["reservations"]["AAA111"]["status"] is None
    assert list(BASE["reservations"]["AAA111"]["flights"][0]) == [
        "flight_number",
        "origin",
        "destination",
        "date",
        "price",
    ]
    with pytest.raises(ValueError, match="status must be one of"):
        AIRLINE_DB(
            {
                **RAW,
                "flights": {
                    "X": {
                        **RAW["flights"]["HAT001"],
                        "dates": {"2024-05-20": {"status": "boarding"}},
                    }
                },
            }
        )


def test_schemas_have_the_official_names_and_arguments():
    names = sorted(s["function"]["name"] for s in AirlineTools.schemas())
    assert names == sorted(
        [
            "get_user_details",
            "get_reservation_details",
            "list_all_airports",
            "search_direct_flight",
            "search_onestop_flight",
            "get_flight_status",
            "book_reservation",
            "cancel_reservation",
            "update_reservation_baggages",
            "update_reservation_flights",
            "update_reservation_passengers",
            "send_certificate",
            "calculate",
            "transfer_to_human_agents",
        ]
    )
    book = next(
        s["function"] for s in AirlineTools.schemas() if s["function"]["name"] == "book_reservation"
    )
    assert book["parameters"]["required"] == [
        "user_id",
        "origin",
        "destination",
        "flight_type",
        "cabin",
        "flights",
        "passengers",
        "payment_methods",
        "total_baggages",
        "nonfree_baggages",
        "insurance",
    ]
    assert book["parameters"]["properties"]["flights"]["items"]["required"] == [
        "flight_number",
        "date",
    ]


def test_read_tools(tools):
    assert ok(tools, "get_user_details", user_id="lea_park_1")["membership"] == "gold"
    fails(tools, "get_user_details", "User lea not found", user_id="lea")
    assert ok(tools, "get_reservation_details", reservation_id="AAA111")["passengers"] == [LEA, TOM]
    fails(tools, "get_reservation_details", "Reservation ZZZ999 not found", reservation_id="ZZZ999")
    airports = ok(tools, "list_all_airports")
    assert len(airports) == 20 and {"iata": "JFK", "city": "New York"} in airports
    assert ok(tools, "get_flight_status", flight_number="HAT001", date="2024-05-14") == "landed"
    fails(
        tools,
        "get_flight_status",
        "Flight HAT001 not found on date 2024-05-30",
        flight_number="HAT001",
        date="2024-05-30",
    )
    fails(
        tools,
        "get_flight_status",
        "Flight HAT999 not found",
        flight_number="HAT999",
        date="2024-05-20",
    )


def test_search_direct_flight(tools):
    found = ok(tools, "search_direct_flight", origin="JFK", destination="LAX", date="2024-05-21")
    assert found == [
        {
            "flight_number": "HAT003",
            "origin": "JFK",
            "destination": "LAX",
            "status": "available",
            "scheduled_departure_time_est": "09:00:00",
            "scheduled_arrival_time_est": "12:00:00",
            "date": None,
            "available_seats": {"basic_economy": 3, "economy": 5, "business": 2},
            "prices": {"basic_economy": 60, "economy": 150, "business": 400},
        }
    ]
    assert (
        ok(tools, "search_direct_flight", origin="JFK", destination="LAX", date="2024-05-22") == []
    )  # cancelled
    assert (
        ok(tools, "search_direct_flight", origin="JFK", destination="LAX", date="2024-06-01") == []
    )


def test_search_onestop_flight(tools):
    pairs = ok(tools, "search_onestop_flight", origin="JFK", destination="LAX", date="2024-05-20")
    assert [[leg["flight_number"], leg["date"]] for pair in pairs for leg in pair] == [
        ["HAT001", "2024-05-20"],
        ["HAT002", "2024-05-20"],
    ]
    # An overnight first leg connects on the next day...
    pairs = ok(tools, "search_onestop_flight", origin="LAX", destination="BOS", date="2024-05-20")
    assert [[leg["flight_number"], leg["date"]] for leg in pairs[0]] == [
        ["HAT004", "2024-05-20"],
        ["HAT005", "2024-05-21"],
    ]
    # ...built without zero padding, as in tau2, so early-May overnight connections are not found.
    assert (
        ok(tools, "search_onestop_flight", origin="LAX", destination="BOS", date="2024-05-05") == []
    )


def test_book_reservation(tools):
    result = ok(tools, "book_reservation", **booking())
    assert result["reservation_id"] == "HATHAT" and result["created_at"] == "2024-05-15T15:00:00"
    assert [f["price"] for f in result["flights"]] == [120, 90]
    assert result["payment_history"] == [
        {"payment_id": GIFT, "amount": 100},
        {"payment_id": CARD, "amount": 370},
    ]  # (120 + 90) x 2 + 50
    user = tools.db.get("users", "lea_park_1")
    assert user["payment_methods"][GIFT]["amount"] == 0.0 and user["reservations"][-1] == "HATHAT"
    assert (
        tools.db.get("flights", "HAT001")["dates"]["2024-05-20"]["available_seats"]["economy"] == 3
    )
    second = ok(
        tools, "book_reservation", **booking(payment_methods=[{"payment_id": CARD, "amount": 470}])
    )
    assert second["reservation_id"] == "HATHAU"


def test_book_reservation_uses_a_certificate_up_whole(tools):
    call = booking(
        flights=[{"flight_number": "HAT002", "date": "2024-05-21"}],
        passengers=[LEA],
        nonfree_baggages=0,
        insurance="yes",
        payment_methods=[{"payment_id": CERT, "amount": 150}],
    )
    assert ok(tools, "book_reservation", **call)["insurance"] == "yes"
    assert CERT not in tools.db.get("users", "lea_park_1")["payment_methods"]


def test_book_reservation_stops_after_three_new_ids(tools):
    for _ in range(3):
        ok(
            tools,
            "book_reservation",
            **booking(
                payment_methods=[{"payment_id": CARD, "amount": 120}],
                flights=[{"flight_number": "HAT002", "date": "2024-05-21"}],
                passengers=[LEA],
                nonfree_baggages=0,
            ),
        )
    fails(tools, "book_reservation", "Too many reservations", **booking())


def test_cancel_reservation_refunds_and_keeps_seats(tools):
    result = ok(tools, "cancel_reservation", reservation_id="AAA111")
    assert result["status"] == "cancelled"
    assert result["payment_history"] == [
        {"payment_id": CARD, "amount": 260},
        {"payment_id": CARD, "amount": -260},
    ]
    assert (
        tools.db.get("flights", "HAT003")["dates"]["2024-05-20"]["available_seats"]["economy"] == 1
    )
    fails(tools, "cancel_reservation", "Reservation NOPE not found", reservation_id="NOPE")


def test_update_reservation_baggages(tools):
    result = ok(
        tools,
        "update_reservation_baggages",
        reservation_id="AAA111",
        total_baggages=4,
        nonfree_baggages=2,
        payment_id=GIFT,
    )
    assert (result["total_baggages"], result["nonfree_baggages"]) == (4, 2)
    assert result["payment_history"][-1] == {"payment_id": GIFT, "amount": 100}
    assert tools.db.get("users", "lea_park_1")["payment_methods"][GIFT]["amount"] == 0.0
    free = ok(
        tools,
        "update_reservation_baggages",
        reservation_id="BBB222",
        total_baggages=2,
        nonfree_baggages=0,
        payment_id=CARD,
    )
    assert len(free["payment_history"]) == 1  # nothing to pay: no payment recorded
    # A certificate is refused even when there is nothing to pay (the check comes first).
    fails(
        tools,
        "update_reservation_baggages",
        "Certificate cannot be used",
        reservation_id="BBB222",
        total_baggages=2,
        nonfree_baggages=0,
        payment_id=CERT,
    )


def test_update_reservation_flights(tools):
    result = ok(
        tools,
        "update_reservation_flights",
        reservation_id="AAA111",
        cabin="economy",
        flights=[{"flight_number": "HAT003", "date": "2024-05-21"}],
        payment_id=CARD,
    )
    assert result["flights"] == [
        {
            "flight_number": "HAT003",
            "origin": "JFK",
            "destination": "LAX",
            "date": "2024-05-21",
            "price": 150,
        }
    ]
    assert result["payment_history"][-1] == {"payment_id": CARD, "amount": 40}  # (150 - 130) x 2
    upgraded = ok(
        tools,
        "update_reservation_flights",
        reservation_id="AAA111",
        cabin="business",
        flights=[{"flight_number": "HAT003", "date": "2024-05-21"}],
        payment_id=CARD,
    )
    assert upgraded["cabin"] == "business" and upgraded["payment_history"][-1] == {
        "payment_id": CARD,
        "amount": 500,
    }  # 400 x 2 - 150 x 2


def test_update_reservation_flights_refund_goes_back_on_a_gift_card(tools):
    result = ok(
        tools,
        "update_reservation_flights",
        reservation_id="AAA111",
        cabin="economy",
        flights=[{"flight_number": "HAT002", "date": "2024-05-20"}],
        payment_id=GIFT,
    )
    assert result["payment_history"][-1] == {"payment_id": GIFT, "amount": -80}  # (90 - 130) x 2
    assert tools.db.get("users", "lea_park_1")["payment_methods"][GIFT]["amount"] == 180.0
    kept = ok(
        tools,
        "update_reservation_flights",
        reservation_id="BBB222",
        cabin="basic_economy",
        flights=[{"flight_number": "HAT001", "date": "2024-05-20"}],
        payment_id=CARD,
    )
    assert len(kept["payment_history"]) == 1  # same flight, same cabin: nothing to pay


def flights_to(*legs):
    return [{"flight_number": number, "date": date} for number, date in legs]


AAA111 = {"reservation_id": "AAA111"}
ERRORS = [
    (
        "book_reservation",
        "Payment amount does not add up, total price is 470, but paid 460",
        booking(payment_methods=[{"payment_id": CARD, "amount": 460}]),
    ),
    (
        "book_reservation",
        "Not enough balance in payment method gift_card_1000002",
        booking(payment_methods=[{"payment_id": GIFT, "amount": 470}]),
    ),
    (
        "book_reservation",
        "Payment method credit_card_9 not found",
        booking(payment_methods=[{"payment_id": "credit_card_9", "amount": 470}]),
    ),
    (
        "book_reservation",
        "Not enough seats on flight HAT003",
        booking(flights=flights_to(("HAT003", "2024-05-20"))),
    ),
    (
        "book_reservation",
        "Flight HAT003 not available on date 2024-05-22",
        booking(flights=flights_to(("HAT003", "2024-05-22"))),
    ),
    (
        "book_reservation",
        "Flight HAT009 not found",
        booking(flights=flights_to(("HAT009", "2024-05-20"))),
    ),
    ("book_reservation", "cabin", booking(cabin="first")),
    ("book_reservation", "User nobody not found", booking(user_id="nobody")),
    ("book_reservation", "passenger", booking(passengers=["Lea Park"])),
    ("book_reservation", "flight", booking(flights=["HAT001"])),
    ("book_reservation", "dob", booking(passengers=[{"first_name": "Lea", "last_name": "Park"}])),
    (
        "update_reservation_baggages",
        "Certificate cannot be used",
        {**AAA111, "total_baggages": 3, "nonfree_baggages": 1, "payment_id": CERT},
    ),
    (
        "update_reservation_baggages",
        "Payment method not found",
        {**AAA111, "total_baggages": 3, "nonfree_baggages": 1, "payment_id": "gift_card_0"},
    ),
    (
        "update_reservation_baggages",
        "Gift card balance is not enough",
        {**AAA111, "total_baggages": 5, "nonfree_baggages": 3, "payment_id": GIFT},
    ),
    (
        "update_reservation_baggages",
        "Reservation X not found",
        {"reservation_id": "X", "total_baggages": 1, "nonfree_baggages": 0, "payment_id": CARD},
    ),
    (
        "update_reservation_flights",
        "not available on date 2024-05-22",
        {
            **AAA111,
            "cabin": "economy",
            "flights": flights_to(("HAT003", "2024-05-22")),
            "payment_id": CARD,
        },
    ),
    (
        "update_reservation_flights",
        "Not enough seats on flight HAT001",
        {
            **AAA111,
            "cabin": "economy",
            "flights": flights_to(("HAT001", "2024-05-21")),
            "payment_id": CARD,
        },
    ),
    (
        "update_reservation_flights",
        "Certificate cannot be used",
        {
            **AAA111,
            "cabin": "economy",
            "flights": flights_to(("HAT003", "2024-05-21")),
            "payment_id": CERT,
        },
    ),
    (
        "update_reservation_flights",
        "Gift card balance is not enough",
        {
            **AAA111,
            "cabin": "business",
            "flights": flights_to(("HAT003", "2024-05-21")),
            "payment_id": GIFT,
        },
    ),
    (
        "update_reservation_flights",
        "'first'",
        {
            **AAA111,
            "cabin": "first",
            "flights": flights_to(("HAT003", "2024-05-21")),
            "payment_id": CARD,
        },
    ),
    (
        "update_reservation_flights",
        "date",
        {
            **AAA111,
            "cabin": "economy",
            "flights": [{"flight_number": "HAT003"}],
            "payment_id": CARD,
        },
    ),
]


@pytest.mark.parametrize(
    "name, expected, arguments", ERRORS, ids=[f"{n}:{e[:40]}" for n, e, _ in ERRORS]
)
def test_errors_leave_the_db_as_it_was(tools, name, expected, arguments):
    fails(tools, name, expected, **arguments)


def test_update_reservation_passengers(tools):
    renamed = [{**LEA, "last_name": "Park-Lee"}, TOM]
    assert (
        ok(tools, "update_reservation_passengers", reservation_id="AAA111", passengers=renamed)[
            "passengers"
        ]
        == renamed
    )
    fails(
        tools,
        "update_reservation_passengers",
        "Number of passengers does not match",
        reservation_id="AAA111",
        passengers=[LEA],
    )
    fails(
        tools,
        "update_reservation_passengers",
        "Reservation NOPE not found",
        reservation_id="NOPE",
        passengers=[LEA],
    )


def test_send_certificate(tools):
    assert (
        ok(tools, "send_certificate", user_id="lea_park_1", amount=50)
        == "Certificate certificate_3221322 added to user lea_park_1 with amount 50."
    )
    assert ok(tools, "send_certificate", user_id="lea_park_1", amount=100).startswith(
        "Certificate certificate_3221323 "
    )
    methods = tools.db.get("users", "lea_park_1")["payment_methods"]
    assert methods["certificate_3221322"] == {
        "source": "certificate",
        "id": "certificate_3221322",
        "amount": 50.0,
    }
    fails(tools, "send_certificate", "User nobody not found", user_id="nobody", amount=50)
    fails(tools, "send_certificate", "number", user_id="lea_park_1", amount="fifty")
    ok(tools, "send_certificate", user_id="lea_park_1", amount=1)
    fails(tools, "send_certificate", "Too many certificates", user_id="lea_park_1", amount=1)


def test_generic_tools(tools):
    assert tools.run("calculate", {"expression": "130 * 2 - 60"}) == ("200.0", False)
    assert tools.run("transfer_to_human_agents", {"summary": "x"}) == ("Transfer successful", False)


def test_writes_never_touch_the_shared_base(tools):
    before = canonical_json(BASE)
    ok(tools, "book_reservation", **booking())
    ok(
        tools,
        "update_reservation_flights",
        reservation_id="AAA111",
        cabin="economy",
        flights=[{"flight_number": "HAT003", "date": "2024-05-21"}],
        payment_id=CARD,
    )
    ok(
        tools,
        "update_reservation_baggages",
        reservation_id="AAA111",
        total_baggages=4,
        nonfree_baggages=2,
        payment_id=CARD,
    )
    ok(tools, "update_reservation_passengers", reservation_id="BBB222", passengers=[TOM])
    ok(tools, "send_certificate", user_id="lea_park_1", amount=10)
    ok(tools, "cancel_reservation", reservation_id="BBB222")
    assert canonical_json(BASE) == before
