"""tau2 airline: the DB shape and the 14 agent tools, with tau2-bench v0.2.0 behaviour.

As in the official tools: the clock is fixed at 2024-05-15T15:00:00, new reservations are
HATHAT/HATHAU/HATHAV and new certificates certificate_3221322..4 (so replays are deterministic),
cancelling does not release seats, changing flights does not take seats, a travel certificate is
used up whole, and the one-stop search builds the next day's date without zero padding.
"""

from __future__ import annotations

import copy
from typing import Any

from .schema import FLOAT, INT, STR, DictOf, ListOf, Maybe, OneOf, Record, Tagged, each_record
from .toolkit import READ, WRITE, Toolkit, array, choice, integer, obj, string, tool

CABINS = ("business", "economy", "basic_economy")
NOW = "2024-05-15T15:00:00"
NEW_RESERVATION_IDS = ("HATHAT", "HATHAU", "HATHAV")
NEW_CERTIFICATE_IDS = tuple(f"certificate_{n}" for n in (3221322, 3221323, 3221324))
AIRPORTS = [
    ("SFO", "San Francisco"),
    ("JFK", "New York"),
    ("LAX", "Los Angeles"),
    ("ORD", "Chicago"),
    ("DFW", "Dallas"),
    ("DEN", "Denver"),
    ("SEA", "Seattle"),
    ("ATL", "Atlanta"),
    ("MIA", "Miami"),
    ("BOS", "Boston"),
    ("PHX", "Phoenix"),
    ("IAH", "Houston"),
    ("LAS", "Las Vegas"),
    ("MCO", "Orlando"),
    ("EWR", "Newark"),
    ("CLT", "Charlotte"),
    ("MSP", "Minneapolis"),
    ("DTW", "Detroit"),
    ("PHL", "Philadelphia"),
    ("LGA", "LaGuardia"),
]

PASSENGER = Record("Passenger", ("first_name", STR), ("last_name", STR), ("dob", STR))
PAYMENT = Record("Payment", ("payment_id", STR), ("amount", INT))
FLIGHT_INFO = Record("FlightInfo", ("flight_number", STR), ("date", STR))
RESERVATION_FLIGHT = Record(
    "ReservationFlight",
    ("flight_number", STR),
    ("origin", STR),
    ("destination", STR),
    ("date", STR),
    ("price", INT),
)
PER_CABIN = DictOf(INT, key=OneOf(*CABINS))
DEPARTED, ARRIVED = "actual_departure_time_est", "actual_arrival_time_est"
EXPECTED_DEPARTURE, EXPECTED_ARRIVAL = "estimated_departure_time_est", "estimated_arrival_time_est"
FLIGHT_DATE = Tagged(
    "status",
    {
        "available": Record(
            "FlightDateStatusAvailable",
            ("status", STR),
            ("available_seats", PER_CABIN),
            ("prices", PER_CABIN),
        ),
        "landed": Record(
            "FlightDateStatusLanded", ("status", STR), (DEPARTED, STR), (ARRIVED, STR)
        ),
        "cancelled": Record("FlightDateStatusCancelled", ("status", STR)),
        "delayed": Record(
            "FlightDateStatusDelayed",
            ("status", STR),
            (EXPECTED_DEPARTURE, STR),
            (EXPECTED_ARRIVAL, STR),
        ),
        "flying": Record(
            "FlightDataStatusFlying", ("status", STR), (DEPARTED, STR), (EXPECTED_ARRIVAL, STR)
        ),
        "on time": Record(
            "FlightDataStatusOnTime",
            ("status", STR),
            (EXPECTED_DEPARTURE, STR),
            (EXPECTED_ARRIVAL, STR),
        ),
    },
)
FLIGHT = Record(
    "Flight",
    ("flight_number", STR),
    ("origin", STR),
    ("destination", STR),
    ("scheduled_departure_time_est", STR),
    ("scheduled_arrival_time_est", STR),
    ("dates", DictOf(FLIGHT_DATE)),
)
PAYMENT_METHOD = Tagged(
    "source",
    {
        "credit_card": Record(
            "CreditCard", ("source", STR), ("id", STR), ("brand", STR), ("last_four", STR)
        ),
        "gift_card": Record("GiftCard", ("source", STR), ("id", STR), ("amount", FLOAT)),
        "certificate": Record("Certificate", ("source", STR), ("id", STR), ("amount", FLOAT)),
    },
)
USER = Record(
    "User",
    ("user_id", STR),
    ("name", Record("Name", ("first_name", STR), ("last_name", STR))),
    (
        "address",
        Record(
            "Address",
            ("address1", STR),
            ("address2", Maybe(STR), None),
            ("city", STR),
            ("country", STR),
            ("state", STR),
            ("zip", STR),
        ),
    ),
    ("email", STR),
    ("dob", STR),
    ("payment_methods", DictOf(PAYMENT_METHOD)),
    ("saved_passengers", ListOf(PASSENGER)),
    ("membership", OneOf("gold", "silver", "regular")),
    ("reservations", ListOf(STR)),
)
RESERVATION = Record(
    "Reservation",
    ("reservation_id", STR),
    ("user_id", STR),
    ("origin", STR),
    ("destination", STR),
    ("flight_type", OneOf("round_trip", "one_way")),
    ("cabin", OneOf(*CABINS)),
    ("flights", ListOf(RESERVATION_FLIGHT)),
    ("passengers", ListOf(PASSENGER)),
    ("payment_history", ListOf(PAYMENT)),
    ("created_at", STR),
    ("total_baggages", INT),
    ("nonfree_baggages", INT),
    ("insurance", OneOf("yes", "no")),
    ("status", Maybe(OneOf("cancelled")), None),
)
AIRLINE_DB = Record(
    "FlightDB",
    ("flights", DictOf(FLIGHT)),
    ("users", DictOf(USER)),
    ("reservations", DictOf(RESERVATION)),
    strict=True,
)

RESERVATION_ID = string("The reservation id, e.g. 'ZFA04Y'.")
USER_ID = string("The user id, e.g. 'sara_doe_496'.")
CABIN = choice("Cabin class.", *CABINS)
FLIGHTS = array(
    "Every flight segment of the trip (flight number and date).",
    obj(
        flight_number=string("Flight number, e.g. 'HAT001'."),
        date=string("Date as YYYY-MM-DD, e.g. '2024-05-01'."),
    ),
)
PASSENGERS = array(
    "The passengers.",
    obj(
        first_name=string("First name."),
        last_name=string("Last name."),
        dob=string("Date of birth as YYYY-MM-DD."),
    ),
)
PAYMENT_ID = string(
    "A payment method id from the user's profile, e.g. 'credit_card_7815826', 'gift_card_7815826' "
    "or 'certificate_7815826'."
)
SEARCH = {
    "origin": string("Origin airport code, e.g. 'JFK'."),
    "destination": string("Destination airport code, e.g. 'LAX'."),
    "date": string("Date as YYYY-MM-DD, e.g. '2024-05-01'."),
}


def direct_flight(flight: dict, day: dict, date: str | None = None) -> dict:
    """A search result, shaped like tau2's DirectFlight."""
    return {
        "flight_number": flight["flight_number"],
        "origin": flight["origin"],
        "destination": flight["destination"],
        "status": "available",
        "scheduled_departure_time_est": flight["scheduled_departure_time_est"],
        "scheduled_arrival_time_est": flight["scheduled_arrival_time_est"],
        "date": date,
        "available_seats": dict(day["available_seats"]),
        "prices": dict(day["prices"]),
    }


class AirlineTools(Toolkit):
    # -- lookups ------------------------------------------------------------------------------

    def _user(self, user_id, edit=False):
        if user_id not in self.db.tables["users"]:
            raise ValueError(f"User {user_id} not found")
        return self.db.edit("users", user_id) if edit else self.db.get("users", user_id)

    def _reservation(self, reservation_id, edit=False):
        if reservation_id not in self.db.tables["reservations"]:
            raise ValueError(f"Reservation {reservation_id} not found")
        if edit:
            return self.db.edit("reservations", reservation_id)
        return self.db.get("reservations", reservation_id)

    def _flight(self, flight_number):
        if flight_number not in self.db.tables["flights"]:
            raise ValueError(f"Flight {flight_number} not found")
        return self.db.get("flights", flight_number)

    def _flight_day(self, flight_number, date):
        flight = self._flight(flight_number)
        if date not in flight["dates"]:
            raise ValueError(f"Flight {flight_number} not found on date {date}")
        return flight["dates"][date]

    def _bookable_day(self, info: dict, cabin: Any, seats_needed: int) -> dict:
        day = self._flight_day(info["flight_number"], info["date"])
        if day["status"] != "available":
            raise ValueError(f"Flight {info['flight_number']} not available on date {info['date']}")
        if day["available_seats"][cabin] < seats_needed:
            raise ValueError(f"Not enough seats on flight {info['flight_number']}")
        return day

    @staticmethod
    def _infos(flights: Any) -> list[dict]:
        infos = each_record(flights, FLIGHT_INFO)
        if infos is None:  # tau2 would read .flight_number off a non-object
            raise ValueError("each flight must be an object with flight_number and date")
        return infos

    def _search(
        self, date, origin=None, destination=None, leave_after=None, stamp=False
    ) -> list[dict]:
        found = []
        for flight in self.db.tables["flights"].values():
            if (
                (origin is None or flight["origin"] == origin)
                and (destination is None or flight["destination"] == destination)
                and date in flight["dates"]
                and flight["dates"][date]["status"] == "available"
                and (leave_after is None or flight["scheduled_departure_time_est"] >= leave_after)
            ):
                found.append(direct_flight(flight, flight["dates"][date], date if stamp else None))
        return found

    def _charge_for_update(self, user_id: str, payment_id: Any, total: Any) -> dict | None:
        """Check and take an extra payment (or refund, when negative) for a change."""
        methods = self._user(user_id)["payment_methods"]
        if payment_id not in methods:
            raise ValueError("Payment method not found")
        method = methods[payment_id]
        if method["source"] == "certificate":
            raise ValueError("Certificate cannot be used to update reservation")
        if method["source"] == "gift_card" and method["amount"] < total:
            raise ValueError("Gift card balance is not enough")
        if method["source"] == "gift_card":
            self._user(user_id, edit=True)["payment_methods"][payment_id]["amount"] -= total
        return PAYMENT({"payment_id": payment_id, "amount": total}) if total != 0 else None

    # -- read tools ---------------------------------------------------------------------------

    @tool(
        READ,
        "A user's profile: name, address, payment methods, membership, saved passengers, reservations.",
        user_id=USER_ID,
    )
    def get_user_details(self, user_id: str) -> dict:
        return self._user(user_id)

    @tool(
        READ,
        "Details of a reservation: flights, passengers, payments, baggage, insurance.",
        reservation_id=RESERVATION_ID,
    )
    def get_reservation_details(self, reservation_id: str) -> dict:
        return self._reservation(reservation_id)

    @tool(READ, "Every airport served, as IATA code and city.")
    def list_all_airports(self) -> list:
        return [{"iata": iata, "city": city} for iata, city in AIRPORTS]

    @tool(READ, "Direct flights between two airports on a date that can still be booked.", **SEARCH)
    def search_direct_flight(self, origin: str, destination: str, date: str) -> list:
        return self._search(date, origin=origin, destination=destination)

    @tool(
        READ,
        "Itineraries with one connection between two airports on a date, as pairs of flights.",
        **SEARCH,
    )
    def search_onestop_flight(self, origin: str, destination: str, date: str) -> list:
        pairs = []
        for first in self._search(date, origin=origin, stamp=True):
            arrival = first["scheduled_arrival_time_est"]
            next_date = f"2024-05-{int(date[-2:]) + 1}" if "+1" in arrival else date
            for second in self._search(
                next_date,
                origin=first["destination"],
                destination=destination,
                leave_after=arrival,
                stamp=True,
            ):
                pairs.append([first, second])
        return pairs

    @tool(
        READ,
        "The status of a flight on a date (available, on time, delayed, flying, landed, cancelled).",
        flight_number=string("Flight number, e.g. 'HAT001'."),
        date=string("Date as YYYY-MM-DD."),
    )
    def get_flight_status(self, flight_number: str, date: str) -> str:
        return self._flight_day(flight_number, date)["status"]

    # -- write tools (list the details and get an explicit yes first) -------------------------

    @tool(
        WRITE,
        "Book a new reservation for a user and charge it to their payment methods. Only after the "
        "user explicitly confirms.",
        user_id=USER_ID,
        origin=string("Trip origin airport code, e.g. 'SFO'."),
        destination=string("Trip destination airport code, e.g. 'JFK'."),
        flight_type=choice("Trip type.", "one_way", "round_trip"),
        cabin=CABIN,
        flights=FLIGHTS,
        passengers=PASSENGERS,
        payment_methods=array(
            "How the total is paid: payment method ids from the profile and amounts.",
            obj(payment_id=PAYMENT_ID, amount=integer("Amount in dollars.")),
        ),
        total_baggages=integer("Total number of checked bags."),
        nonfree_baggages=integer("Number of checked bags that are paid for."),
        insurance=choice("Travel insurance.", "yes", "no"),
    )
    def book_reservation(
        self,
        user_id: str,
        origin: str,
        destination: str,
        flight_type: str,
        cabin: str,
        flights: list,
        passengers: list,
        payment_methods: list,
        total_baggages: int,
        nonfree_baggages: int,
        insurance: str,
    ) -> dict:
        infos = each_record(flights, FLIGHT_INFO)
        people = each_record(passengers, PASSENGER)
        payments = each_record(payment_methods, PAYMENT)
        user = self._user(user_id)
        reservation_id = next(
            (r for r in NEW_RESERVATION_IDS if r not in self.db.tables["reservations"]), None
        )
        if reservation_id is None:
            raise ValueError("Too many reservations")
        if people is None:
            raise ValueError("each passenger must be an object with first_name, last_name and dob")
        reservation = RESERVATION(
            {
                "reservation_id": reservation_id,
                "user_id": user_id,
                "origin": origin,
                "destination": destination,
                "flight_type": flight_type,
                "cabin": cabin,
                "flights": [],
                "passengers": people,
                "payment_history": payments if payments is not None else payment_methods,
                "created_at": NOW,
                "total_baggages": total_baggages,
                "nonfree_baggages": nonfree_baggages,
                "insurance": insurance,
            }
        )
        if infos is None:
            raise ValueError("each flight must be an object with flight_number and date")

        total, days = 0, []
        for info in infos:
            flight = self._flight(info["flight_number"])
            day = self._bookable_day(info, cabin, len(people))
            price = day["prices"][cabin]
            reservation["flights"].append(
                RESERVATION_FLIGHT(
                    {
                        **info,
                        "origin": flight["origin"],
                        "destination": flight["destination"],
                        "price": price,
                    }
                )
            )
            days.append(info)
            total += price * len(people)
        if insurance == "yes":
            total += 30 * len(people)
        total += 50 * nonfree_baggages

        methods = user["payment_methods"]
        for paid in payments:
            if paid["payment_id"] not in methods:
                raise ValueError(f"Payment method {paid['payment_id']} not found")
            method = methods[paid["payment_id"]]
            if (
                method["source"] in ("gift_card", "certificate")
                and method["amount"] < paid["amount"]
            ):
                raise ValueError(f"Not enough balance in payment method {paid['payment_id']}")
        paid_total = sum(paid["amount"] for paid in payments)
        if paid_total != total:
            raise ValueError(
                f"Payment amount does not add up, total price is {total}, but paid {paid_total}"
            )

        user = self._user(user_id, edit=True)
        for paid in payments:
            method = user["payment_methods"][paid["payment_id"]]
            if method["source"] == "gift_card":
                method["amount"] -= paid["amount"]
            elif method["source"] == "certificate":
                user["payment_methods"].pop(paid["payment_id"])
        for info in days:
            flight = self.db.edit("flights", info["flight_number"])
            flight["dates"][info["date"]]["available_seats"][cabin] -= len(people)
        self.db.put("reservations", reservation_id, reservation)
        user["reservations"].append(reservation_id)
        return reservation

    @tool(
        WRITE,
        "Cancel a whole reservation and refund every payment to where it came from. Only after "
        "the user explicitly confirms.",
        reservation_id=RESERVATION_ID,
    )
    def cancel_reservation(self, reservation_id: str) -> dict:
        reservation = self._reservation(reservation_id, edit=True)
        refunds = [
            PAYMENT({"payment_id": p["payment_id"], "amount": -p["amount"]})
            for p in reservation["payment_history"]
        ]
        reservation["payment_history"].extend(refunds)
        reservation["status"] = "cancelled"
        return reservation

    @tool(
        WRITE,
        "Set the checked baggage of a reservation; extra paid bags are charged at $50 each. Only "
        "after the user explicitly confirms.",
        reservation_id=RESERVATION_ID,
        total_baggages=integer("The new total number of checked bags."),
        nonfree_baggages=integer("The new number of paid checked bags."),
        payment_id=PAYMENT_ID,
    )
    def update_reservation_baggages(
        self, reservation_id: str, total_baggages: int, nonfree_baggages: int, payment_id: str
    ) -> dict:
        reservation = self._reservation(reservation_id)
        self._user(reservation["user_id"])
        total = 50 * max(0, nonfree_baggages - reservation["nonfree_baggages"])
        charge = self._charge_for_update(reservation["user_id"], payment_id, total)
        reservation = self._reservation(reservation_id, edit=True)
        if charge is not None:
            reservation["payment_history"].append(charge)
        reservation["total_baggages"] = total_baggages
        reservation["nonfree_baggages"] = nonfree_baggages
        return reservation

    @tool(
        WRITE,
        "Replace the flights (and cabin) of a reservation, paying or refunding the difference. "
        "List every segment of the new trip, changed or not. Only after the user explicitly confirms.",
        reservation_id=RESERVATION_ID,
        cabin=CABIN,
        flights=FLIGHTS,
        payment_id=PAYMENT_ID,
    )
    def update_reservation_flights(
        self, reservation_id: str, cabin: str, flights: list, payment_id: str
    ) -> dict:
        infos = self._infos(flights)
        reservation = self._reservation(reservation_id)
        self._user(reservation["user_id"])
        travellers = len(reservation["passengers"])

        total, segments = 0, []
        for info in infos:
            kept = next(
                (
                    seg
                    for seg in reservation["flights"]
                    if seg["flight_number"] == info["flight_number"]
                    and seg["date"] == info["date"]
                    and cabin == reservation["cabin"]
                ),
                None,
            )
            if kept is not None:
                total += kept["price"] * travellers
                segments.append(kept)
                continue
            flight = self._flight(info["flight_number"])
            day = self._bookable_day(info, cabin, travellers)
            segment = RESERVATION_FLIGHT(
                {
                    **info,
                    "origin": flight["origin"],
                    "destination": flight["destination"],
                    "price": day["prices"][cabin],
                }
            )
            total += segment["price"] * travellers
            segments.append(segment)
        total -= sum(seg["price"] for seg in reservation["flights"]) * travellers

        charge = self._charge_for_update(reservation["user_id"], payment_id, total)
        reservation = self._reservation(reservation_id, edit=True)
        if charge is not None:
            reservation["payment_history"].append(charge)
        reservation["flights"] = copy.deepcopy(segments)
        reservation["cabin"] = cabin
        return reservation

    @tool(
        WRITE,
        "Replace the passenger details of a reservation; the number of passengers cannot change. "
        "Only after the user explicitly confirms.",
        reservation_id=RESERVATION_ID,
        passengers=PASSENGERS,
    )
    def update_reservation_passengers(self, reservation_id: str, passengers: list) -> dict:
        people = each_record(passengers, PASSENGER)
        reservation = self._reservation(reservation_id)
        new = people if people is not None else passengers  # tau2 stores a raw non-object list
        if len(new) != len(reservation["passengers"]):
            raise ValueError("Number of passengers does not match")
        reservation = self._reservation(reservation_id, edit=True)
        reservation["passengers"] = copy.deepcopy(new)
        return reservation

    @tool(
        WRITE,
        "Give a user a travel certificate worth the amount, as compensation. Use with care.",
        user_id=USER_ID,
        amount=integer("Certificate value in dollars."),
    )
    def send_certificate(self, user_id: str, amount: int) -> str:
        user = self._user(user_id)
        for certificate_id in NEW_CERTIFICATE_IDS:
            if certificate_id not in user["payment_methods"]:
                certificate = PAYMENT_METHOD(
                    {"source": "certificate", "id": certificate_id, "amount": amount}
                )
                self._user(user_id, edit=True)["payment_methods"][certificate_id] = certificate
                return f"Certificate {certificate_id} added to user {user_id} with amount {amount}."
        raise ValueError("Too many certificates")
