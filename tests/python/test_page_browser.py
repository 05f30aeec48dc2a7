"""The page in a real browser: Debian's Chromium driven by Playwright (its PyPI wheel,
pointed at the system browser: no browser download), against the real `dataref serve
--http` on loopback with the built-in sample of 1M rows and its agent's model at the
scripted OpenAI-compatible server.

- a chat turn that fetches, charts and answers: the steps, the interactive chart (its
  tooltip and legend), the answer, and model text holding `<script>` shown as text;
- Stop cancels a run on the server too, and the page takes the next message;
- the grid on the 1M-row table: pages, sorts and filters while the browser never receives
  more than a page of rows (the bytes of every answer counted on the wire);
- a download of a table, or of what the grid shows (its filter and sort), given to the
  browser whole and written nowhere; a file's through a signed link, and the Files list;
- a file uploaded (the button's input) or dropped becomes a table under its name, with the
  file's numbers exact; one the loader refuses says why;
- a line chart over dates zooms by a drag and resets by a double-click;
- a second principal sees none of the first's sessions or tables, and its calls on the
  first's table get the answer an unknown table gets;
- a cell holding `<script>` stays text.

Screenshots go to `target/browser-screenshots/` (kept as test artifacts).
Run by `scripts/test`, which installs Chromium, builds the binary and sets DATAREF_BIN.

The binary embeds the page when it is built. DATAREF_PAGE_FROM_SOURCE=1 serves `/` from
crates/dataref-mcp/ui/view.html as it is now instead (intercepted in the browser, with the
policy the server would send for it), to try an edit of the page without a rebuild.
"""

import json
import os
import re
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

from page_support import page_from_source, wait_ready
from scripted_model import ScriptedModel

BIN = os.environ.get("DATAREF_BIN")
CHROMIUM = os.environ.get("DATAREF_CHROMIUM", "/usr/bin/chromium")
ROWS = 1_000_000
ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "target" / "browser-screenshots"
PAGE_FROM_SOURCE = os.environ.get("DATAREF_PAGE_FROM_SOURCE") == "1"
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

    def api(self, who, method, path, body=None):
        """One JSON request to the agent API as `who`: the parsed answer."""
        req = urllib.request.Request(
            f"{self.base}{path}", method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self.tokens[who]}",
                     "Content-Type": "application/json", "Accept": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read() or b"null")

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
    """The page's server, its agents answered by the scripted model."""
    model = ScriptedModel()
    try:
        yield from serve_page(tmp_path_factory, model)
    finally:
        model.close()


@pytest.fixture(scope="module")
def served_without_model(tmp_path_factory):
    """The same server as a fresh machine has it: no model endpoint anywhere."""
    yield from serve_page(tmp_path_factory, None)


def serve_page(tmp_path_factory, model):
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
tools = ["fetch_*", "describe_data", "render_chart", "render_table", "run_sql", "export_data"]

[agents.default.approval]
run_sql = "ask"

{principals}""")
    if model:
        env = {**env, "DATAREF_LLM_URL": model.url, "DATAREF_LLM_MODEL": "test-model"}
    server = subprocess.Popen(
        [BIN, "serve", "--config", str(config), "--home", str(home), "--http", "127.0.0.1:0"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env=env,
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


def open_page(browser, served, who, touch=False):
    """A fresh context (no storage shared with another principal) on the page, signed in
    through the URL fragment; the page's errors are collected. With
    DATAREF_PAGE_FROM_SOURCE=1 the page is the source file, not the binary's copy. With
    `touch`, the screen is a touch screen (taps, no hover)."""
    context = browser.new_context(viewport={"width": 1280, "height": 800}, has_touch=touch,
                                  accept_downloads=True)
    if PAGE_FROM_SOURCE:
        body, headers = page_from_source()
        context.route(f"{served.base}/",
                      lambda route: route.fulfill(status=200, headers=headers, body=body))
    page = context.new_page()
    page.errors = []
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.on("console", lambda m: m.type == "error" and page.errors.append(m.text))
    page.goto(f"{served.base}/#token={served.tokens[who]}")
    wait_ready(page)
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
    model.push(text=f"**EMEA** led the year.\n\n- one\n- two\n\n> a quoted line\n> > and a deeper one"
               f"\n\nSee [pivoting](https://en.wikipedia.org/wiki/Pivot_(statistics)).\n\n{XSS}")
    page = open_page(browser, served, "eu_analyst")
    # The page is for asking: the message box has the focus once it is ready.
    expect(page.get_by_test_id("chat-input")).to_be_focused()
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
    # A legend entry hides its series and shows it again.
    box = page.locator(".chart-box", has=chart)
    legend = box.get_by_test_id("legend-item")
    if legend.count():
        bars = chart.locator("rect.bar").count()
        assert bars > 0
        legend.first.click()
        expect(legend.first).to_have_attribute("aria-pressed", "false")
        expect(legend.first).to_have_class(re.compile(r"\boff\b"))
        expect(chart.locator("rect.bar")).to_have_count(0)
        legend.first.click()
        expect(legend.first).to_have_attribute("aria-pressed", "true")
        expect(chart.locator("rect.bar")).to_have_count(bars)
    # A quote is a quote (nested too); a link keeps the parentheses of its URL.
    expect(answer.locator("blockquote").first).to_contain_text("a quoted line")
    expect(answer.locator("blockquote blockquote")).to_have_text("and a deeper one")
    assert ">" not in answer.locator("blockquote").first.inner_text()
    expect(answer.locator('a[href="https://en.wikipedia.org/wiki/Pivot_(statistics)"]')).to_have_text(
        "pivoting")
    # The model's `<script>` and `onerror` are text: shown, never run.
    expect(answer).to_contain_text("<script>window.pwned = 1</script>")
    assert page.evaluate("window.pwned") is None
    assert answer.locator("script, img").count() == 0
    # The session is listed and comes back on a new load.
    expect(page.get_by_test_id("session-item")).to_have_count(1)
    shot(page, "chat")
    assert not page.errors, page.errors
    page.context.close()


def test_a_render_table_step_opens_its_table_in_the_grid(served, browser):
    model = served.model
    model.push(calls=[("call_t1", "fetch_sales", '{"since": "2025-11-01"}')])
    model.push_made(lambda body: {"calls": [("call_t2", "render_table", json.dumps({
        "dataRef": data_ref_in(last_tool_content(body)), "sort": "revenue",
        "descending": True, "limit": 5}))]})
    model.push(text="The five biggest sales are shown.")
    page = open_page(browser, served, "eu_analyst")
    page.get_by_test_id("chat-input").fill("Show me the biggest sales since November.")
    page.get_by_test_id("chat-send").click()
    expect(page.get_by_test_id("answer").last).to_contain_text("five biggest", timeout=120_000)
    step = page.locator("[data-testid=tool-step][data-tool=render_table]")
    expect(step).to_have_attribute("data-outcome", "ok")
    step.get_by_test_id("open-table").click()
    expect(page.get_by_test_id("grid-status")).to_contain_text("rows 1–", timeout=60_000)
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
    # Known by its query and arguments, not only by its dataRef.
    expect(item.get_by_test_id("artifact-name")).to_have_text("sales since=2000-01-01")
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


def by_region(served, column):
    """The dataRef of `column` summed by region over the sales since June 2025."""
    described = served.call("eu_analyst", "run_sql", {
        "sql": f"SELECT region, sum({column}) AS {column} FROM s GROUP BY region ORDER BY region",
        "inputs": {"s": served.call("eu_analyst", "fetch_sales",
                                    {"since": "2025-06-01"})["structuredContent"]["dataRef"]}})
    return described["structuredContent"]["dataRef"]


def test_a_download_is_the_table_and_writes_no_file(served, browser):
    ref = by_region(served, "revenue")
    before = served.call("eu_analyst", "view_files", {"recursive": True})["structuredContent"]
    page = open_page(browser, served, "eu_analyst")
    item = page.locator("[data-testid=artifact-item]", has_text=ref)
    with page.expect_download(timeout=60_000) as d:
        item.get_by_test_id("download-csv").click()
    path = d.value.path()
    text = Path(path).read_text(encoding="utf-8-sig")
    assert text.splitlines()[0] == "region,revenue", text[:200]
    assert len(text.splitlines()) == 6
    assert d.value.suggested_filename.endswith(".csv"), d.value.suggested_filename
    assert d.value.url.startswith("blob:"), d.value.url
    after = served.call("eu_analyst", "view_files", {"recursive": True})["structuredContent"]
    assert after == before, "a download writes nothing into the workspace"
    page.context.close()


def test_each_table_shows_its_provenance_and_opens_its_parent(served, browser):
    sales = served.call("eu_analyst", "fetch_sales",
                        {"since": "2025-06-01"})["structuredContent"]["dataRef"]
    sql = "SELECT '<img src=x onerror=alert(1)>' AS tag, count(*) AS n FROM s"
    ref = served.call("eu_analyst", "run_sql", {"sql": sql, "inputs": {"s": sales}})[
        "structuredContent"]["dataRef"]
    page = open_page(browser, served, "eu_analyst")
    item = page.locator(f"[data-testid=artifact-item][data-ref={ref}]")
    panel = item.get_by_test_id("provenance")
    panel.locator("summary").click()
    # The SQL as it ran, as text: the tag in it is no element of the page.
    expect(panel).to_contain_text("onerror=alert(1)")
    assert panel.locator("img").count() == 0
    expect(panel.get_by_test_id("prov-engines")).to_contain_text("datafusion")
    expect(panel.get_by_test_id("prov-checksum")).to_contain_text("blake3:")
    parent = panel.get_by_test_id("prov-parent")
    expect(parent).to_contain_text("s: " + sales)
    parent.get_by_role("button").click()
    expect(page.locator(f"[data-testid=grid][data-ref={sales}]")).to_be_visible(timeout=30_000)
    # The fetched table's own: its source, the SQL with its parameter and the value bound.
    fetched = page.locator(f"[data-testid=artifact-item][data-ref={sales}]")
    fetched.get_by_test_id("provenance").locator("summary").click()
    expect(fetched.get_by_test_id("prov-source")).to_contain_text("(sqlite)")
    expect(fetched.get_by_test_id("provenance")).to_contain_text("2025-06-01")
    assert not page.errors, page.errors
    page.context.close()


def test_the_grids_download_is_what_the_grid_shows(served, browser):
    """Filtered to one region and sorted by revenue, largest first: the grid's CSV button
    downloads exactly those rows in that order, not the whole table."""
    recent = served.call("eu_analyst", "run_sql", {
        "sql": "SELECT * FROM s WHERE date >= DATE '2025-12-01'",
        "inputs": {"s": served.call("eu_analyst", "fetch_sales",
                                    {"since": "2025-12-01"})["structuredContent"]["dataRef"]}})
    ref = recent["structuredContent"]["dataRef"]
    emea = served.call("eu_analyst", "run_sql", {
        "sql": "SELECT count(*) AS n FROM s WHERE region = 'EMEA'",
        "inputs": {"s": ref}, "store_as": "value"})["structuredContent"]["values"][0][0]
    page = open_page(browser, served, "eu_analyst")
    page.locator("[data-testid=artifact-item]", has_text=ref).get_by_test_id("open-grid").click()
    status = page.get_by_test_id("grid-status")
    expect(status).to_contain_text("1–100", timeout=60_000)
    header = page.locator("[data-testid=grid-header][data-column=revenue]")
    header.click()
    header.click()
    expect(header).to_have_attribute("aria-sort", "descending")
    page.locator("[data-testid=grid-filter][data-column=region]").fill("EMEA")
    expect(status).to_contain_text(f"(matched {emea:,})", timeout=60_000)
    with page.expect_download(timeout=120_000) as d:
        page.get_by_test_id("grid-download-csv").click()
    lines = Path(d.value.path()).read_text(encoding="utf-8-sig").splitlines()
    header_cells = lines[0].split(",")
    rows = [dict(zip(header_cells, ln.split(","))) for ln in lines[1:]]
    assert len(rows) == emea > 100, (len(rows), emea)
    assert {r["region"] for r in rows} == {"EMEA"}
    revenue = [float(r["revenue"]) for r in rows]
    assert revenue == sorted(revenue, reverse=True), revenue[:10]
    assert not page.errors, page.errors
    page.context.close()


def test_tapping_a_bar_shows_its_value(served, browser):
    ref = by_region(served, "units")
    page = open_page(browser, served, "eu_analyst", touch=True)
    item = page.locator("[data-testid=artifact-item]", has_text=ref)
    item.get_by_test_id("open-chart").click()
    chart = page.locator("[data-testid=chart][data-kind=bar]")
    expect(chart.locator("rect.bar").first).to_be_visible(timeout=60_000)
    # A touch screen has no hover: the tap itself shows the value, and it stays.
    chart.locator("rect.overlay").tap()
    tip = page.get_by_test_id("chart-tooltip").first
    expect(tip).to_be_visible()
    expect(tip).to_contain_text("units")
    page.wait_for_timeout(300)
    expect(tip).to_be_visible()
    assert not page.errors, page.errors
    page.context.close()


def test_without_a_model_the_first_screen_says_how_to_connect_one(served_without_model, browser):
    page = open_page(browser, served_without_model, "eu_analyst")
    help_ = page.get_by_test_id("connect-model")
    expect(help_).to_be_visible(timeout=30_000)
    expect(help_).to_contain_text("DATAREF_LLM_URL")
    expect(help_).to_contain_text("[agents.default]")
    expect(help_).to_contain_text("dataref doctor")
    expect(help_.get_by_test_id("copy-snippet")).to_have_count(3)
    # The rest of the page works without a model: the tables are listed.
    ref = served_without_model.call("eu_analyst", "fetch_sales",
                                    {"since": "2025-12-01"})["structuredContent"]["dataRef"]
    page.reload()
    wait_ready(page)
    expect(page.locator("[data-testid=artifact-item]", has_text=ref)).to_be_visible(timeout=30_000)
    expect(page.get_by_test_id("connect-model")).to_be_visible()
    shot(page, "no-model")
    assert not page.errors, page.errors
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


def x_tick_labels(chart):
    """The x axis' tick labels of a chart: drawn centred under the plot (the axis titles
    and messages have their own classes)."""
    return chart.locator("text[text-anchor=middle]:not(.axis-title):not(.empty-msg)").evaluate_all(
        "texts => texts.map((t) => t.textContent)")


def until(page, check, timeout_s=30):
    """Polls `check()` until it is truthy; its last value."""
    deadline = time.monotonic() + timeout_s
    while not (value := check()) and time.monotonic() < deadline:
        page.wait_for_timeout(100)
    return value


def test_a_line_chart_zooms_and_resets(served, browser):
    sales = served.call("eu_analyst", "fetch_sales", {"since": "2025-01-01"})
    ref = sales["structuredContent"]["dataRef"]
    page = open_page(browser, served, "eu_analyst")
    # The artifact's Chart button: a table with a date column opens as a line over it.
    item = page.locator("[data-testid=artifact-item]", has_text=ref)
    item.get_by_test_id("open-chart").click()
    page.locator("select[aria-label=y]").select_option("revenue")
    chart = page.locator("[data-testid=chart][data-kind=line]")
    expect(chart.locator("text.axis-title", has_text="revenue")).to_have_count(1, timeout=60_000)
    expect(chart.locator("path.line")).to_have_count(1)
    whole = x_tick_labels(chart)
    assert len(whole) >= 2 and all(re.match(r"\d{4}-\d\d", t) for t in whole), whole
    # A drag over the middle fifth of the plot zooms into it: other, finer ticks.
    plot = chart.locator("rect.overlay").bounding_box()
    y = plot["y"] + plot["height"] / 2
    page.mouse.move(plot["x"] + plot["width"] * 0.4, y)
    page.mouse.down()
    page.mouse.move(plot["x"] + plot["width"] * 0.5, y, steps=5)
    page.mouse.move(plot["x"] + plot["width"] * 0.6, y, steps=5)
    page.mouse.up()
    reset = page.locator(".chart-box", has=chart).get_by_role("button", name="Reset zoom")
    expect(reset).to_be_visible()
    zoomed = until(page, lambda: (lambda t: t if t and t != whole else None)(x_tick_labels(chart)))
    assert zoomed, (whole, x_tick_labels(chart))
    # A double-click on the plot gives the whole range back.
    chart.locator("rect.overlay").dblclick()
    expect(reset).to_be_hidden()
    assert until(page, lambda: x_tick_labels(chart) == whole), (whole, x_tick_labels(chart))
    shot(page, "line-zoom")
    assert not page.errors, page.errors
    page.context.close()


def test_stop_cancels_a_run(served, browser):
    sales = served.call("eu_analyst", "fetch_sales", {"since": "2000-01-01"})
    ref = sales["structuredContent"]["dataRef"]
    # A join with many matches per key over the 1M rows: about half a minute in a debug
    # build, during which the server stays responsive. (A self cross join is refused for
    # its memory and, cut down to fit, keeps the engine's threads busy through a cancel.)
    slow = ("SELECT count(*) AS n FROM s x JOIN s y ON x.units = y.units AND x.line = y.line "
            "AND x.region = y.region WHERE x.revenue < y.revenue")
    model = served.model
    model.push(calls=[("call_slow", "run_sql", json.dumps(
        {"sql": slow, "inputs": {"s": ref}, "store_as": "value"}))])
    model.push(text="Still here: ask away.")
    asked = len(model.requests)
    page = open_page(browser, served, "eu_analyst")
    page.get_by_test_id("new-chat").click()
    page.get_by_test_id("chat-input").fill("Count the pairs of sales.")
    page.get_by_test_id("chat-send").click()
    # run_sql asks first; approved, the query runs until Stop.
    page.get_by_test_id("approve").click(timeout=60_000)
    step = page.locator("[data-testid=tool-step][data-tool=run_sql]").last
    expect(step.locator(".badge")).to_have_text("approved")
    page.wait_for_timeout(500)
    assert step.get_attribute("data-outcome") is None, "the query ended before Stop"
    stop = page.get_by_test_id("chat-stop")
    expect(stop).to_be_enabled()
    stop.click()
    # The page marks the run as stopped and the step as cancelled, and takes input again.
    expect(page.get_by_test_id("run-stopped")).to_have_text("stopped: you cancelled the run")
    expect(step).to_have_attribute("data-outcome", "cancelled")
    expect(step.locator(".badge")).to_have_text("cancelled")
    expect(stop).to_be_disabled()
    expect(page.get_by_test_id("chat-send")).to_be_enabled()
    sid = page.evaluate("() => sessionStorage.getItem('dataref.session')")
    assert sid and sid.startswith("s-"), sid
    # The same session answers the next message sent at once (the page waits out the moment
    # the server is still closing the stopped run).
    page.get_by_test_id("chat-input").fill("Are you still there?")
    page.get_by_test_id("chat-send").click()
    expect(page.get_by_test_id("answer").last).to_contain_text("Still here", timeout=60_000)
    # On the server the query was cancelled (not finished, not timed out), and the model was
    # asked only for the call and for the second answer.
    assert len(model.requests) == asked + 2, [r["messages"][-1] for r in model.requests[asked:]]
    messages = served.api("eu_analyst", "GET", f"/agent/sessions/{sid}")["messages"]
    tools = [m["content"] for m in messages if m["role"] == "tool"]
    assert len(tools) == 1 and "cancelled" in tools[0], tools
    assert [m["content"] for m in messages if m["role"] == "user"] == [
        "Count the pairs of sales.", "Are you still there?"]
    # Opened again from the list, the session shows the stopped call as cancelled.
    page.get_by_test_id("new-chat").click()
    page.locator(f"[data-testid=session-item][data-id={sid}]").click()
    again = page.locator("[data-testid=tool-step][data-tool=run_sql]")
    expect(again).to_have_count(1)
    expect(again).to_have_attribute("data-outcome", "cancelled")
    expect(page.get_by_test_id("answer").last).to_contain_text("Still here")
    shot(page, "stopped")
    # Sent at once after Stop, the second message can meet the stopped run still closing on
    # the server: 409 (busy), or 404 while the new session is not written yet. The page
    # waits that out (tested above: the answer came); the browser logs each such answer.
    waited = [e for e in page.errors if re.search(r"status of 40[49] ", e)]
    assert len(waited) <= 40, waited
    assert not [e for e in page.errors if e not in waited], page.errors
    page.context.close()


def test_files_are_listed_and_downloaded(served, browser):
    probe = served.call("eu_analyst", "view_files", {})
    assert not probe.get("isError"), probe
    made = served.call("eu_analyst", "run_sql", {
        "sql": "SELECT channel, sum(units) AS units FROM s GROUP BY channel ORDER BY channel",
        "inputs": {"s": served.call("eu_analyst", "fetch_sales",
                                    {"since": "2025-03-01"})["structuredContent"]["dataRef"]}})
    ref = made["structuredContent"]["dataRef"]
    exported = served.call("eu_analyst", "export_data", {"source": ref, "format": "csv"})
    path = exported["structuredContent"]["path"]
    name = path.rsplit("/", 1)[-1]
    page = open_page(browser, served, "eu_analyst")
    files = page.get_by_test_id("file-list")
    item = files.locator(f'[data-testid=file-item][data-path="{path}"]')
    expect(item).to_be_visible(timeout=30_000)
    expect(item).to_contain_text(name)
    expect(item).to_contain_text(" B")  # its size
    listed = lambda: files.get_by_test_id("file-item").evaluate_all(
        "items => items.map((i) => i.getAttribute('data-path'))")
    # Files only (no directories), nothing spilled unless asked for.
    paths = listed()
    assert path in paths and "exports" not in paths, paths
    assert not any(p.startswith(".spill/") for p in paths), paths
    with page.expect_download(timeout=60_000) as d:
        item.get_by_test_id("file-download").click()
    assert d.value.suggested_filename == name
    assert "/files/" in d.value.url and "sig=" in d.value.url
    text = Path(d.value.path()).read_text(encoding="utf-8-sig")
    assert text.splitlines()[0] == "channel,units", text[:200]
    # A chart the agent draws is listed, first (the newest), when its run ends.
    model = served.model
    model.push(calls=[("call_f", "render_chart", json.dumps({
        "dataRef": ref, "x": "channel", "y": "units", "kind": "bar",
        "title": "Units by channel for the files test"}))])
    model.push(text="Charted.")
    page.get_by_test_id("chat-input").fill("Chart the units by channel.")
    page.get_by_test_id("chat-send").click()
    expect(page.get_by_test_id("answer").last).to_contain_text("Charted.", timeout=120_000)
    new = until(page, lambda: [p for p in listed() if p not in paths])
    assert any(p.startswith("charts/") and p.endswith(".png") for p in new), (paths, new)
    assert listed()[0] in new, (listed(), new)
    shot(page, "files")
    assert not page.errors, page.errors
    page.context.close()


def test_a_file_uploaded_or_dropped_becomes_a_table(served, browser):
    page = open_page(browser, served, "eu_analyst")
    expect(page.get_by_test_id("files")).to_be_visible(timeout=30_000)
    # Excel's "CSV" in much of Europe: Windows-1252, `;`, decimal commas.
    csv = "Région;target\nEMEA;1.250.000,50\nAPAC;980.000\n".encode("cp1252")
    page.get_by_test_id("file-upload-input").set_input_files(
        files=[{"name": "targets.csv", "mimeType": "text/csv", "buffer": csv}])
    row = page.locator('[data-testid=upload-row][data-name="targets.csv"]')
    expect(row.get_by_test_id("upload-status")).to_have_text("2 rows", timeout=60_000)
    named = page.get_by_test_id("artifact-item").filter(
        has=page.get_by_test_id("artifact-name").filter(has_text="targets.csv"))
    expect(named).to_be_visible(timeout=30_000)
    files = page.get_by_test_id("file-list")
    expect(files.locator('[data-testid=file-item][data-path="uploads/targets.csv"]')) \
        .to_be_visible(timeout=30_000)
    # The table holds the file's numbers exactly.
    ref = named.first.get_attribute("data-ref")
    summed = served.call("eu_analyst", "run_sql", {
        "sql": "SELECT sum(target) AS total, min(\"Région\") AS first FROM t",
        "inputs": {"t": ref}, "store_as": "value"})
    assert summed["structuredContent"]["values"] == [[2230000.5, "APAC"]], summed
    # A drop on the Files section goes the same way; a file the loader refuses says why.
    page.evaluate("""() => {
        const dt = new DataTransfer();
        dt.items.add(new File([new Uint8Array([0x89, 0x50, 0x4e, 0x47, 0, 0, 0, 0])],
                              'photo.csv', {type: 'text/csv'}));
        const target = document.querySelector('[data-testid=files]');
        target.dispatchEvent(new DragEvent('drop', {dataTransfer: dt, bubbles: true, cancelable: true}));
    }""")
    bad = page.locator('[data-testid=upload-row][data-name="photo.csv"]') \
        .get_by_test_id("upload-status")
    expect(bad).to_contain_text("not loaded", timeout=60_000)
    expect(bad).to_contain_text("NUL bytes")
    shot(page, "upload")
    assert not page.errors, page.errors
    page.context.close()


def test_a_named_query_runs_from_its_form_without_a_model(served_without_model, browser):
    served = served_without_model
    page = open_page(browser, served, "eu_analyst")
    # The named queries are listed from tools/list: the name, the first sentence, the whole
    # description as the title.
    item = page.locator("[data-testid=source-item][data-tool=fetch_sales]")
    expect(item).to_be_visible(timeout=30_000)
    expect(item).to_contain_text("fetch_sales")
    expect(item.locator(".q-desc")).to_have_text("Load sales on or after a date.")
    assert "dataRef" in item.get_attribute("title")
    assert page.locator("[data-testid=source-item]").evaluate_all(
        "items => items.map((i) => i.getAttribute('data-tool'))") == ["fetch_sales"]
    item.click()
    # Its form comes from its inputSchema: `since` is a required date, with its hint.
    form = page.locator("[data-testid=query-form][data-tool=fetch_sales]")
    expect(form).to_be_visible()
    since = form.locator("[data-testid=query-field][data-name=since]")
    expect(since).to_have_attribute("type", "date")
    expect(since).to_have_attribute("aria-required", "true")
    param = form.locator("[data-testid=query-param][data-name=since]")
    expect(param.locator(".req")).to_have_count(1)
    expect(param.get_by_test_id("query-hint")).to_contain_text("YYYY-MM-DD")
    # Run without the date: the server's error and its hint, in the form (no alert, no grid).
    form.get_by_test_id("query-run").click()
    error = form.get_by_test_id("error")
    expect(error).to_contain_text("required", timeout=30_000)
    expect(error.locator(".hint")).to_contain_text("`fetch_sales` takes `since`")
    expect(page.get_by_test_id("grid")).to_have_count(0)
    # With a date: the table opens in the grid, all its rows counted, and it is listed.
    rows = served.call("eu_analyst", "fetch_sales",
                       {"since": "2025-12-01"})["structuredContent"]["rows"]
    since.fill("2025-12-01")
    form.get_by_test_id("query-run").click()
    status = page.get_by_test_id("grid-status")
    expect(status).to_contain_text(f"of {rows:,} ", timeout=60_000)
    ref = page.get_by_test_id("grid").get_attribute("data-ref")
    made = page.locator(f"[data-testid=artifact-item][data-ref={ref}]")
    expect(made).to_be_visible(timeout=30_000)
    expect(made.get_by_test_id("artifact-name")).to_have_text("sales since=2025-12-01")
    # Opened again, the form keeps the date it ran with.
    item.click()
    expect(page.locator("[data-testid=query-field][data-name=since]")).to_have_value("2025-12-01")
    shot(page, "named-query")
    assert not page.errors, page.errors
    page.context.close()


def test_the_sql_editor_runs_over_a_fetched_table(served_without_model, browser):
    served = served_without_model
    ref = served.call("eu_analyst", "fetch_sales",
                      {"since": "2025-06-01"})["structuredContent"]["dataRef"]
    page = open_page(browser, served, "eu_analyst")
    page.get_by_test_id("sql-open").click()
    panel = page.get_by_test_id("sql-panel")
    editor = panel.get_by_test_id("sql-input")
    expect(editor).to_be_focused()
    # A table of the list puts its alias in the SQL (a first query when the editor is empty).
    table = panel.locator(f"[data-testid=sql-table][data-ref={ref}]")
    expect(table).to_contain_text("sales since=2025-06-01")
    table.click()
    expect(editor).to_have_value("SELECT * FROM sales")
    alias = panel.locator(f"[data-testid=sql-inputs] [data-ref={ref}]").get_by_test_id("sql-alias")
    expect(alias).to_have_value("sales")
    alias.fill("s")
    editor.fill("SELECT region, sum(revenue) AS r FROM s GROUP BY region")
    editor.press("Control+Enter")
    status = panel.get_by_test_id("grid-status")
    expect(status).to_contain_text("rows 1–5 of 5", timeout=60_000)
    expect(panel.locator("tbody tr")).to_have_count(5)
    expect(panel.get_by_test_id("grid-header")).to_have_text(["region", "r"])
    result = panel.get_by_test_id("grid").get_attribute("data-ref")
    expect(page.locator(f"[data-testid=artifact-item][data-ref={result}]")).to_be_visible(
        timeout=30_000)
    # A wrong query: the engine's message and its hint under the editor; the SQL stays.
    editor.fill("SELECT nope FROM s")
    panel.get_by_test_id("sql-run").click()
    error = panel.get_by_test_id("sql-error").get_by_test_id("error")
    expect(error).to_contain_text("No field named nope", timeout=30_000)
    expect(error.locator(".hint")).to_contain_text("tables: `s`")
    expect(editor).to_have_value("SELECT nope FROM s")
    shot(page, "sql-editor")
    assert not page.errors, page.errors
    page.context.close()


def test_suggested_questions_come_with_a_model_only(served, served_without_model, browser):
    # Made from fetch_sales ("Load sales on or after a date.") and the date of the newest
    # table it made.
    served.call("eu_analyst", "fetch_sales", {"since": "2025-03-01"})
    asked = len(served.model.requests)
    page = open_page(browser, served, "eu_analyst")
    suggestions = page.get_by_test_id("suggestion")
    expect(suggestions.first).to_be_visible(timeout=30_000)
    texts = suggestions.all_inner_texts()
    assert 2 <= len(texts) <= 3 and len(set(texts)) == len(texts), texts
    assert all("sales" in t and "since 2025-03-01" in t for t in texts), texts
    expect(page.get_by_test_id("connect-model")).to_have_count(0)
    # A click puts the question in the message box, to edit or send: nothing is sent.
    suggestions.nth(1).click()
    box = page.get_by_test_id("chat-input")
    expect(box).to_have_value(texts[1])
    expect(box).to_be_focused()
    page.wait_for_timeout(300)
    assert len(served.model.requests) == asked
    shot(page, "suggestions")
    assert not page.errors, page.errors
    page.context.close()
    # Without a model: how to connect one, and no questions.
    page = open_page(browser, served_without_model, "eu_analyst")
    expect(page.get_by_test_id("connect-model")).to_be_visible(timeout=30_000)
    expect(page.locator("[data-testid=source-item][data-tool=fetch_sales]")).to_be_visible()
    expect(page.get_by_test_id("suggestion")).to_have_count(0)
    assert not page.errors, page.errors
    page.context.close()


def test_another_principal_sees_none_of_it(served, browser):
    theirs = served.call("eu_analyst", "view_artifacts", {})["structuredContent"]["artifacts"]
    assert theirs, "the tests before made tables"
    page = open_page(browser, served, "us_analyst")
    page.wait_for_timeout(1_000)
    expect(page.get_by_test_id("session-item")).to_have_count(0)
    expect(page.get_by_test_id("artifact-item")).to_have_count(0)
    expect(page.get_by_test_id("file-item")).to_have_count(0)
    shot(page, "second-principal")
    page.context.close()
    # The first principal's table answers like one that does not exist.
    mine = served.call("us_analyst", "view_rows", {"dataRef": theirs[0]["dataRef"]})
    unknown = served.call("us_analyst", "view_rows", {"dataRef": "data_AAAAAAAAAAAAAAAAAAAAAA"})
    assert mine["isError"] and unknown["isError"]
    strip = lambda r: re.sub(r"data_[A-Za-z0-9_-]{22}", "data_…", r["content"][0]["text"])
    assert strip(mine) == strip(unknown)


def test_a_resumed_session_shows_what_the_live_run_showed(served, browser):
    """A run that exports a table: the answer ends with a card for the file, which
    downloads; opened again from the list, the session shows each step's line, time and
    outcome exactly as the live run did, and the same card."""
    ref = by_region(served, "units")
    model = served.model
    model.push(calls=[("call_e", "export_data", json.dumps({"source": ref, "format": "csv"}))])
    model.push(text="Here is the file.")
    page = open_page(browser, served, "eu_analyst")
    page.get_by_test_id("chat-input").fill("Export units by region as CSV.")
    page.get_by_test_id("chat-send").click()
    expect(page.get_by_test_id("answer").last).to_contain_text("Here is the file.",
                                                              timeout=120_000)
    step = page.locator("[data-testid=tool-step][data-tool=export_data]")
    expect(step).to_have_attribute("data-outcome", "ok")
    live = step.locator("summary").inner_text()
    assert re.search(r"\d+ ms|\d\.\d s", live), live
    card = page.get_by_test_id("file-card")
    expect(card).to_have_count(1)
    path = card.get_attribute("data-path")
    assert path.startswith("exports/") and path.endswith(".csv"), path
    with page.expect_download(timeout=60_000) as d:
        card.get_by_test_id("file-card-download").click()
    assert d.value.suggested_filename == path.rsplit("/", 1)[-1]
    assert Path(d.value.path()).read_text(encoding="utf-8-sig").splitlines()[0] == "region,units"
    sid = page.evaluate("() => sessionStorage.getItem('dataref.session')")
    # The stored tool message keeps what the person was shown; the model never reads it.
    messages = served.api("eu_analyst", "GET", f"/agent/sessions/{sid}")["messages"]
    [tool] = [m for m in messages if m["role"] == "tool"]
    assert tool["outcome"] == "ok" and tool["shown"]["path"] == path, tool
    page.get_by_test_id("new-chat").click()
    page.locator(f"[data-testid=session-item][data-id={sid}]").click()
    again = page.locator("[data-testid=tool-step][data-tool=export_data]")
    expect(again).to_have_attribute("data-outcome", "ok")
    assert again.locator("summary").inner_text() == live
    expect(page.get_by_test_id("file-card")).to_have_count(1)
    assert page.get_by_test_id("file-card").get_attribute("data-path") == path
    expect(page.get_by_test_id("answer").last).to_contain_text("Here is the file.")
    assert not page.errors, page.errors
    page.context.close()


def test_numbers_no_tool_produced_are_checked_then_marked(served, browser):
    """The model's answer holds a number no tool produced: the page says it was sent back
    to be checked, and the answer that still holds one marks it and says so; opened again,
    the session shows the same."""
    ref = by_region(served, "units")
    units = served.call("eu_analyst", "run_sql", {
        "sql": "SELECT sum(units) AS u FROM s", "inputs": {"s": ref},
        "store_as": "value"})["structuredContent"]["values"][0][0]
    model = served.model
    model.push(calls=[("call_u", "run_sql", json.dumps({
        "sql": "SELECT sum(units) AS u FROM s", "inputs": {"s": ref}, "store_as": "value"}))])
    model.push(text="Units since June: 987,654, up 12.5% on last year.")
    model.push(text=f"Units since June: 987,654 (the regions sum to {units:,}).")
    page = open_page(browser, served, "eu_analyst")
    page.get_by_test_id("chat-input").fill("How many units since June?")
    page.get_by_test_id("chat-send").click()
    page.get_by_test_id("approve").click(timeout=60_000)  # run_sql asks, in this profile
    answer = page.get_by_test_id("answer").last
    expect(answer).to_contain_text("the regions sum to", timeout=120_000)
    check = page.get_by_test_id("grounding-check")
    expect(check).to_contain_text("987,654")
    expect(check).to_contain_text("12.5%")
    expect(answer).to_have_attribute("data-grounded", "false")
    marks = answer.get_by_test_id("ungrounded-number")
    expect(marks).to_have_count(1)
    expect(marks).to_have_text("987,654")
    expect(page.get_by_test_id("ungrounded")).to_contain_text("987,654")
    # The sum of the regions is the tool's own number: not marked.
    assert f"{units:,}" not in marks.all_inner_texts()
    sid = page.evaluate("() => sessionStorage.getItem('dataref.session')")
    listed = served.api("eu_analyst", "GET", "/agent/sessions")["sessions"]
    assert [s["ungrounded"] for s in listed if s["id"] == sid] == [1], listed
    page.get_by_test_id("new-chat").click()
    page.locator(f"[data-testid=session-item][data-id={sid}]").click()
    expect(page.get_by_test_id("grounding-check")).to_contain_text("12.5%")
    again = page.get_by_test_id("answer").last
    expect(again.get_by_test_id("ungrounded-number")).to_have_text("987,654")
    assert not page.errors, page.errors
    page.context.close()
