"""The retail domain's tools, ported from tau2-bench (as inspect-evals 0.26.0 ships them) to
`@tool` functions over the rollout's own database.

The rules are the original's, quirks included, so that a task's reference actions leave the same
database (the parity test checks every task against the original tools' result): an order whose
status merely contains "pending" may change its address or payment, and a pending order whose
items are modified gives every modified item the price and options of the last new item.
"""

from __future__ import annotations

from typing import Any

from conveyor.agent.tools import ToolContext, tool
from conveyor.tasks.tau2.common import (
    DomainTools,
    ToolError,
    calculate,
    dump,
    lookup,
    transfer_to_human_agents,
)

DOMAIN = "retail"
CANCEL_REASONS = ("no longer needed", "ordered by mistake")


def _db(ctx: ToolContext) -> dict[str, Any]:
    return RETAIL.db(ctx)


def _order(db: dict[str, Any], order_id: str) -> dict[str, Any]:
    return lookup(db["orders"], order_id, "Order not found")


def _user(db: dict[str, Any], user_id: str) -> dict[str, Any]:
    return lookup(db["users"], user_id, "User not found")


def _product(db: dict[str, Any], product_id: str) -> dict[str, Any]:
    return lookup(db["products"], product_id, "Product not found")


def _variant(db: dict[str, Any], product_id: str, item_id: str) -> dict[str, Any]:
    return lookup(_product(db, product_id)["variants"], item_id, "Variant not found")


def _payment_method(db: dict[str, Any], user_id: str, payment_method_id: str) -> dict[str, Any]:
    methods = _user(db, user_id)["payment_methods"]
    return lookup(methods, payment_method_id, "Payment method not found")


def _is_gift_card(method: dict[str, Any]) -> bool:
    return bool(method["source"] == "gift_card")


def _first_item(order: dict[str, Any], item_id: str) -> dict[str, Any]:
    for item in order["items"]:
        if item["item_id"] == item_id:
            return item
    raise ToolError(f"Item {item_id} not found")


def _check_counts(order: dict[str, Any], item_ids: list[str], message: str) -> None:
    """Every id of `item_ids` (duplicates allowed) is in the order at least as often."""
    held = [item["item_id"] for item in order["items"]]
    for item_id in item_ids:
        if item_ids.count(item_id) > held.count(item_id):
            raise ToolError(message.format(item_id=item_id))


def _address(
    address1: str, address2: str, city: str, state: str, country: str, zip_code: str
) -> dict[str, str]:
    return {
        "address1": address1,
        "address2": address2,
        "city": city,
        "country": country,
        "state": state,
        "zip": zip_code,
    }


@tool
async def cancel_pending_order(order_id: str, reason: str, ctx: ToolContext) -> str:
    """Cancel a pending order. If the order is already processed or delivered, it cannot be
    cancelled. The agent needs to explain the cancellation detail and ask for explicit user
    confirmation (yes/no) to proceed. If the user confirms, the order status will be changed to
    'cancelled' and the payment will be refunded. The refund will be added to the user's gift card
    balance immediately if the payment was made using a gift card, otherwise the refund would take
    5-7 business days to process. The function returns the order details after the cancellation.

    Args:
        order_id: The order id, such as '#W0000000'. Be careful there is a '#' symbol at the
            beginning of the order id.
        reason: The reason for cancellation, which should be either 'no longer needed' or
            'ordered by mistake'.
    """
    db = _db(ctx)
    order = _order(db, order_id)
    if order["status"] != "pending":
        raise ToolError("Non-pending order cannot be cancelled")
    if reason not in CANCEL_REASONS:
        raise ToolError("Invalid reason")
    refunds = []
    for payment in order["payment_history"]:
        method_id = payment["payment_method_id"]
        refunds.append(
            {
                "transaction_type": "refund",
                "amount": payment["amount"],
                "payment_method_id": method_id,
            }
        )
        user = _user(db, order["user_id"])
        method = _payment_method(db, user["user_id"], method_id)
        if _is_gift_card(method):
            method["balance"] = round(method["balance"] + payment["amount"], 2)
    order["status"] = "cancelled"
    order["cancel_reason"] = reason
    order["payment_history"].extend(refunds)
    return dump(order)


@tool
async def exchange_delivered_order_items(
    order_id: str,
    item_ids: list[str],
    new_item_ids: list[str],
    payment_method_id: str,
    ctx: ToolContext,
) -> str:
    """Exchange items in a delivered order to new items of the same product type. For a delivered
    order, return or exchange can be only done once by the agent. The agent needs to explain the
    exchange detail and ask for explicit user confirmation (yes/no) to proceed.

    Args:
        order_id: The order id, such as '#W0000000'. Be careful there is a '#' symbol at the
            beginning of the order id.
        item_ids: The item ids to be exchanged, each such as '1008292230'. There could be
            duplicate items in the list.
        new_item_ids: The item ids to be exchanged for, each such as '1008292230'. There could
            be duplicate items in the list. Each new item id should match the item id in the same
            position and be of the same product.
        payment_method_id: The payment method id to pay or receive refund for the item price
            difference, such as 'gift_card_0000000' or 'credit_card_0000000'. These can be looked up
            from the user or order details.
    """
    db = _db(ctx)
    order = _order(db, order_id)
    if order["status"] != "delivered":
        raise ToolError("Non-delivered order cannot be exchanged")
    _check_counts(order, item_ids, "Number of {item_id} not found.")
    if len(item_ids) != len(new_item_ids):
        raise ToolError("The number of items to be exchanged should match.")
    difference = 0.0
    for item_id, new_item_id in zip(item_ids, new_item_ids, strict=True):
        item = _first_item(order, item_id)
        variant = _variant(db, item["product_id"], new_item_id)
        if not variant["available"]:
            raise ToolError(f"New item {new_item_id} not found or available")
        difference += variant["price"] - item["price"]
    difference = round(difference, 2)
    method = _payment_method(db, order["user_id"], payment_method_id)
    if _is_gift_card(method) and method["balance"] < difference:
        raise ToolError("Insufficient gift card balance to pay for the price difference")
    order["status"] = "exchange requested"
    order["exchange_items"] = sorted(item_ids)
    order["exchange_new_items"] = sorted(new_item_ids)
    order["exchange_payment_method_id"] = payment_method_id
    order["exchange_price_difference"] = difference
    return dump(order)


@tool
async def find_user_id_by_name_zip(
    first_name: str, last_name: str, zip: str, ctx: ToolContext
) -> str:
    """Find user id by first name, last name, and zip code. If the user is not found, the function
    will return an error message. By default, find user id by email, and only call this function if
    the user is not found by email or cannot remember email.

    Args:
        first_name: The first name of the customer, such as 'John'.
        last_name: The last name of the customer, such as 'Doe'.
        zip: The zip code of the customer, such as '12345'.
    """
    for user_id, user in _db(ctx)["users"].items():
        name = user["name"]
        if (
            name["first_name"].lower() == first_name.lower()
            and name["last_name"].lower() == last_name.lower()
            and user["address"]["zip"] == zip
        ):
            return str(user_id)
    raise ToolError("User not found")


@tool
async def find_user_id_by_email(email: str, ctx: ToolContext) -> str:
    """Find user id by email. If the user is not found, the function will return an error message.

    Args:
        email: The email of the user, such as 'something@example.com'.
    """
    for user_id, user in _db(ctx)["users"].items():
        if user["email"].lower() == email.lower():
            return str(user_id)
    raise ToolError("User not found")


@tool
async def get_order_details(order_id: str, ctx: ToolContext) -> str:
    """Get the status and details of an order.

    Args:
        order_id: The order id, such as '#W0000000'. Be careful there is a '#' symbol at the
            beginning of the order id.
    """
    return dump(_order(_db(ctx), order_id))


@tool
async def get_product_details(product_id: str, ctx: ToolContext) -> str:
    """Get the inventory details of a product.

    Args:
        product_id: The product id, such as '6086499569'. Be careful the product id is different
            from the item id.
    """
    return dump(_product(_db(ctx), product_id))


@tool
async def get_user_details(user_id: str, ctx: ToolContext) -> str:
    """Get the details of a user, including their orders.

    Args:
        user_id: The user id, such as 'sara_doe_496'.
    """
    return dump(_user(_db(ctx), user_id))


@tool
async def list_all_product_types(ctx: ToolContext) -> str:
    """List the name and product id of all product types. Each product type has a variety of
    different items with unique item ids and options. There are only 50 product types in the
    store."""
    products = _db(ctx)["products"].values()
    return dump(dict(sorted((p["name"], p["product_id"]) for p in products)))


@tool
async def modify_pending_order_address(
    order_id: str,
    address1: str,
    address2: str,
    city: str,
    state: str,
    country: str,
    zip: str,
    ctx: ToolContext,
) -> str:
    """Modify the shipping address of a pending order. The agent needs to explain the modification
    detail and ask for explicit user confirmation (yes/no) to proceed.

    Args:
        order_id: The order id, such as '#W0000000'. Be careful there is a '#' symbol at the
            beginning of the order id.
        address1: The first line of the address, such as '123 Main St'.
        address2: The second line of the address, such as 'Apt 1' or ''.
        city: The city, such as 'San Francisco'.
        state: The state, such as 'CA'.
        country: The country, such as 'USA'.
        zip: The zip code, such as '12345'.
    """
    order = _order(_db(ctx), order_id)
    if "pending" not in order["status"]:
        raise ToolError("Non-pending order cannot be modified")
    order["address"] = _address(address1, address2, city, state, country, zip)
    return dump(order)


@tool
async def modify_pending_order_items(
    order_id: str,
    item_ids: list[str],
    new_item_ids: list[str],
    payment_method_id: str,
    ctx: ToolContext,
) -> str:
    """Modify items in a pending order to new items of the same product type. For a pending order,
    this function can only be called once. The agent needs to explain the exchange detail and ask
    for explicit user confirmation (yes/no) to proceed.

    Args:
        order_id: The order id, such as '#W0000000'. Be careful there is a '#' symbol at the
            beginning of the order id.
        item_ids: The item ids to be modified, each such as '1008292230'. There could be
            duplicate items in the list.
        new_item_ids: The item ids to be modified for, each such as '1008292230'. There could be
            duplicate items in the list. Each new item id should match the item id in the same
            position and be of the same product.
        payment_method_id: The payment method id to pay or receive refund for the item price
            difference, such as 'gift_card_0000000' or 'credit_card_0000000'. These can be looked up
            from the user or order details.
    """
    db = _db(ctx)
    order = _order(db, order_id)
    if order["status"] != "pending":
        raise ToolError("Non-pending order cannot be modified")
    _check_counts(order, item_ids, "{item_id} not found")
    if len(item_ids) != len(new_item_ids):
        raise ToolError("The number of items to be exchanged should match")
    difference = 0.0
    variant: dict[str, Any] | None = None
    for item_id, new_item_id in zip(item_ids, new_item_ids, strict=True):
        if item_id == new_item_id:
            raise ToolError("The new item id should be different from the old item id")
        item = _first_item(order, item_id)
        variant = _variant(db, item["product_id"], new_item_id)
        if not variant["available"]:
            raise ToolError(f"New item {new_item_id} not found or available")
        difference += variant["price"] - item["price"]
    method = _payment_method(db, order["user_id"], payment_method_id)
    if _is_gift_card(method) and method["balance"] < difference:
        raise ToolError("Insufficient gift card balance to pay for the new item")
    order["payment_history"].append(
        {
            "transaction_type": "payment" if difference > 0 else "refund",
            "amount": abs(difference),
            "payment_method_id": payment_method_id,
        }
    )
    if _is_gift_card(method):
        method["balance"] = round(method["balance"] - difference, 2)
    for item_id, new_item_id in zip(item_ids, new_item_ids, strict=True):
        item = _first_item(order, item_id)
        if variant is None:
            raise ToolError("Variant not found")
        # The original prices every modified item as the last new item (its quirk, kept).
        item["item_id"] = new_item_id
        item["price"] = variant["price"]
        item["options"] = dict(variant["options"])
    order["status"] = "pending (item modified)"
    return dump(order)


@tool
async def modify_pending_order_payment(
    order_id: str, payment_method_id: str, ctx: ToolContext
) -> str:
    """Modify the payment method of a pending order. The agent needs to explain the modification
    detail and ask for explicit user confirmation (yes/no) to proceed.

    Args:
        order_id: The order id, such as '#W0000000'. Be careful there is a '#' symbol at the
            beginning of the order id.
        payment_method_id: The payment method id to pay or receive refund for the item price
            difference, such as 'gift_card_0000000' or 'credit_card_0000000'. These can be looked up
            from the user or order details.
    """
    db = _db(ctx)
    order = _order(db, order_id)
    if "pending" not in order["status"]:
        raise ToolError("Non-pending order cannot be modified")
    method = _payment_method(db, order["user_id"], payment_method_id)
    history = order["payment_history"]
    if len(history) != 1 or history[0]["transaction_type"] != "payment":
        raise ToolError("There should be exactly one payment for a pending order")
    old_id = history[0]["payment_method_id"]
    if old_id == payment_method_id:
        raise ToolError("The new payment method should be different from the current one")
    amount = history[0]["amount"]
    if _is_gift_card(method) and method["balance"] < amount:
        raise ToolError("Insufficient gift card balance to pay for the order")
    history.extend(
        [
            {
                "transaction_type": "payment",
                "amount": amount,
                "payment_method_id": payment_method_id,
            },
            {"transaction_type": "refund", "amount": amount, "payment_method_id": old_id},
        ]
    )
    if _is_gift_card(method):
        method["balance"] = round(method["balance"] - amount, 2)
    old_method = _payment_method(db, order["user_id"], old_id)
    if _is_gift_card(old_method):
        old_method["balance"] = round(old_method["balance"] + amount, 2)
    return dump(order)


@tool
async def modify_user_address(
    user_id: str,
    address1: str,
    address2: str,
    city: str,
    state: str,
    country: str,
    zip: str,
    ctx: ToolContext,
) -> str:
    """Modify the default address of a user. The agent needs to explain the modification detail and
    ask for explicit user confirmation (yes/no) to proceed.

    Args:
        user_id: The user id, such as 'sara_doe_496'.
        address1: The first line of the address, such as '123 Main St'.
        address2: The second line of the address, such as 'Apt 1' or ''.
        city: The city, such as 'San Francisco'.
        state: The state, such as 'CA'.
        country: The country, such as 'USA'.
        zip: The zip code, such as '12345'.
    """
    user = _user(_db(ctx), user_id)
    user["address"] = _address(address1, address2, city, state, country, zip)
    return dump(user)


@tool
async def return_delivered_order_items(
    order_id: str, item_ids: list[str], payment_method_id: str, ctx: ToolContext
) -> str:
    """Return some items of a delivered order. The order status will be changed to 'return
    requested'. The agent needs to explain the return detail and ask for explicit user confirmation
    (yes/no) to proceed. The user will receive follow-up email for how and where to return the item.

    Args:
        order_id: The order id, such as '#W0000000'. Be careful there is a '#' symbol at the
            beginning of the order id.
        item_ids: The item ids to be returned, each such as '1008292230'. There could be
            duplicate items in the list.
        payment_method_id: The payment method id to pay or receive refund for the item price
            difference, such as 'gift_card_0000000' or 'credit_card_0000000'. These can be looked up
            from the user or order details.
    """
    db = _db(ctx)
    order = _order(db, order_id)
    if order["status"] != "delivered":
        raise ToolError("Non-delivered order cannot be returned")
    user = _user(db, order["user_id"])
    method = _payment_method(db, user["user_id"], payment_method_id)
    original = order["payment_history"][0]["payment_method_id"]
    if not _is_gift_card(method) and payment_method_id != original:
        raise ToolError("Payment method should be the original payment method")
    _check_counts(order, item_ids, "Some item not found")
    order["status"] = "return requested"
    order["return_items"] = sorted(item_ids)
    order["return_payment_method_id"] = payment_method_id
    return dump(order)


RETAIL = DomainTools(
    DOMAIN,
    (
        calculate,
        cancel_pending_order,
        exchange_delivered_order_items,
        find_user_id_by_email,
        find_user_id_by_name_zip,
        get_order_details,
        get_product_details,
        get_user_details,
        list_all_product_types,
        modify_pending_order_address,
        modify_pending_order_items,
        modify_pending_order_payment,
        modify_user_address,
        return_delivered_order_items,
        transfer_to_human_agents,
    ),
    frozenset(
        {
            "cancel_pending_order",
            "exchange_delivered_order_items",
            "modify_pending_order_address",
            "modify_pending_order_items",
            "modify_pending_order_payment",
            "modify_user_address",
            "return_delivered_order_items",
        }
    ),
)
