"""/docs and /redoc in a real Chromium with no way out: they render, and Try it out works."""

from __future__ import annotations

from selenium.webdriver.common.keys import Keys

from tests.service.console.browser.conftest import ADMIN_TOKEN
from tests.service.console.browser.harness import Browser, Served, is_local

PLACE = "#operations-placement-place_v1_place_post"


def test_swagger_ui_try_it_out_places_with_the_token_from_authorize(
    browser: Browser, secured: Served
) -> None:
    browser.open(f"{secured.url}/docs")
    browser.wait(lambda: browser.css(PLACE), "Swagger UI to list POST /v1/place")
    browser.css(".auth-wrapper .authorize")[0].click()
    field = browser.wait(lambda: browser.css(".auth-container input"), "the Authorize dialog")[0]
    field.send_keys(ADMIN_TOKEN)
    browser.css(".auth-btn-wrapper .authorize")[0].click()
    browser.wait(
        lambda: browser.css('.auth-btn-wrapper [aria-label="Remove authorization"]'),
        "the token to be taken",
    )
    browser.css(".auth-btn-wrapper .btn-done")[0].click()

    browser.css(f"{PLACE} .opblock-summary")[0].click()
    browser.wait(lambda: browser.css(f"{PLACE} .try-out__btn"), "the Try it out button")[0].click()
    body = browser.wait(lambda: browser.css(f"{PLACE} textarea.body-param__text"), "the body")[0]
    body.send_keys(Keys.CONTROL, "a")
    body.send_keys(Keys.DELETE)
    body.send_keys('{"gpus": 2, "job_id": "from-swagger", "owner": "docs"}')
    browser.css(f"{PLACE} .execute")[0].click()
    status = browser.wait(
        lambda: browser.css(f"{PLACE} .live-responses-table tr.response .response-col_status"),
        "the response of Try it out",
    )[0]
    browser.wait(lambda: status.text.strip(), "a status code")
    browser.screenshot("docs-try-it-out")
    assert status.text.strip() == "201", status.text
    placed = secured.call("GET", "/v1/allocations?job_id=from-swagger")["allocations"]
    assert [a["owner"] for a in placed] == ["docs"]
    assert all(is_local(url) for url in browser.requested()), browser.requested()


def test_redoc_renders_the_reference(browser: Browser, demo: Served) -> None:
    browser.open(f"{demo.url}/redoc")
    browser.wait(
        lambda: any("/v1/place" in e.text for e in browser.css(".api-content")),
        "ReDoc to render the operations",
    )
    headings = [e.text for e in browser.css(".api-content h2")]
    assert any("Place" in h or "place" in h for h in headings), headings
    browser.screenshot("redoc")
    assert all(is_local(url) for url in browser.requested()), browser.requested()
