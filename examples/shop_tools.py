"""The tools of the tool_agent example: read-only look-ups in examples/shop.sqlite.

Named in topologies/tool_agent.yaml as `shop_tools:lookup_order` and
`shop_tools:orders_of_customer`, so this directory must be importable
(`PYTHONPATH=examples`) and the run needs `--trust-code`. Each tool's type hints and
docstring are what the model is shown (rclc-graph derives the JSON schema from them).
The database is opened read-only for every call: a tool the model drives cannot change it.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

DATABASE = Path(__file__).resolve().with_name("shop.sqlite")


def _connect() -> sqlite3.Connection:
    if not DATABASE.is_file():
        raise FileNotFoundError(f"{DATABASE} is missing; build it with python scripts/build_shop_db.py")
    connection = sqlite3.connect(f"file:{DATABASE}?mode=ro", uri=True)
    connection.row_factory = sqlite3.Row
    return connection


def lookup_order(order_id: str) -> dict[str, Any]:
    """Look up one order of the shop: who placed it, its status, carrier, expected delivery, items and total.

    Args:
        order_id: The order number the customer quotes, for example A-1002.
    """
    number = order_id.strip().upper()
    with closing(_connect()) as connection:
        order = connection.execute(
            "SELECT orders.id, customers.name AS customer, placed_on, status, carrier, eta "
            "FROM orders JOIN customers ON customers.id = orders.customer_id WHERE orders.id = ?",
            (number,),
        ).fetchone()
        if order is None:
            raise LookupError(f"no order {number!r}; order numbers look like A-1001")
        items = connection.execute(
            "SELECT product, quantity, unit_price_cents FROM items WHERE order_id = ? ORDER BY rowid", (number,)
        ).fetchall()
    total = sum(item["quantity"] * item["unit_price_cents"] for item in items)
    result = {key: order[key] for key in ("id", "customer", "placed_on", "status") if order[key] is not None}
    if order["carrier"]:
        result["carrier"] = order["carrier"]
    if order["eta"]:
        result["expected_delivery"] = order["eta"]
    result["items"] = [f"{item['quantity']} x {item['product']}" for item in items]
    result["total"] = f"{total / 100:.2f} EUR"
    return result


MIN_NAME_CHARS = 3  # a shorter part of a name would match most customers


def _like_literal(text: str) -> str:
    """`text` as a LIKE pattern that matches exactly that text (ESCAPE '\\'): without this,
    '%' or '_' from the model matched every customer."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def orders_of_customer(name: str) -> list[dict[str, str]]:
    """List the orders of one customer of the shop, newest first, with each order's status.

    Args:
        name: The customer's name or part of it (at least 3 characters), for example Jonas.
    """
    part = name.strip()
    if len(part) < MIN_NAME_CHARS:
        raise LookupError(f"give at least {MIN_NAME_CHARS} characters of the customer's name, got {name!r}")
    with closing(_connect()) as connection:
        rows = connection.execute(
            "SELECT orders.id, placed_on, status FROM orders JOIN customers ON customers.id = orders.customer_id "
            "WHERE customers.name LIKE ? ESCAPE '\\' ORDER BY placed_on DESC",
            (f"%{_like_literal(part)}%",),
        ).fetchall()
    if not rows:
        raise LookupError(f"no customer matches {name!r}")
    return [{"id": row["id"], "placed_on": row["placed_on"], "status": row["status"]} for row in rows]
