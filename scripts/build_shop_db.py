"""Build examples/shop.sqlite, the small shop database the tool_agent example's tool queries.

    python scripts/build_shop_db.py [--out examples/shop.sqlite]

Deterministic: the same rows every time, written in one transaction to a new file that then
replaces the old one. The shipped database is this script's output; a test rebuilds it and
compares every row.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import tempfile
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "examples" / "shop.sqlite"

SCHEMA = """
CREATE TABLE customers (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    city TEXT NOT NULL
);
CREATE TABLE orders (
    id TEXT PRIMARY KEY,            -- the order number customers quote, e.g. A-1001
    customer_id INTEGER NOT NULL REFERENCES customers(id),
    placed_on TEXT NOT NULL,        -- ISO date
    status TEXT NOT NULL CHECK (status IN ('processing', 'shipped', 'delivered', 'cancelled')),
    carrier TEXT,
    eta TEXT                        -- ISO date, for orders on their way
);
CREATE TABLE items (
    order_id TEXT NOT NULL REFERENCES orders(id),
    product TEXT NOT NULL,
    quantity INTEGER NOT NULL CHECK (quantity > 0),
    unit_price_cents INTEGER NOT NULL CHECK (unit_price_cents >= 0)
);
CREATE INDEX items_by_order ON items(order_id);
"""

CUSTOMERS = [
    (1, "Maria Lopez", "Madrid"),
    (2, "Jonas Berg", "Oslo"),
    (3, "Aiko Tanaka", "Osaka"),
    (4, "Samuel Okafor", "Lagos"),
    (5, "Chloe Martin", "Lyon"),
]

ORDERS = [
    ("A-1001", 1, "2026-11-02", "delivered", "DHL", None),
    ("A-1002", 2, "2026-11-10", "shipped", "PostNord", "2026-11-21"),
    ("A-1003", 3, "2026-11-12", "processing", None, None),
    ("A-1004", 4, "2026-11-14", "cancelled", None, None),
    ("A-1005", 5, "2026-11-15", "shipped", "Colissimo", "2026-11-19"),
    ("A-1006", 1, "2026-11-16", "processing", None, None),
    ("A-1007", 2, "2026-11-17", "delivered", "PostNord", None),
    ("A-1008", 3, "2026-11-18", "shipped", "Yamato", "2026-11-24"),
]

ITEMS = [
    ("A-1001", "desk lamp", 1, 3499),
    ("A-1001", "light bulb", 4, 299),
    ("A-1002", "office chair", 1, 18900),
    ("A-1003", "mechanical keyboard", 1, 12900),
    ("A-1003", "wrist rest", 1, 1900),
    ("A-1004", "monitor arm", 2, 7450),
    ("A-1005", "standing desk", 1, 45900),
    ("A-1006", "webcam", 1, 6900),
    ("A-1007", "headphones", 1, 15900),
    ("A-1008", "usb hub", 3, 2500),
]


def build(out: Path) -> Path:
    """Write the database to `out` (atomically: a finished file or the old one, never half)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=".shop-", suffix=".sqlite", dir=out.parent)
    os.close(handle)
    try:
        connection = sqlite3.connect(temporary)
        try:
            with connection:
                connection.executescript(SCHEMA)
                connection.executemany("INSERT INTO customers VALUES (?, ?, ?)", CUSTOMERS)
                connection.executemany("INSERT INTO orders VALUES (?, ?, ?, ?, ?, ?)", ORDERS)
                connection.executemany("INSERT INTO items VALUES (?, ?, ?, ?)", ITEMS)
            connection.execute("VACUUM")
        finally:
            connection.close()
        os.chmod(temporary, 0o644)  # a data file others read (mkstemp makes it 0600)
        os.replace(temporary, out)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"where to write it (default {DEFAULT_OUT})")
    print(build(parser.parse_args().out))


if __name__ == "__main__":
    main()
