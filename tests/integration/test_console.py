"""The web console in headless Chromium against a real riqr: two Ray nodes, the food-orders topology on
Spark, REST auth on. It loads without a token, says 401 until one is pasted, then lists the stores,
answers a query, pages with "next", and tells which partition, actor and node hold a key.

Chromium is Debian's (``/usr/bin/chromium``, installed by scripts/setup), driven by Playwright without any
browser download. With ``RIQR_CONSOLE_SCREENSHOT=path`` the test saves the screenshot docs/ shows.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime.auth import AuthConfig, generate_secret, mint_token
from runtime.config import RuntimeConfig
from tests.integration.conftest import SEED_CUSTOMERS, RayCluster, Runtime, produce, start_food_orders
from tests.integration.helpers import http_get, wait_for

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"
# Known to work in containers without a GPU, a sandbox or a network.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SECRET = generate_secret()


def _need(ok: bool, what: str) -> None:
    """Fail without a browser: a skip here read as a pass (the console untested, the suite green). Skipped
    only when asked for by name, ``RIQR_SKIP_BROWSER=1``, on a machine where chromium cannot be installed."""
    if not ok:
        message = f"{what}; run scripts/setup as root (it installs Debian's chromium)"
        if os.environ.get("RIQR_SKIP_BROWSER") == "1":
            pytest.skip(f"{message} (RIQR_SKIP_BROWSER=1)")
        pytest.fail(f"{message}, or set RIQR_SKIP_BROWSER=1 to skip the console's browser test knowingly")


@pytest.fixture(scope="module")
def secured_seed(ray_cluster: RayCluster, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runtime]:
    """The seed-000 stores, loaded by the real topology (stopped once loaded), served with auth on."""
    from verticles import deploy

    namespace = f"riqr-console-{uuid.uuid4().hex[:8]}"
    auth = AuthConfig(enabled=True, secret=SECRET)
    deployment = deploy.up(
        RuntimeConfig(namespace=namespace, http_host="127.0.0.1", http_port=0, advertise_host="127.0.0.1", auth=auth)
    )
    runtime = Runtime(namespace, {ep.node_id: ep.url for ep in deployment.endpoints})
    topology = start_food_orders(spark, runtime, tmp_path_factory.mktemp("console-home"))
    bearer = {"Authorization": "Bearer " + mint_token(SECRET)}
    try:
        from riqr.demo import SEED_CUSTOMERS as customers
        from riqr.demo import SEED_ORDERS as orders

        produce(topology.home, "customer", customers)
        produce(topology.home, "order", orders)
        wait_for(
            lambda: (
                http_get(f"{runtime.url}/stores/customer-v1-changelog/approximate-num-entries", bearer)[2]
                == {"result": 7}
                and http_get(f"{runtime.url}/stores/order-count/approximate-num-entries", bearer)[2] == {"result": 3}
            ),
            what="the seed data in both stores",
        )
        wait_for(  # the sink reports each batch to the registry just after delivering it
            lambda: all(s["ingest"] for s in http_get(f"{runtime.url}/stores", bearer)[2]["result"]),
            what="both sinks to report",
        )
        topology.stop()
        yield runtime
    finally:
        topology.stop()
        deploy.down(namespace)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    _need(Path(CHROMIUM).exists(), f"{CHROMIUM} is missing")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _need(False, "Playwright is not installed (pip install -e '.[test]')")
        raise
    profile = tempfile.mkdtemp(prefix="riqr-chromium-")
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            profile,
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1400, "height": 1000},
        )
        try:
            yield context
        finally:
            context.close()
            shutil.rmtree(profile, ignore_errors=True)


def _cells(page: Any, selector: str) -> list[list[str]]:
    rows: list[list[str]] = page.eval_on_selector_all(
        selector, "rows => rows.map(r => Array.from(r.cells, c => c.textContent))"
    )
    return rows


def test_the_console_shows_stores_answers_queries_pages_and_locates_keys(secured_seed: Runtime, browser: Any) -> None:
    from playwright.sync_api import expect

    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    # Chromium logs every 4xx answer as "Failed to load resource"; those are expected here.
    page.on(
        "console", lambda m: errors.append(m.text) if m.type == "error" and "Failed to load" not in m.text else None
    )
    page.goto(secured_seed.url + "/")

    # No token yet: the page loads, and says why it shows nothing.
    expect(page.locator("#status")).to_contain_text("401 Unauthorized")
    expect(page.locator("#status")).to_contain_text("paste a valid bearer token")

    page.fill("#token", mint_token(SECRET))
    page.click("#save-token")
    expect(page.locator("#stores tbody tr[data-store]")).to_have_count(2)
    expect(page.locator("#status")).to_be_empty()
    stores = {row[0]: row for row in _cells(page, "#stores tbody tr[data-store]")}
    assert set(stores) == {"customer-v1-changelog", "order-count"}
    customers = stores["customer-v1-changelog"]
    assert customers[1] == "kv" and customers[2] == "key string" and customers[4] == "4 (+1 standby)"  # two nodes
    nodes = {n[:12] for n in secured_seed.endpoints}
    assert customers[5].count("active") == 2 and all(n in customers[5] for n in nodes)  # one actor per node
    assert "4 serving" in customers[6] and customers[7] == "max 0 batches"
    assert customers[8].startswith(("running, batch ", "stopped, batch "))  # the seeding topology has stopped
    # Its dead-letter query set none aside ("customer: 0"), or stopped with the seeding topology before it
    # reported ("-": none reported, which "0" made look like a count).
    assert customers[9] in ("-", "customer: 0")

    # A store's partitions: where each one is, and what it reflects.
    page.click("button[data-store='order-count']")
    expect(page.locator("#partitions tbody tr[data-partition]")).to_have_count(4)
    actives = {}
    for partition in _cells(page, "#partitions tbody tr[data-partition]"):
        assert partition[1] == "serving" and partition[3] == "0"
        assert partition[6] in nodes and partition[7] in secured_seed.endpoints.values()
        actives[partition[0]] = partition[6]
    # Each partition's standby copy has a row of its own: in sync, no lag, on the other node.
    expect(page.locator("#partitions tbody tr[data-standby-of]")).to_have_count(4)
    for copy in _cells(page, "#partitions tbody tr[data-standby-of]"):
        number = copy[0].removesuffix(" standby")
        assert copy[1] == "serving, in-sync" and copy[3] == "0"
        assert copy[6] in nodes and copy[6] != actives[number]

    # A key query, answered with the right value.
    page.select_option("#q-store", "customer-v1-changelog")
    page.select_option("#q-op", "get")
    page.fill("#q-key", "2")
    page.click("#q-run")
    expect(page.locator("#q-status")).to_have_text("found")
    assert _cells(page, "#q-results tbody tr") == [['"2"', "", '"adam"']]
    page.fill("#q-key", "99")
    page.click("#q-run")
    expect(page.locator("#q-status")).to_contain_text("404 key-not-found")

    # Every customer, three at a time, following "next".
    page.select_option("#q-op", "all")
    page.fill("#q-limit", "3")
    page.click("#q-run")
    seen: list[list[str]] = []
    for number, size in enumerate([3, 3, 1], start=1):
        expect(page.locator("#q-status")).to_contain_text(f"page {number}: {size} entries")
        seen += _cells(page, "#q-results tbody tr")
        if number < 3:
            page.click("#q-next")
    expect(page.locator("#q-next")).to_be_disabled()
    assert seen == [[f'"{k}"', "", f'"{v}"'] for k, v in sorted(SEED_CUSTOMERS.items())]

    # A range, in reverse.
    page.select_option("#q-op", "range")
    page.fill("#q-from", "2")
    page.fill("#q-to", "4")
    page.check("#q-reverse")
    page.fill("#q-limit", "10")
    page.click("#q-run")
    expect(page.locator("#q-status")).to_contain_text("page 1: 3 entries; end of the scan")
    assert [r[0] for r in _cells(page, "#q-results tbody tr")] == ['"4"', '"3"', '"2"']
    # Paged: the next page repeats the scan's bounds and direction with its cursor (a prefix or key in the
    # path is one of them, so the console once sent a cursor the server refuses for those scans).
    page.fill("#q-limit", "2")
    page.click("#q-run")
    expect(page.locator("#q-status")).to_contain_text("page 1: 2 entries; more")
    page.click("#q-next")
    expect(page.locator("#q-status")).to_contain_text("page 2: 1 entries; end of the scan")
    assert [r[0] for r in _cells(page, "#q-results tbody tr")] == ['"2"']
    asked = page.locator("#q-url").text_content() or ""
    assert "range?from=2&to=4&limit=2&reverse=true&cursor=" in asked, asked

    # A session query's two times are findSessions' bounds, labelled as such (they read "time from/to",
    # taken for a range of starts); a window query's bound the window's start.
    page.select_option("#q-op", "sessions")
    expect(page.locator("#q-tfrom-label")).to_have_text("ends at or after")
    expect(page.locator("#q-tto-label")).to_have_text("starts at or before")
    page.select_option("#q-op", "windows")
    expect(page.locator("#q-tfrom-label")).to_have_text("starts from")
    expect(page.locator("#q-tto-label")).to_have_text("starts until")

    # Where a key lives (present or not): its partition, actor and node.
    page.select_option("#q-store", "order-count")
    page.fill("#m-key", "1")
    page.click("#m-run")
    expect(page.locator("#m-result dd[data-fact='partition']")).to_have_text(str(zlib.crc32(b"1") % 4))
    bearer = {"Authorization": "Bearer " + mint_token(SECRET)}
    owner = http_get(f"{secured_seed.url}/metadata/stores/order-count/key/1", bearer)[2]
    assert page.text_content("#m-result dd[data-fact='actor']") == owner["result"]["actor"]
    assert page.text_content("#m-result dd[data-fact='node']") == owner["result"]["node"]

    shot = os.environ.get("RIQR_CONSOLE_SCREENSHOT")
    if shot:
        page.select_option("#q-store", "customer-v1-changelog")
        page.click("button[data-store='customer-v1-changelog']")
        page.select_option("#q-op", "all")
        page.uncheck("#q-reverse")
        page.fill("#q-limit", "4")
        page.click("#q-run")
        expect(page.locator("#q-status")).to_contain_text("page 1: 4 entries")
        page.fill("#m-key", "2")
        page.click("#m-run")
        expect(page.locator("#m-result dd[data-fact='store']")).to_have_text("customer-v1-changelog")
        page.screenshot(path=shot, full_page=True)

    # A token for one store only: the other disappears, and asking for it anyway is a clear 403.
    page.fill("#token", mint_token(SECRET, stores=["order-count"]))
    page.click("#save-token")
    expect(page.locator("#stores tbody tr[data-store]")).to_have_count(1)
    said = page.evaluate("api('stores/customer-v1-changelog/all').then(() => 'answered', explain)")
    assert said.startswith("403 Forbidden") and "may not read this store" in said
    # A windowed store's ingest says how many late rows its query dropped, as `riqr status` does; the seed
    # stores have none, so the shipped script is asked with an ingest record that has some.
    late = page.evaluate("describeIngest({state: 'running', batch_id: 4, late_rows: 3})")
    assert late.startswith("running, batch 4") and late.endswith(", 3 late rows dropped")
    assert "late" not in page.evaluate("describeIngest({state: 'running', batch_id: 4, late_rows: 0})")
    assert errors == []
    page.close()


def test_the_api_docs_page_renders_its_routes_under_a_csp_without_unsafe_inline(
    secured_seed: Runtime, browser: Any
) -> None:
    from playwright.sync_api import expect

    from runtime.rest.routes import ROUTES

    page = browser.new_page()
    errors: list[str] = []  # a script or style the CSP refuses is a console error
    page.on("pageerror", lambda err: errors.append(str(err)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    answer = page.goto(secured_seed.url + "/docs")
    assert answer is not None and answer.status == 200
    csp = answer.headers["content-security-policy"]
    assert "unsafe-inline" not in csp and "script-src 'sha256-" in csp and "style-src 'sha256-" in csp
    expect(page.locator("#paths section")).to_have_count(len(ROUTES))  # the inline script ran
    expect(page.locator("#paths")).to_contain_text("GET /stores/{store}/get/{key}")
    assert page.eval_on_selector("body", "b => getComputedStyle(b).maxWidth") != "none"  # the inline style too
    assert errors == []
    page.close()
