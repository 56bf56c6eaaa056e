"""Reads of the live UI's page for the browser tests, each done in one script.

Why one script: the page replaces parts of itself while a run goes on and shortly after it
ends. The graph drawing is fetched again from the server whenever a node ends (the fetch
can land after the run's own "finished"); the run list is redrawn every 3 s. An element
found first and read afterwards, one call per element, goes stale when a redraw lands in
between. One script runs inside the page's event loop, so no redraw can land while it
reads. `settled` then waits for the read to show the expected state, because a redraw that
is still in flight may show the state from a moment before."""

from __future__ import annotations

from typing import Callable, TypeVar

from selenium.common.exceptions import TimeoutException
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

Read = TypeVar("Read")

SETTLE_SECONDS = 120  # a redraw lands within one server round trip; this bound only stops a wrong page


def texts(driver: WebDriver, css: str) -> list[str]:
    """The rendered text of every element `css` matches, in page order."""
    return driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map((item) => item.innerText ?? item.textContent)", css)


def text(driver: WebDriver, css: str) -> str | None:
    """The rendered text of the first element `css` matches; None when none does."""
    found = texts(driver, css)
    return found[0] if found else None


def attribute(driver: WebDriver, css: str, name: str) -> str | None:
    """An attribute of the first element `css` matches; None when none does or it lacks one."""
    return driver.execute_script(
        "const item = document.querySelector(arguments[0]); return item ? item.getAttribute(arguments[1]) : null",
        css, name)


def graph_classes(driver: WebDriver, kind: str = "node") -> dict[str, str]:
    """{node name: class} for the run's drawing (kind "node"), or {target node: class} for
    its edges (kind "edge")."""
    key = "node" if kind == "node" else "target"
    return driver.execute_script(
        "return Object.fromEntries([...document.querySelectorAll('#graph g.' + arguments[0])]"
        ".map((group) => [group.dataset[arguments[1]], group.getAttribute('class')]))", kind, key)


def settled(driver: WebDriver, read: Callable[[WebDriver], Read], ok: Callable[[Read], bool],
            seconds: float = SETTLE_SECONDS) -> Read:
    """Read until `ok` holds and return that read; fail with the last read when it never does."""
    last: list[Read] = []

    def check(current: WebDriver) -> bool:
        last[:] = [read(current)]
        return bool(ok(last[0]))

    try:
        WebDriverWait(driver, seconds, poll_frequency=0.2).until(check)
    except TimeoutException:
        raise AssertionError(f"the page never showed the expected state; last read: {last[0] if last else None!r}")
    return last[0]


def options(driver: WebDriver, css: str) -> list[str]:
    """The values of a select's options (the list is replaced when the topologies load)."""
    return driver.execute_script(
        "const select = document.querySelector(arguments[0]); return select ? [...select.options].map((o) => o.value) : []",
        css)
