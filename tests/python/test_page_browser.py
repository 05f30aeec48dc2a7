"""The page in a real browser: Debian's Chromium driven by Playwright (its PyPI wheel,
pointed at the system browser: no browser download), against the real `dataref serve
--http` on loopback with the built-in sample of 1M rows and its agent's model at the
scripted OpenAI-compatible server.

- a chat turn that fetches, charts and answers: the steps, the interactive chart, the
  answer, and model text holding `<script>` shown as text;
- the grid on the 1M-row table: pages, sorts and filters while the browser never receives
  more than a page of rows (the bytes of every answer counted on the wire);
- a download through a signed link;
- a second principal sees none of the first's sessions or tables, and its calls on the
  first's table get the answer an unknown table gets;
- a cell holding `<script>` stays text.

Screenshots go to `target/browser-screenshots/` (kept as test artifacts).
Run by `scripts/test`, which installs Chromium, builds the binary and sets DATAREF_BIN.
"""

import json
import os
import re
import subprocess
import threading
import urllib.request
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

from scripted_model import ScriptedModel

BIN = os.environ.get("DATAREF_BIN")
CHROMIUM = os.environ.get("DATAREF_CHROMIUM", "/usr/bin/chromium")
ROWS = 1_000_000
SHOTS = Path(__file__).resolve().parents[2] / "target" / "browser-screenshots"
XSS = "<script>window.pwned = 1</script><img src=x onerror=\"window.pwned = 2\">"

pytestmark = pytest.mark.timeout(600)


def new_token(name):
    out = subprocess.run([BIN, "token", "new", name], capture_output=True, text=True, check=True)
    token = re.search(r"^token: (\S+)$", out.stdout, re.M).group(1)
    digest = re.search(r'^token_sha256 = \["([0-9a-f]{64})"\]$', out.stdout, re.M).group(1)
    return token, digest


class Served:
    def __init__(self, base, tokens, model):
        self.base = base
        self.tokens = tokens
        self.model = model

    def call(self, who, tool, arguments):
        """One stateless MCP `tools/call` as `who`: the JSON-RPC result."""
        body = json.dumps({
            "jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": tool, "arguments": arguments, "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "0"},
                "io.modelcontextprotocol/clientCapabilities": {
                    "extensions": {"io.modelcontextprotocol/ui": {}}},
            }},
        }).encode()
        req = urllib.request.Request(f"{self.base}/mcp", data=body, method="POST", headers={
            "Authorization": f"Bearer {self.tokens[who]}",
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2026-07-28",
            "Mcp-Method": "tools/call",
            "Mcp-Name": tool,
        })
        with urllib.request.urlopen(req, timeout=300) as r:
            text = r.read().decode()
        if text.lstrip().startswith("{"):
            return json.loads(text)["result"]
        for line in text.splitlines():
            if line.startswith("data:") and '"id":1' in line.replace(" ", ""):
                return json.loads(line[5:])["result"]
        raise AssertionError(text)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    assert BIN, "DATAREF_BIN must name the dataref binary (scripts/test sets it)"
    tmp = tmp_path_factory.mktemp("page")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DATAREF_")}
    home = tmp / "home"
    made = subprocess.run([BIN, "serve", "--home", str(home), "--rows", str(ROWS)],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env,
                          timeout=300)
    db = home / "sample" / f"sales-{ROWS}.sqlite"
    assert db.exists(), made.stderr
    tokens, principals = {}, ""
    for name in ("eu_analyst", "us_analyst"):
        tokens[name], digest = new_token(name)
        principals += f'[principals.{name}]\ntoken_sha256 = ["{digest}"]\n\n'
    config = tmp / "dataref.toml"
    config.write_text(f"""
[python]
enabled = false

[sources.sample]
kind = "sqlite"
path = "{db}"

[queries.sales]
source = "sample"
description = "Load sales on or after a date."
sql = "SELECT date, line, region, channel, units, revenue, discount FROM sales WHERE date >= :since ORDER BY date, id"
params.since = {{ type = "date", required = true }}

[agents.default]
tools = ["fetch_*", "describe_data", "render_chart", "run_sql"]

[agents.default.approval]
run_sql = "ask"

{principals}""")
    model = ScriptedModel()
    server = subprocess.Popen(
        [BIN, "serve", "--config", str(config), "--home", str(home), "--http", "127.0.0.1:0"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**env, "DATAREF_LLM_URL": model.url, "DATAREF_LLM_MODEL": "test-model"},
    )
    try:
        base, lines = None, []
        for line in server.stderr:
            lines.append(line)
            m = re.match(r"serving MCP on (http://\S+)/mcp", line)
            if m:
                base = m.group(1)
                break
        assert base, "".join(lines)
        threading.Thread(target=lambda: [None for _ in server.stderr], daemon=True).start()
        yield Served(base, tokens, model)
    finally:
        server.terminate()
        server.wait(timeout=30)
        model.close()


@pytest.fixture(scope="module")
def browser():
    assert Path(CHROMIUM).exists(), f"no Chromium at {CHROMIUM} (scripts/test installs it)"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
        ])
        yield b
        b.close()


def open_page(browser, served, who):
    """A fresh context (no storage shared with another principal) on the page, signed in
    through the URL fragment; the page's errors are collected."""
    context = browser.new_context(viewport={"width": 1280, "height": 800}, accept_downloads=True)
    page = context.new_page()
    page.errors = []
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.on("console", lambda m: m.type == "error" and page.errors.append(m.text))
    page.goto(f"{served.base}/#token={served.tokens[who]}")
    page.wait_for_function("window.__dataref && window.__dataref.ready")
    assert "token=" not in page.url, "the token leaves the address bar"
    return page


def shot(page, name):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def last_tool_content(body):
    return [m for m in body["messages"] if m["role"] == "tool"][-1]["content"]


def data_ref_in(text):
    return re.search(r"data_[A-Za-z0-9_-]{22}", text).group(0)


def test_a_chat_turn_streams_steps_a_chart_and_an_answer_that_stays_text(served, browser):
    model = served.model
    model.push(calls=[("call_1", "fetch_sales", '{"since": "2025-01-01"}')])
    model.push_made(lambda body: {"calls": [("call_2", "render_chart", json.dumps({
        "dataRef": data_ref_in(last_tool_content(body)), "x": "region", "y": "revenue",
        "kind": "bar"}))]})
    model.push(text=f"**EMEA** led the year.\n\n- one\n- two\n\n{XSS}")
    page = open_page(browser, served, "eu_analyst")
    page.get_by_test_id("chat-input").fill("Which region sold most in 2025?")
    page.get_by_test_id("chat-send").click()
    answer = page.get_by_test_id("answer").last
    expect(answer).to_contain_text("EMEA led the year.", timeout=120_000)
    steps = page.get_by_test_id("tool-step")
    expect(steps).to_have_count(2)
    expect(page.locator('[data-testid=tool-step][data-tool=fetch_sales]')).to_have_attribute(
        "data-outcome", "ok")
    expect(page.locator('[data-testid=tool-step][data-tool=render_chart]')).to_have_attribute(
        "data-outcome", "ok")
    chart = page.locator('[data-testid=chart][data-kind=bar]').first
    expect(chart).to_be_visible(timeout=60_000)
    # Hovering a bar shows its value.
    chart.locator("rect.overlay").hover()
    expect(page.get_by_test_id("chart-tooltip").first).to_be_visible()
    # The model's `<script>` and `onerror` are text: shown, never run.
    expect(answer).to_contain_text("<script>window.pwned = 1</script>")
    assert page.evaluate("window.pwned") is None
    assert answer.locator("script, img").count() == 0
    # The session is listed and comes back on a new load.
    expect(page.get_by_test_id("session-item")).to_have_count(1)
    shot(page, "chat")
    assert not page.errors, page.errors
    page.context.close()


def test_approvals_are_asked_in_the_page(served, browser):
    model = served.model
    model.push(calls=[("call_a", "run_sql", json.dumps(
        {"sql": "SELECT 1 AS one", "inputs": {}, "store_as": "value"}))])
    model.push(calls=[("call_b", "run_sql", json.dumps(
        {"sql": "SELECT 2 AS two", "inputs": {}, "store_as": "value"}))])
    model.push(text="Done: two.")
    page = open_page(browser, served, "eu_analyst")
    page.get_by_test_id("new-chat").click()
    page.get_by_test_id("chat-input").fill("Count to two, with my say-so.")
    page.get_by_test_id("chat-send").click()
    # The first is denied, the second approved; the page shows the SQL it asks about.
    page.get_by_test_id("deny").first.click(timeout=60_000)
    expect(page.locator("[data-testid=tool-step][data-outcome=denied]")).to_have_count(1)
    page.get_by_test_id("approve").last.click(timeout=60_000)
    expect(page.get_by_test_id("answer").last).to_contain_text("Done: two.", timeout=60_000)
    expect(page.locator("[data-testid=tool-step][data-tool=run_sql][data-outcome=ok]")
           ).to_have_count(1)
    observations = [m["content"] for m in model.requests[-1]["messages"] if m["role"] == "tool"]
    assert "did not approve" in observations[-2] and '"values"' in observations[-1], observations
    shot(page, "approval")
    assert not page.errors, page.errors
    page.context.close()


def test_the_grid_pages_sorts_and_filters_a_million_rows_a_page_at_a_time(served, browser):
    described = served.call("eu_analyst", "fetch_sales", {"since": "2000-01-01"})
    sales = described["structuredContent"]["dataRef"]
    assert described["structuredContent"]["rows"] == ROWS
    page = open_page(browser, served, "eu_analyst")
    # The bytes of every answer to the page's tool calls, as received.
    sizes = []
    page.on("requestfinished", lambda r: r.url.endswith("/mcp")
            and sizes.append(r.sizes()["responseBodySize"]))
    item = page.locator("[data-testid=artifact-item]", has_text=sales)
    expect(item).to_be_visible(timeout=30_000)
    item.get_by_test_id("open-grid").click()
    status = page.get_by_test_id("grid-status")
    expect(status).to_contain_text("1,000,000", timeout=60_000)
    cells = page.get_by_test_id("grid-cell")
    expect(cells).to_have_count(100 * 7)
    page.get_by_test_id("grid-next").click()
    expect(status).to_contain_text("101")
    # Sort by revenue, largest first (a second click), then filter the region.
    header = page.locator("[data-testid=grid-header][data-column=revenue]")
    header.click()
    header.click()
    expect(header).to_have_attribute("aria-sort", "descending")
    top = served.call("eu_analyst", "run_sql", {
        "sql": "SELECT max(revenue) AS m FROM s", "inputs": {"s": sales}, "store_as": "value"})
    largest = top["structuredContent"]["values"][0][0]
    first = None
    for _ in range(120):  # the sorted page arrives after the click
        first = page.locator("tbody tr").first.get_by_test_id("grid-cell").nth(5).inner_text()
        if float(first.replace(",", "")) == pytest.approx(largest):
            break
        page.wait_for_timeout(500)
    assert float(first.replace(",", "")) == pytest.approx(largest), (first, largest)
    expect(status).to_contain_text("1–100")
    page.locator("[data-testid=grid-filter][data-column=region]").fill("EMEA")
    expect(status).not_to_contain_text("(matched 1,000,000)", timeout=60_000)
    page.wait_for_timeout(300)
    regions = [r.get_by_test_id("grid-cell").nth(2).inner_text()
               for r in page.locator("tbody tr").all()]
    assert regions and all(r == "EMEA" for r in regions), regions
    shot(page, "grid")
    # No answer carried more than a page: 100 rows of 7 short cells is about 12 KB.
    page.wait_for_timeout(500)
    assert len(sizes) >= 4 and 0 < min(sizes) and max(sizes) < 64 * 1024, sizes
    assert not page.errors, page.errors
    page.context.close()


def test_a_download_comes_through_a_signed_link(served, browser):
    described = served.call("eu_analyst", "run_sql", {
        "sql": "SELECT region, sum(revenue) AS revenue FROM s GROUP BY region ORDER BY region",
        "inputs": {"s": served.call("eu_analyst", "fetch_sales",
                                    {"since": "2025-06-01"})["structuredContent"]["dataRef"]}})
    ref = described["structuredContent"]["dataRef"]
    page = open_page(browser, served, "eu_analyst")
    item = page.locator("[data-testid=artifact-item]", has_text=ref)
    with page.expect_download(timeout=60_000) as d:
        item.get_by_test_id("download-csv").click()
    path = d.value.path()
    text = Path(path).read_text(encoding="utf-8-sig")
    assert text.splitlines()[0] == "region,revenue", text[:200]
    assert len(text.splitlines()) == 6
    assert "/files/" in d.value.url and "sig=" in d.value.url
    page.context.close()


def test_a_cell_holding_a_script_stays_text(served, browser):
    literal = "'" + XSS.replace("'", "''") + "'"
    made = served.call("eu_analyst", "run_sql", {"sql": f"SELECT {literal} AS s", "inputs": {}})
    ref = made["structuredContent"]["dataRef"]
    page = open_page(browser, served, "eu_analyst")
    item = page.locator("[data-testid=artifact-item]", has_text=ref)
    item.get_by_test_id("open-grid").click()
    cell = page.get_by_test_id("grid-cell").first
    expect(cell).to_have_text(XSS, timeout=60_000)
    assert page.evaluate("window.pwned") is None
    assert page.get_by_test_id("grid").locator("script, img").count() == 0
    page.context.close()


def test_another_principal_sees_none_of_it(served, browser):
    theirs = served.call("eu_analyst", "view_artifacts", {})["structuredContent"]["artifacts"]
    assert theirs, "the tests before made tables"
    page = open_page(browser, served, "us_analyst")
    page.wait_for_timeout(1_000)
    expect(page.get_by_test_id("session-item")).to_have_count(0)
    expect(page.get_by_test_id("artifact-item")).to_have_count(0)
    shot(page, "second-principal")
    page.context.close()
    # The first principal's table answers like one that does not exist.
    mine = served.call("us_analyst", "view_rows", {"dataRef": theirs[0]["dataRef"]})
    unknown = served.call("us_analyst", "view_rows", {"dataRef": "data_AAAAAAAAAAAAAAAAAAAAAA"})
    assert mine["isError"] and unknown["isError"]
    strip = lambda r: re.sub(r"data_[A-Za-z0-9_-]{22}", "data_…", r["content"][0]["text"])
    assert strip(mine) == strip(unknown)
