"""/console in a real Chromium: the overview, a DGX-1's wiring, live allocations, what-if."""

from __future__ import annotations

import time
from typing import Any

import httpx
from selenium.webdriver.support.ui import Select

from placement.profiles import build_profile
from tests.service.console.browser.harness import Browser, Served, is_local

DGX1 = "v100-a"  # the demo fleet's DGX-1 (dgx1-v100)


def _picture(browser: Browser) -> list:  # type: ignore[type-arg]
    return browser.css(f'#node-picture svg[data-node="{DGX1}"]')


def test_the_overview_lists_the_nodes_by_design(browser: Browser, demo: Served) -> None:
    browser.open(f"{demo.url}/console")
    browser.wait(lambda: browser.css(f'#nodes tr[data-node="{DGX1}"]'), "the node table")
    designs = browser.texts("#nodes tr.design")
    assert any(d.startswith("8\u00d7 Tesla V100-SXM2-32GB · region default") for d in designs), (
        designs
    )
    cards = "#totals .card"
    totals = dict(zip(browser.attrs(cards, "data-total"), browser.texts(cards), strict=True))
    assert totals["nodes"].startswith("12"), totals
    assert "fragmentation" in totals

    demo.call("POST", "/v1/nodes/h100-b/cordon")
    try:
        state = '#nodes tr[data-node="h100-b"] td:nth-child(2)'
        browser.wait(lambda: browser.text(state) == "cordoned", "h100-b shown cordoned")
        browser.wait(
            lambda: browser.text('#totals [data-total="cordoned"]').startswith("1"),
            "the cordoned count",
        )
        browser.screenshot("console-overview")
    finally:
        demo.call("POST", "/v1/nodes/h100-b/uncordon")


def test_a_dgx1_is_drawn_and_an_allocation_shows_within_two_seconds(
    browser: Browser, demo: Served
) -> None:
    browser.open(f"{demo.url}/console#/nodes/{DGX1}")
    browser.wait(lambda: _picture(browser), "the DGX-1's picture")
    islands = browser.attrs("#node-picture [data-gpu]", "data-island")
    assert len(islands) == 8 and set(islands) == {"nvl0"}
    lanes = browser.attrs("#node-picture [data-nvlink]", "data-lanes")
    assert len(lanes) == 16 and set(lanes) == {"1", "2"}
    assert len(browser.attrs("#node-picture [data-nic]", "data-nic")) == 4

    placed = demo.call(
        "POST",
        "/v1/place",
        json={"gpus": 2, "nodes": [DGX1], "job_id": "seen-live", "owner": "ann"},
    )
    made = time.monotonic()
    held = set(placed["tasks"][0]["gpu_indices"])

    def shown() -> bool:
        rows = browser.attrs(f'#allocation-table tr[data-allocation="{placed["id"]}"]', "class")
        picture = f'#node-picture [data-allocation="{placed["id"]}"][data-gpu]'
        coloured = {int(str(g)) for g in browser.attrs(picture, "data-gpu")}
        return bool(rows) and coloured == held

    browser.wait(shown, "the new allocation in the table and the picture", timeout_s=10)
    took = time.monotonic() - made
    browser.screenshot("console-dgx1-allocation")
    # The console reads allocations every second: a second or two on a quiet machine, the
    # rest of the bound a slow machine's margin.
    assert took < 4.0, f"the allocation showed after {took:.2f}s"
    row = browser.text(f'#allocation-table tr[data-allocation="{placed["id"]}"]')
    assert "seen-live" in row and "ann" in row and "pending" in row
    decision = browser.text(f'#decision-list li[data-allocation="{placed["id"]}"]')
    assert placed["reason"] in decision
    demo.call("POST", f"/v1/allocations/{placed['id']}/release")


def test_the_what_if_form_highlights_the_gpus_a_node_would_give(
    browser: Browser, demo: Served
) -> None:
    browser.open(f"{demo.url}/console#/nodes/{DGX1}")
    browser.wait(lambda: _picture(browser), "the DGX-1's picture")
    form = browser.css("#whatif-form")[0]
    gpus = form.find_element("name", "gpus")
    gpus.clear()
    gpus.send_keys("4")
    form.find_element("name", "model").send_keys("V100")
    Select(form.find_element("name", "locality")).select_by_visible_text("nvlink")
    form.find_element("css selector", "button").click()
    row = browser.wait(
        lambda: browser.css(f'#whatif-results tr.fits[data-node="{DGX1}"]'), "the score rows"
    )[0]
    given = {int(c.get_attribute("data-gpu")) for c in row.find_elements("css selector", ".given")}
    assert len(given) == 4
    expected = demo.call(
        "POST", "/v1/score", json={"gpus": 4, "gpu_models": ["V100"], "locality": "nvlink"}
    )
    [answer] = [n for n in expected["nodes"] if n["node"] == DGX1]
    assert given == set(answer["task"]["gpu_indices"])
    highlighted = {
        int(str(g)) for g in browser.attrs("#node-picture .whatif[data-gpu]", "data-gpu")
    }
    assert highlighted == given
    browser.screenshot("console-what-if")


def test_an_unknown_node_is_a_clear_page(browser: Browser, demo: Served) -> None:
    browser.open(f"{demo.url}/console#/nodes/no-such-node")
    browser.wait(lambda: browser.css("#node-missing"), "the missing-node notice")
    assert 'There is no node named "no-such-node"' in browser.text("#node-missing")
    assert browser.text("#node-title") == "No such node"
    browser.screenshot("console-unknown-node")


def test_no_page_asks_for_anything_beyond_loopback(browser: Browser, demo: Served) -> None:
    for page in ("/console", f"/console#/nodes/{DGX1}", "/docs", "/redoc"):
        browser.open(demo.url + page)
        browser.wait(
            lambda: browser.driver.execute_script("return document.readyState") == "complete",
            f"{page} to load",
        )
    browser.wait(lambda: browser.css("svg, .swagger-ui, redoc, .api-content"), "a page body")
    urls = browser.requested()
    assert any(url.endswith("/assets/docs/redoc.standalone.js") for url in urls), urls
    outside = [url for url in urls if not is_local(url)]
    assert outside == []


def test_a_viewer_sees_the_cluster_and_is_told_it_may_not_score(
    browser: Browser, secured: Served
) -> None:
    browser.open(f"{secured.url}/console")
    browser.wait(lambda: browser.css("#banner:not([hidden])"), "the 401 banner")
    assert browser.text("#banner").startswith(
        "401 unauthorized: read the cluster needs an API token"
    )
    browser.screenshot("console-no-token")

    made = secured.call("POST", "/v1/tokens", json={"role": "viewer", "name": "wall screen"})
    browser.css("#token")[0].send_keys(made["token"])
    browser.css("#token-form button[type=submit]")[0].click()
    browser.wait(lambda: browser.css(f'#nodes tr[data-node="{DGX1}"]'), "the node table")
    assert browser.driver.execute_script("return sessionStorage.getItem('topoplace.token')")
    assert browser.css("#banner")[0].get_attribute("hidden") is not None

    browser.css("#whatif-form button")[0].click()
    browser.wait(lambda: browser.css("#whatif-error:not([hidden])"), "the 403 notice")
    error = browser.text("#whatif-error")
    assert error.startswith("403 forbidden: this token's role may not score"), error
    assert browser.css("#whatif-results tr") == []
    browser.screenshot("console-viewer-403")


def test_an_admin_sees_refused_decisions_with_their_reasons(browser: Browser, demo: Served) -> None:
    browser.open(f"{demo.url}/console")
    browser.wait(lambda: browser.css(f'#nodes tr[data-node="{DGX1}"]'), "the node table")
    refused = httpx.post(f"{demo.url}/v1/place", json={"gpus": 48, "job_id": "too-big"})
    assert refused.status_code == 422, refused.text
    reasons = refused.json()["error"]["detail"]["reasons"]
    item = '#decision-list li[data-decision="refused"]'
    browser.wait(lambda: "too-big" in " ".join(browser.texts(item)), "the refusal in the list")
    text = next(t for t in browser.texts(item) if "too-big" in t)
    assert "refused, unresolvable" in text and "via POST /v1/place" in text
    causes = browser.attrs(f"{item} li[data-cause]", "data-cause")
    assert {r["cause"] for r in reasons} <= set(causes)
    assert reasons[0]["message"] in text
    browser.screenshot("console-refused-decision")


def test_a_viewer_sees_decisions_from_the_allocations_instead(
    browser: Browser, secured: Served
) -> None:
    placed = secured.call("POST", "/v1/place", json={"gpus": 1, "job_id": "for-viewer"})
    made = secured.call("POST", "/v1/tokens", json={"role": "viewer", "name": "decisions"})
    browser.open(f"{secured.url}/console")
    browser.driver.execute_script(
        "sessionStorage.setItem('topoplace.token', arguments[0])", made["token"]
    )
    browser.open(f"{secured.url}/console")
    row = f'#decision-list li[data-allocation="{placed["id"]}"]'
    browser.wait(lambda: browser.css(row), "the allocation among the decisions")
    assert placed["reason"] in browser.text(row)
    assert browser.css('#decision-list li[data-decision="refused"]') == []
    assert browser.css("#banner")[0].get_attribute("hidden") is not None
    secured.call("POST", f"/v1/allocations/{placed['id']}/release")


def test_a_job_id_of_markup_and_non_characters_is_drawn_as_text(
    browser: Browser, demo: Served
) -> None:
    """Any caller who may place names its job id: markup in it stays text in the table and
    the picture, beside a U+FFFF (no XML character; Chromium's parser forgives it, a strict
    one does not: tests/service/console/test_topology_svg.py)."""
    job = "\uffff<img src=x onerror=window.pwned=1>"
    placed = demo.call("POST", "/v1/place", json={"gpus": 1, "nodes": [DGX1], "job_id": job})
    try:
        browser.open(f"{demo.url}/console#/nodes/{DGX1}")
        held = f'#node-picture [data-allocation="{placed["id"]}"][data-gpu]'
        browser.wait(lambda: browser.css(held), "the allocation in the node's picture")
        row = f'#allocation-table tr[data-allocation="{placed["id"]}"]'
        browser.wait(lambda: browser.css(row), "the allocation in the table")
        assert "<img src=x onerror=window.pwned=1>" in browser.text(row)
        assert browser.css("img") == []
        assert browser.driver.execute_script("return window.pwned === undefined") is True
    finally:
        demo.call("POST", f"/v1/allocations/{placed['id']}/release")


# Markup each party other than the operator may put in what the console shows: an agent
# (GPU model, NIC, region, fabric), a caller that places (job id, owner, a refused GPU
# model echoed in the refusal), an admin naming a token (the audit log's actor).
def _mark(n: int, tag: str = "img") -> str:
    if tag == "script":
        return f"<script>window.pwned={n}</script>"
    return f"<{tag} src=x onerror=window.pwned={n} onload=window.pwned={n}>"


XSS_NODE = "xss-node"


def _hostile_snapshot() -> dict[str, Any]:
    snap = build_profile("dgx1-v100", XSS_NODE).model_dump(mode="json")
    snap["region"] = _mark(1, "script")
    for gpu in snap["gpus"]:
        gpu["model"] = _mark(2)
    for k, nic in enumerate(snap["nics"]):
        nic["name"] = f"{_mark(3, 'svg')}{k}"
    snap["fabric"] = {"cluster_uuid": _mark(4)[:64], "clique_id": 1}
    return snap


def test_markup_from_agents_callers_and_token_names_is_shown_as_text(
    browser: Browser, demo: Served
) -> None:
    demo.call("PUT", f"/v1/nodes/{XSS_NODE}/snapshot", json={"snapshot": _hostile_snapshot()})
    token = demo.call("POST", "/v1/tokens", json={"role": "scheduler", "name": _mark(5)})
    placed = demo.call(
        "POST",
        "/v1/place",
        token=token["token"],
        json={"gpus": 2, "nodes": [XSS_NODE], "job_id": _mark(6), "owner": _mark(7, "script")},
    )
    refused = httpx.post(f"{demo.url}/v1/place", json={"gpus": 1, "gpu_models": [_mark(8)]})
    assert refused.status_code == 422, refused.text
    try:
        browser.open(f"{demo.url}/console#/nodes/{XSS_NODE}")
        row = f'#allocation-table tr[data-allocation="{placed["id"]}"]'
        browser.wait(lambda: browser.css(row), "the allocation in the table")
        held = f'#node-picture [data-allocation="{placed["id"]}"][data-gpu]'
        browser.wait(lambda: browser.css(held), "the allocation in the node's picture")
        refusal = '#decision-list li[data-decision="refused"]'
        browser.wait(lambda: _mark(8) in " ".join(browser.texts(refusal)), "the refusal")
        browser.wait(lambda: _mark(5) in " ".join(browser.texts("#decision-list")), "the actor")

        assert _mark(6) in browser.text(row) and _mark(7, "script") in browser.text(row)
        assert _mark(1, "script") in browser.text("#node-title")
        assert _mark(2) in browser.text("#node-title")
        assert _mark(4)[:64] in browser.text("#node-facts")
        # All of it, the GPUs' <title> too; the picture names a model by its first characters.
        picture = browser.driver.execute_script(
            "return document.querySelector('#node-picture').textContent"
        )
        assert _mark(2)[:15] + "\u2026" in picture and _mark(6) in picture
        assert f"{_mark(3, 'svg')}0" in browser.attrs("#node-picture [data-nic]", "data-nic")
        design = f"8\u00d7 {_mark(2)} · region {_mark(1, 'script')}"
        assert any(d.startswith(design) for d in browser.texts("#nodes tr.design"))
        # Nothing the text named became an element, and nothing ran.
        made = "img, iframe, #node-picture svg svg, script:not([src])"
        assert browser.css(made) == [], [e.get_attribute("outerHTML") for e in browser.css(made)]
        assert browser.driver.execute_script("return window.pwned === undefined") is True
        browser.screenshot("console-markup-as-text")

        # The picture opened on its own: the same text, and its policy lets nothing run.
        browser.open(f"{demo.url}/v1/nodes/{XSS_NODE}/topology.svg")
        browser.wait(lambda: browser.css("svg.tp-topology"), "the picture alone")
        assert browser.css("svg svg, script, img") == []
        assert browser.driver.execute_script("return window.pwned === undefined") is True
    finally:
        demo.call("POST", f"/v1/allocations/{placed['id']}/release")
        httpx.delete(f"{demo.url}/v1/nodes/{XSS_NODE}", timeout=10)
