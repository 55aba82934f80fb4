"""The pages behind a proxy that serves the service under /topoplace and strips it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from selenium.webdriver.common.keys import Keys

from tests.service.console.browser.harness import Browser, PrefixProxy, Served, is_local

PLACE = "#operations-placement-place_v1_place_post"


@pytest.fixture
def proxy(demo: Served) -> Iterator[PrefixProxy]:
    served = PrefixProxy(demo.url, "/topoplace")
    try:
        yield served
    finally:
        served.stop()


def test_try_it_out_calls_the_service_through_the_prefix(
    browser: Browser, proxy: PrefixProxy, demo: Served
) -> None:
    browser.open(f"{proxy.url}/docs")
    browser.wait(lambda: browser.css(f"{PLACE} .opblock-summary"), "Swagger UI")[0].click()
    browser.wait(lambda: browser.css(f"{PLACE} .try-out__btn"), "Try it out")[0].click()
    body = browser.wait(lambda: browser.css(f"{PLACE} textarea.body-param__text"), "the body")[0]
    body.send_keys(Keys.CONTROL, "a")
    body.send_keys(Keys.DELETE)
    body.send_keys('{"gpus": 1, "job_id": "through-the-prefix"}')
    browser.css(f"{PLACE} .execute")[0].click()
    cell = f"{PLACE} .live-responses-table tr.response .response-col_status"
    browser.wait(lambda: browser.css(cell) and browser.text(cell).strip(), "the response")
    assert browser.text(cell).strip() == "201"
    curl = browser.text(f"{PLACE} .curl-command")
    assert f"{proxy.url}/v1/place" in curl, curl
    assert demo.call("GET", "/v1/allocations?job_id=through-the-prefix")["allocations"]
    urls = browser.requested()
    assert all(is_local(u) and "/topoplace/" in u for u in urls if u.startswith("http")), urls


def test_the_console_reads_the_api_through_the_prefix(browser: Browser, proxy: PrefixProxy) -> None:
    browser.open(f"{proxy.url}/console#/nodes/v100-a")
    browser.wait(lambda: browser.css('#node-picture svg[data-node="v100-a"]'), "the picture")
    browser.screenshot("console-under-a-prefix")
    urls = [u for u in browser.requested() if u.startswith("http")]
    assert any(u.endswith("/topoplace/v1/nodes/v100-a/topology.svg") for u in urls), urls
    assert all("/topoplace/" in u for u in urls), urls
