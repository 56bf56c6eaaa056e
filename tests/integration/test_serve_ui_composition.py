"""The live web UI with a subgraph (issue 27), in a real headless Chromium: start
topologies/incident_brief.yaml from the form; the subgraph's nodes get their own cards, each
saying which subgraph it belongs to; the drawing frames them; the node API serves them by
their path; nothing fails in the page. Needs chromium and chromium-driver (`make browser`)."""

from __future__ import annotations

import time

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as expect
from selenium.webdriver.support.ui import WebDriverWait

from tests.helpers import page_reads as page
from tests.helpers.serve_process import ServeProcess
from tests.integration.test_serve_ui_browser import artifacts, browser, start_from_form  # noqa: F401 - fixtures used by name

pytestmark = pytest.mark.integration


def test_a_subgraphs_nodes_show_in_the_live_view(tmp_path, browser, artifacts):  # noqa: F811 - the fixtures
    with ServeProcess(tmp_path / "runs") as server:
        browser.get(server.url + "/")
        wait = WebDriverWait(browser, 600)
        start_from_form(browser, wait, "incident_brief")
        wait.until(expect.text_to_be_present_in_element((By.ID, "run-status"), "finished"))
        run_id = page.text(browser, "#run-id")
        notes = '.card[data-node="evidence/notes"]'
        wait.until(expect.text_to_be_present_in_element((By.CSS_SELECTOR, f"{notes} .badge"), "finished"))
        assert page.text(browser, f"{notes} .scope") == "in subgraph evidence"
        assert not browser.find_elements(By.CSS_SELECTOR, '.card[data-node="brief"] .scope')
        states = page.settled(browser, page.graph_classes,
                              lambda nodes: nodes and all("finished" in state for state in nodes.values()))
        assert set(states) == {"framing", "evidence/reader[0]", "evidence/reader[1]", "evidence/reader[2]",
                               "evidence/notes", "brief"}, states
        frames = page.texts(browser, '#graph g.subgraph[data-scope="evidence"]')
        assert len(frames) == 1 and "evidence: subgraph evidence" in frames[0], frames
        hops = page.texts(browser, '.card[data-node="brief"] .hops li')
        assert len(hops) == 1 and "evidence/notes" in hops[0], hops
        node = httpx.get(f"{server.url}/runs/{run_id}/nodes/evidence/notes").json()
        assert node["node"] == "evidence/notes" and node["text"]
        time.sleep(0.5)
        browser.save_screenshot(str(artifacts / "7-subgraph.png"))
        errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
        assert errors == [], errors
    assert (artifacts / "7-subgraph.png").stat().st_size > 10_000
