"""The airline domain's tools, ported from tau2-bench (as inspect-evals 0.26.0 ships them) to
`@tool` functions over the rollout's own database.

The rules are the original's, quirks included, so that a task's reference actions leave the same
database (the parity test checks every task against the original tools' result): the database's
clock stands at 2024-05-15 15:00 EST, new reservations take the ids HATHAT, HATHAU, HATHAV, new
certificates certificate_3221322..4, a flight change does not move seat counts, and a one-stop
search builds the next day's date without zero padding.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

from conveyor.agent.tools import ToolContext, tool
from conveyor.tasks.tau2.common import (
    DomainTools,
    ToolError,
    calculate,
    dump,
    lookup,
    object_parameters,
    transfer_to_human_agents,
    world,
)

DOMAIN = "airline"
NOW = "2024-05-15T15:00:00"
NEW_RESERVATION_IDS = ("HATHAT", "HATHAU", "HATHAV")
NEW_PAYMENT_NUMBERS = (3221322, 3221323, 3221324)
INSURANCE_FEE = 30
BAG_FEE = 50
AIRPORTS = (
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
)

Cabin = Literal["business", "economy", "basic_economy"]


class FlightInfo(BaseModel):
    """One flight of a trip."""

    flight_number: str
    date: str


class Passenger(BaseModel):
    """A traveller on a reservation."""

    first_name: str
    last_name: str
    dob: str


class Payment(BaseModel):
    """An amount paid with one of the user's payment methods."""

    payment_id: str
    amount: int


def _db(ctx: ToolContext) -> dict[str, Any]:
    return AIRLINE.db(ctx)


def _user(db: dict[str, Any], user_id: str) -> dict[str, Any]:
    return lookup(db["users"], user_id, f"User {user_id} not found")


def _reservation(db: dict[str, Any], reservation_id: str) -> dict[str, Any]:
    return lookup(db["reservations"], reservation_id, f"Reservation {reservation_id} not found")


def _flight(db: dict[str, Any], flight_number: str) -> dict[str, Any]:
    return lookup(db["flights"], flight_number, f"Flight {flight_number} not found")


def _flight_date(db: dict[str, Any], flight_number: str, date: str) -> dict[str, Any]:
    dates = _flight(db, flight_number)["dates"]
    return lookup(dates, date, f"Flight {flight_number} not found on date {date}")


def _bookable(db: dict[str, Any], flight_number: str, date: str, cabin: str, seats: int) -> Any:
    """The flight's status on `date`, checked open with `seats` free seats in `cabin`."""
    status = _flight_date(db, flight_number, date)
    if status["status"] != "available":
        raise ToolError(f"Flight {flight_number} not available on date {date}")
    if status["available_seats"][cabin] < seats:
        raise ToolError(f"Not enough seats on flight {flight_number}")
    return status


def _direct(
    db: dict[str, Any],
    date: str,
    origin: str | None,
    destination: str | None,
    leave_after: str | None = None,
) -> list[dict[str, Any]]:
    found = []
    for flight in db["flights"].values():
        status = flight["dates"].get(date)
        if (
            (origin is None or flight["origin"] == origin)
            and (destination is None or flight["destination"] == destination)
            and status is not None
            and status["status"] == "available"
            and (leave_after is None or flight["scheduled_departure_time_est"] >= leave_after)
        ):
            found.append(
                {
                    "flight_number": flight["flight_number"],
                    "origin": flight["origin"],
                    "destination": flight["destination"],
                    "status": "available",
                    "scheduled_departure_time_est": flight["scheduled_departure_time_est"],
                    "scheduled_arrival_time_est": flight["scheduled_arrival_time_est"],
                    "date": None,
                    "available_seats": status["available_seats"],
                    "prices": status["prices"],
                }
            )
    return found


def _charge_update(user: dict[str, Any], payment_id: str, total: int) -> dict[str, Any] | None:
    """Charge (or refund, when negative) `total` for a change; the payment record, or None when
    nothing is due. Certificates cannot pay for changes."""
    method = lookup(user["payment_methods"], payment_id, "Payment method not found")
    if method["source"] == "certificate":
        raise ToolError("Certificate cannot be used to update reservation")
    if method["source"] == "gift_card" and method["amount"] < total:
        raise ToolError("Gift card balance is not enough")
    if method["source"] == "gift_card":
        method["amount"] -= total
    return {"payment_id": payment_id, "amount": total} if total != 0 else None


@tool
async def book_reservation(
    user_id: str,
    origin: str,
    destination: str,
    flight_type: Literal["round_trip", "one_way"],
    cabin: Cabin,
    flights: list[dict[str, str]],
    passengers: list[dict[str, str]],
    payment_methods: list[dict[str, str]],
    total_baggages: int,
    nonfree_baggages: int,
    insurance: Literal["yes", "no"],
    ctx: ToolContext,
) -> str:
    """Book a reservation.

    Args:
        user_id: The ID of the user to book the reservation such as 'sara_doe_496'.
        origin: The IATA code for the origin city such as 'SFO'.
        destination: The IATA code for the destination city such as 'JFK'.
        flight_type: The type of flight such as 'one_way' or 'round_trip'.
        cabin: The cabin class such as 'basic_economy', 'economy', or 'business'.
        flights: An array of objects containing details about each piece of flight. Example:
            [{"flight_number": "HAT001", "date": "2024-05-01"}].
        passengers: An array of objects containing details about each passenger. Example:
            [{"first_name": "John", "last_name": "Doe", "dob": "1990-01-01"}].
        payment_methods: An array of objects containing details about each payment method.
            Example: [{"payment_id": "gift_card_3576581", "amount": 4986}].
        total_baggages: The total number of baggage items to book the reservation.
        nonfree_baggages: The number of non-free baggage items to book the reservation.
        insurance: Whether the reservation has insurance.
    """
    db = _db(ctx)
    legs: list[FlightInfo] = flights  # type: ignore[assignment]  # validated as models
    people: list[Passenger] = passengers  # type: ignore[assignment]
    payments: list[Payment] = payment_methods  # type: ignore[assignment]
    user = _user(db, user_id)
    reservation_id = next((r for r in NEW_RESERVATION_IDS if r not in db["reservations"]), None)
    if reservation_id is None:
        raise ToolError("Too many reservations")
    booked: list[dict[str, Any]] = []
    statuses = []
    total = 0
    for leg in legs:
        flight = _flight(db, leg.flight_number)
        status = _bookable(db, leg.flight_number, leg.date, cabin, len(people))
        price = status["prices"][cabin]
        booked.append(
            {
                "flight_number": leg.flight_number,
                "origin": flight["origin"],
                "destination": flight["destination"],
                "date": leg.date,
                "price": price,
            }
        )
        statuses.append(status)
        total += price * len(people)
    if insurance == "yes":
        total += INSURANCE_FEE * len(people)
    total += BAG_FEE * nonfree_baggages
    for payment in payments:
        missing = f"Payment method {payment.payment_id} not found"
        method = lookup(user["payment_methods"], payment.payment_id, missing)
        if method["source"] in ("gift_card", "certificate") and method["amount"] < payment.amount:
            raise ToolError(f"Not enough balance in payment method {payment.payment_id}")
    paid = sum(payment.amount for payment in payments)
    if paid != total:
        raise ToolError(f"Payment amount does not add up, total price is {total}, but paid {paid}")
    for payment in payments:
        method = user["payment_methods"][payment.payment_id]
        if method["source"] == "gift_card":
            method["amount"] -= payment.amount
        elif method["source"] == "certificate":
            user["payment_methods"].pop(payment.payment_id)
    for status in statuses:
        status["available_seats"][cabin] -= len(people)
    reservation = {
        "reservation_id": reservation_id,
        "user_id": user_id,
        "origin": origin,
        "destination": destination,
        "flight_type": flight_type,
        "cabin": cabin,
        "flights": booked,
        "passengers": [p.model_dump() for p in people],
        "payment_history": [p.model_dump() for p in payments],
        "created_at": NOW,
        "total_baggages": total_baggages,
        "nonfree_baggages": nonfree_baggages,
        "insurance": insurance,
    }
    db["reservations"][reservation_id] = reservation
    user["reservations"].append(reservation_id)
    return dump(reservation)


object_parameters(
    book_reservation,
    flights=list[FlightInfo],
    passengers=list[Passenger],
    payment_methods=list[Payment],
)


@tool
async def cancel_reservation(reservation_id: str, ctx: ToolContext) -> str:
    """Cancel the whole reservation.

    Args:
        reservation_id: The reservation ID, such as 'ZFA04Y'.
    """
    reservation = _reservation(_db(ctx), reservation_id)
    refunds = [
        {"payment_id": p["payment_id"], "amount": -p["amount"]}
        for p in reservation["payment_history"]
    ]
    reservation["payment_history"].extend(refunds)
    reservation["status"] = "cancelled"
    return dump(reservation)


@tool
async def get_reservation_details(reservation_id: str, ctx: ToolContext) -> str:
    """Get the details of a reservation.

    Args:
        reservation_id: The reservation ID, such as '8JX2WO'.
    """
    return dump(_reservation(_db(ctx), reservation_id))


@tool
async def get_user_details(user_id: str, ctx: ToolContext) -> str:
    """Get the details of a user, including their reservations.

    Args:
        user_id: The user ID, such as 'sara_doe_496'.
    """
    return dump(_user(_db(ctx), user_id))


@tool
async def list_all_airports(ctx: ToolContext) -> str:
    """Returns a list of all available airports."""
    world(ctx, DOMAIN)
    return dump([{"iata": code, "city": city} for code, city in AIRPORTS])


@tool
async def search_direct_flight(origin: str, destination: str, date: str, ctx: ToolContext) -> str:
    """Search for direct flights between two cities on a specific date.

    Args:
        origin: The origin city airport in three letters, such as 'JFK'.
        destination: The destination city airport in three letters, such as 'LAX'.
        date: The date of the flight in the format 'YYYY-MM-DD', such as '2024-01-01'.
    """
    return dump(_direct(_db(ctx), date, origin, destination))


@tool
async def search_onestop_flight(origin: str, destination: str, date: str, ctx: ToolContext) -> str:
    """Search for one-stop flights between two cities on a specific date.

    Args:
        origin: The origin city airport in three letters, such as 'JFK'.
        destination: The destination city airport in three letters, such as 'LAX'.
        date: The date of the flight in the format 'YYYY-MM-DD', such as '2024-05-01'.
    """
    db = _db(ctx)
    pairs = []
    for first in _direct(db, date, origin, None):
        first["date"] = date
        if "+1" in first["scheduled_arrival_time_est"]:
            try:
                day = int(date[-2:])
            except ValueError:
                raise ToolError(f"Invalid date {date!r}: expected YYYY-MM-DD") from None
            next_date = f"2024-05-{day + 1}"  # no zero padding: the original's rule
        else:
            next_date = date
        leave_after = first["scheduled_arrival_time_est"]
        for second in _direct(db, next_date, first["destination"], destination, leave_after):
            second["date"] = next_date
            pairs.append([first, second])
    return dump(pairs)


@tool
async def send_certificate(user_id: str, amount: int, ctx: ToolContext) -> str:
    """Send a certificate to a user. Be careful!

    Args:
        user_id: The ID of the user to book the reservation, such as 'sara_doe_496'.
        amount: The amount of the certificate to send.
    """
    user = _user(_db(ctx), user_id)
    for number in NEW_PAYMENT_NUMBERS:
        payment_id = f"certificate_{number}"
        if payment_id not in user["payment_methods"]:
            user["payment_methods"][payment_id] = {
                "source": "certificate",
                "id": payment_id,
                "amount": amount,
            }
            return f"Certificate {payment_id} added to user {user_id} with amount {amount}."
    raise ToolError("Too many certificates")


@tool
async def update_reservation_baggages(
    reservation_id: str,
    total_baggages: int,
    nonfree_baggages: int,
    payment_id: str,
    ctx: ToolContext,
) -> str:
    """Update the baggage information of a reservation.

    Args:
        reservation_id: The reservation ID, such as 'ZFA04Y'.
        total_baggages: The updated total number of baggage items included in the reservation.
        nonfree_baggages: The updated number of non-free baggage items included in the reservation.
        payment_id: The payment id stored in user profile, such as 'credit_card_7815826',
            'gift_card_7815826', 'certificate_7815826'.
    """
    db = _db(ctx)
    reservation = _reservation(db, reservation_id)
    user = _user(db, reservation["user_id"])
    total = BAG_FEE * max(0, nonfree_baggages - reservation["nonfree_baggages"])
    payment = _charge_update(user, payment_id, total)
    if payment is not None:
        reservation["payment_history"].append(payment)
    reservation["total_baggages"] = total_baggages
    reservation["nonfree_baggages"] = nonfree_baggages
    return dump(reservation)


@tool
async def update_reservation_flights(
    reservation_id: str,
    cabin: Cabin,
    flights: list[dict[str, str]],
    payment_id: str,
    ctx: ToolContext,
) -> str:
    """Update the flight information of a reservation.

    Args:
        reservation_id: The reservation ID, such as 'ZFA04Y'.
        cabin: The cabin class of the reservation.
        flights: An array of objects containing details about each piece of flight in the ENTIRE
            new reservation. Even if the a flight segment is not changed, it should still be
            included in the array. For example: [{"flight_number": "HAT001", "date": "2024-05-01"}].
        payment_id: The payment id stored in user profile, such as 'credit_card_7815826',
            'gift_card_7815826', 'certificate_7815826'.
    """
    db = _db(ctx)
    legs: list[FlightInfo] = flights  # type: ignore[assignment]  # validated as models
    reservation = _reservation(db, reservation_id)
    user = _user(db, reservation["user_id"])
    travellers = len(reservation["passengers"])
    total = 0
    new_flights: list[dict[str, Any]] = []
    for leg in legs:
        kept = next(
            (
                booked
                for booked in reservation["flights"]
                if booked["flight_number"] == leg.flight_number
                and booked["date"] == leg.date
                and cabin == reservation["cabin"]
            ),
            None,
        )
        if kept is not None:
            total += kept["price"] * travellers
            new_flights.append(kept)
            continue
        flight = _flight(db, leg.flight_number)
        status = _bookable(db, leg.flight_number, leg.date, cabin, travellers)
        new_flights.append(
            {
                "flight_number": leg.flight_number,
                "date": leg.date,
                "price": status["prices"][cabin],
                "origin": flight["origin"],
                "destination": flight["destination"],
            }
        )
        total += status["prices"][cabin] * travellers
    total -= sum(booked["price"] for booked in reservation["flights"]) * travellers
    payment = _charge_update(user, payment_id, total)
    if payment is not None:
        reservation["payment_history"].append(payment)
    reservation["flights"] = new_flights
    reservation["cabin"] = cabin
    return dump(reservation)


object_parameters(update_reservation_flights, flights=list[FlightInfo])


@tool
async def update_reservation_passengers(
    reservation_id: str, passengers: list[dict[str, str]], ctx: ToolContext
) -> str:
    """Update the passenger information of a reservation.

    Args:
        reservation_id: The reservation ID, such as 'ZFA04Y'.
        passengers: An array of objects containing details about each passenger. For example:
            [{"first_name": "John", "last_name": "Doe", "dob": "1990-01-01"}].
    """
    people: list[Passenger] = passengers  # type: ignore[assignment]  # validated as models
    reservation = _reservation(_db(ctx), reservation_id)
    if len(people) != len(reservation["passengers"]):
        raise ToolError("Number of passengers does not match")
    reservation["passengers"] = [p.model_dump() for p in people]
    return dump(reservation)


object_parameters(update_reservation_passengers, passengers=list[Passenger])


@tool
async def get_flight_status(flight_number: str, date: str, ctx: ToolContext) -> str:
    """Get the status of a flight.

    Args:
        flight_number: The flight number.
        date: The date of the flight.
    """
    return str(_flight_date(_db(ctx), flight_number, date)["status"])


AIRLINE = DomainTools(
    DOMAIN,
    (
        book_reservation,
        calculate,
        cancel_reservation,
        get_flight_status,
        get_reservation_details,
        get_user_details,
        list_all_airports,
        search_direct_flight,
        search_onestop_flight,
        send_certificate,
        transfer_to_human_agents,
        update_reservation_baggages,
        update_reservation_flights,
        update_reservation_passengers,
    ),
    frozenset(
        {
            "book_reservation",
            "cancel_reservation",
            "send_certificate",
            "update_reservation_baggages",
            "update_reservation_flights",
            "update_reservation_passengers",
        }
    ),
)
