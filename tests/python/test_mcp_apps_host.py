"""MCP Apps end to end: a small test host page (`tests/mcp-apps-host/`) built on the
extension's official package (`@modelcontextprotocol/ext-apps`, its AppBridge) and the
official MCP client loads dataref's view (`ui://dataref/view`) in a sandboxed iframe and
renders a chart from a real `render_chart` result, in Debian's Chromium driven by Playwright.

- the real `dataref serve --http` with a bearer token made by `dataref token new`, the
  built-in sample's data (served through a config, as the other tests do);
- the artifact: `fetch_sales` called here over HTTP; the host itself calls `render_chart` on
  it, reads the view, mounts it (`sandbox="allow-scripts"`, `srcdoc`), hands it the tool
  input and result through the bridge, and forwards its `tools/call` of the app-only
  `view_chart` to dataref;
- the host page is served here from another loopback port, a different origin from
  dataref's, which the config names in `[http] allowed_origins`. dataref sends no CORS
  headers, so a browser cannot read its answers across origins; like a real web host's
  backend, the page's own server relays `/relay/mcp` to dataref's `/mcp`, unchanged
  (Authorization and Origin included), so dataref still judges the page's Origin.

The host bundle is built with npm (`npm ci`, `npm run build`) when it is missing or older
than its sources. The screenshot goes to `target/browser-screenshots/mcp-apps-host.png`.
Run by `scripts/test`, which builds the binary and sets DATAREF_BIN.
"""

import http.client
import json
import os
import re
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

BIN = os.environ.get("DATAREF_BIN")
CHROMIUM = os.environ.get("DATAREF_CHROMIUM", "/usr/bin/chromium")
ROOT = Path(__file__).resolve().parents[2]
HOST_DIR = ROOT / "tests" / "mcp-apps-host"
BUNDLE = HOST_DIR / "dist" / "host.bundle.js"
SHOT = ROOT / "target" / "browser-screenshots" / "mcp-apps-host.png"
UI = "io.modelcontextprotocol/ui"
APP_ONLY = {"view_rows", "view_chart", "view_artifacts", "view_files", "view_download"}

pytestmark = pytest.mark.timeout(300)


def build_host():
    """`npm ci` + `npm run build` when the bundle is missing or older than its sources."""
    sources = [HOST_DIR / n for n in ("host.js", "package.json", "package-lock.json")]
    if BUNDLE.exists() and BUNDLE.stat().st_mtime >= max(s.stat().st_mtime for s in sources):
        return
    for cmd in (["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                ["npm", "run", "--silent", "build"]):
        done = subprocess.run(cmd, cwd=HOST_DIR, capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}"
    assert BUNDLE.exists(), "npm run build made no dist/host.bundle.js"


def new_token(name):
    out = subprocess.run([BIN, "token", "new", name], capture_output=True, text=True, check=True)
    token = re.search(r"^token: (\S+)$", out.stdout, re.M).group(1)
    digest = re.search(r'^token_sha256 = \["([0-9a-f]{64})"\]$', out.stdout, re.M).group(1)
    return token, digest


# Headers of one hop only (RFC 9110 §7.6.1), and those the relay sets itself.
HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding",
       "upgrade", "host", "content-length", "accept-encoding"}


class HostSite(ThreadingHTTPServer):
    """The host page's origin: `tests/mcp-apps-host/` as static files, and `/relay/mcp`
    passed through to dataref (answers streamed as they come, for SSE)."""

    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), HostHandler)
        self.upstream = None  # (host, port) of dataref, set once it runs
        self.origins = []  # the Origin header of every relayed request
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def origin(self):
        return f"http://127.0.0.1:{self.server_address[1]}"

    def close(self):
        self.shutdown()
        self.server_close()


class HostHandler(SimpleHTTPRequestHandler):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, directory=str(HOST_DIR), **kwargs)

    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.path.startswith("/relay/"):
            return self.relay()
        return super().do_GET()

    def do_POST(self):
        self.relay()

    def do_DELETE(self):
        self.relay()

    def relay(self):
        if not self.path.startswith("/relay/mcp"):
            self.send_error(404)
            return
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
        if self.headers.get("Origin"):
            self.server.origins.append(self.headers["Origin"])
        host, port = self.server.upstream
        up = http.client.HTTPConnection(host, port, timeout=120)
        try:
            up.request(self.command, self.path[len("/relay"):], body=body, headers=headers)
            resp = up.getresponse()
            self.send_response(resp.status)
            for k, v in resp.getheaders():
                if k.lower() not in HOP:
                    self.send_header(k, v)
            self.send_header("Connection", "close")
            self.end_headers()
            while chunk := resp.read1(65536):
                self.wfile.write(chunk)
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, TimeoutError, OSError):
            pass
        finally:
            up.close()
            self.close_connection = True


def mcp_call(base, token, tool, arguments):
    """One stateless MCP `tools/call` (2026-07-28, declaring the UI extension): the result."""
    body = json.dumps({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": tool, "arguments": arguments, "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "0"},
            "io.modelcontextprotocol/clientCapabilities": {
                "extensions": {UI: {"mimeTypes": ["text/html;profile=mcp-app"]}}},
        }},
    }).encode()
    req = urllib.request.Request(f"{base}/mcp", data=body, method="POST", headers={
        "Authorization": f"Bearer {token}",
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "tools/call",
        "Mcp-Name": tool,
    })
    with urllib.request.urlopen(req, timeout=120) as r:
        text = r.read().decode()
    if text.lstrip().startswith("{"):
        msg = json.loads(text)
    else:
        msg = next(json.loads(line[5:]) for line in text.splitlines()
                   if line.startswith("data:") and line[5:].strip())
    assert "result" in msg, msg
    assert not msg["result"].get("isError"), msg
    return msg["result"]


@pytest.fixture
def site():
    s = HostSite()
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def served(tmp_path, site):
    """(base URL, token) of a running `dataref serve --http` that allows the site's origin."""
    assert BIN, "DATAREF_BIN must name the dataref binary (scripts/test sets it)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DATAREF_")}
    home = tmp_path / "home"
    made = subprocess.run([BIN, "serve", "--home", str(home), "--rows", "2000"],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env,
                          timeout=60)
    db = home / "sample" / "sales-2000.sqlite"
    assert db.exists(), made.stderr
    token, digest = new_token("eu_analyst")
    config = tmp_path / "dataref.toml"
    config.write_text(f"""
[python]
enabled = false

[http]
allowed_origins = ["{site.origin}"]

[sources.sample]
kind = "sqlite"
path = "{db}"

[queries.sales]
source = "sample"
description = "Load sales on or after a date."
sql = "SELECT date, line, region, channel, units, revenue, discount FROM sales WHERE date >= :since ORDER BY date, id"
params.since = {{ type = "date", required = true }}

[principals.eu_analyst]
token_sha256 = ["{digest}"]
""")
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
        u = urllib.parse.urlsplit(base)
        site.upstream = (u.hostname, u.port)
        yield base, token
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_host_renders_a_chart_of_a_real_render_chart_result(served, site):
    started = time.monotonic()
    build_host()
    base, token = served
    assert BUNDLE.exists()
    assert Path(CHROMIUM).exists(), f"no Chromium at {CHROMIUM} (scripts/test installs it)"

    # The artifact, and the points the view will be given for it (the same tool it calls).
    fetched = mcp_call(base, token, "fetch_sales", {"since": "2020-01-01"})["structuredContent"]
    ref = fetched["dataRef"]
    row_cells = {v for row in fetched["sample"] for v in row if isinstance(v, str) and len(v) > 3}
    assert row_cells, fetched
    args = {"dataRef": ref, "x": "region", "y": "revenue", "kind": "bar"}
    spec = mcp_call(base, token, "view_chart", args)["structuredContent"]
    categories = spec["categories"]
    assert len(categories) >= 3, spec
    bars = len(categories) * len(spec["series"])

    query = urllib.parse.urlencode({
        "mcp": f"{site.origin}/relay/mcp", "token": token,
        "tool": "render_chart", "args": json.dumps(args),
    })
    console, page_errors, failed = [], [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
        ])
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
            page.on("pageerror", lambda e: page_errors.append(str(e)))
            page.on("response", lambda r: r.status >= 400 and failed.append(f"{r.status} {r.url}"))
            page.goto(f"{site.origin}/host.html?{query}")

            def host_state():
                return page.evaluate("() => window.__host")

            try:
                page.wait_for_selector("iframe[data-testid=view-frame]", timeout=60_000)
                frame_el = page.query_selector("iframe[data-testid=view-frame]")
                frame = frame_el.content_frame()
                assert frame is not None
                # Polled with `evaluate` of a function: the view's policy (the host's
                # restrictive default) refuses `eval`, which `wait_for_function` uses to
                # poll a predicate.
                deadline = time.monotonic() + 90
                while not frame.evaluate(
                        "() => !!(window.__dataref && window.__dataref.shown === 'chart'"
                        " && document.querySelector('svg[data-testid=chart][data-kind=bar]'))"):
                    assert time.monotonic() < deadline, "the view never drew the chart"
                    page.wait_for_timeout(100)
                page.wait_for_function("() => window.__host.state === 'result sent'",
                                       timeout=30_000)
            except Exception as e:
                raise AssertionError(
                    f"{e}\nhost: {json.dumps(host_state(), indent=1)[:6000]}\n"
                    f"console: {console}\npage errors: {page_errors}\nfailed: {failed}") from e

            host = host_state()
            assert host["error"] is None, host["error"]

            # The frame: sandboxed without same-origin, the view's document from srcdoc.
            assert frame_el.get_attribute("sandbox") == "allow-scripts"
            assert frame_el.get_attribute("srcdoc")
            assert frame.evaluate("() => self.origin") == "null"
            assert frame.evaluate("() => window.parent !== window")

            # The chart: one bar per category of the real view_chart answer.
            drawn = frame.locator("svg[data-testid=chart][data-kind=bar] rect.bar").count()
            assert drawn == bars == len(categories), (drawn, spec)
            svg_text = frame.locator("svg[data-testid=chart]").text_content()
            for c in categories:
                assert c in svg_text, (c, svg_text)

            # The handshake and the bridge: the view initialized, and got its points from
            # view_chart, called through the host with render_chart's arguments.
            assert host["appInfo"] and host["appInfo"]["name"], host
            traffic = host["traffic"]
            assert traffic[0] == ["view", "ui/initialize"], traffic
            answer = next(m for who, m in traffic if who == "host")
            assert answer.startswith("response "), traffic  # the host's first: the answer
            ready = traffic.index(["view", "ui/notifications/initialized"])
            told = [m for who, m in traffic if who == "host" and not m.startswith("response ")]
            first_told = next(i for i, (who, m) in enumerate(traffic)
                              if who == "host" and not m.startswith("response "))
            assert first_told > ready, traffic  # nothing sent before `initialized`
            assert told[:2] == ["ui/notifications/tool-input", "ui/notifications/tool-result"], traffic
            assert host["refused"] == [], host["refused"]
            charts = [c for c in host["viewCalls"] if c["name"] == "view_chart"]
            assert charts, host["viewCalls"]
            assert {k: charts[-1]["arguments"].get(k) for k in args} == args, charts
            got = charts[-1]["result"]["structuredContent"]
            assert got["categories"] == categories and got["kind"] == "bar", got

            # What dataref told the host: the view, its tools kept from the model, the origin.
            assert host["resourceUri"] == "ui://dataref/view"
            assert "connect-src 'none'" in host["csp"], host["csp"]
            assert APP_ONLY <= set(host["appOnlyTools"]), host["appOnlyTools"]
            assert not APP_ONLY & set(host["modelTools"]), host["modelTools"]
            assert {"render_chart", "fetch_sales"} <= set(host["modelTools"]), host["modelTools"]
            assert site.origins and set(site.origins) == {site.origin}, site.origins

            SHOT.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SHOT), full_page=True)
        finally:
            browser.close()

    # What a model may see of render_chart's result (its content, and the small
    # structuredContent some hosts pass on) stays short: no rows, no points.
    result = host["toolResult"]
    assert not result.get("isError"), result
    assert result["structuredContent"]["points"] == len(categories), result
    model_text = json.dumps(result["content"]) + json.dumps(result["structuredContent"])
    assert len(model_text) < 2000, model_text
    for cell in sorted(row_cells | set(categories)):
        assert cell not in model_text, (cell, model_text)
    assert "series" not in model_text and "categories" not in model_text, model_text
    assert not page_errors, page_errors
    assert not failed, failed
    print(f"mcp-apps host test: {time.monotonic() - started:.1f}s; console: {console}")


def grid_in_host(page, site, query):
    """The host page with `query`, once the view in its frame shows a grid: the frame."""
    page.goto(f"{site.origin}/host.html?{query}")
    page.wait_for_selector("iframe[data-testid=view-frame]", timeout=60_000)
    frame = page.query_selector("iframe[data-testid=view-frame]").content_frame()
    deadline = time.monotonic() + 90
    while not frame.evaluate("() => !!(window.__dataref && window.__dataref.shown === 'grid')"):
        assert time.monotonic() < deadline, "the view never showed the grid"
        page.wait_for_timeout(100)
    return frame


def test_host_shows_render_tables_rows_as_it_chose_them(served, site):
    """render_table's `limit` and `sort` hold in the view: its grid shows the rows the tool
    showed the person, not the whole table."""
    build_host()
    base, token = served
    ref = mcp_call(base, token, "fetch_sales", {"since": "2020-01-01"})["structuredContent"]["dataRef"]
    args = {"dataRef": ref, "sort": "units", "descending": True, "limit": 7}
    query = urllib.parse.urlencode({
        "mcp": f"{site.origin}/relay/mcp", "token": token,
        "tool": "render_table", "args": json.dumps(args),
    })
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
        ])
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            frame = grid_in_host(page, site, query)
            rows = frame.locator("table[data-testid=grid] tbody tr")
            assert rows.count() == 7, rows.count()
            status = frame.locator("[data-testid=grid-status]").text_content()
            assert "the first 7 shown" in status, status
            assert frame.locator("[data-testid=grid-next]").is_disabled()
            units = frame.locator("th[data-column=units]")
            assert units.get_attribute("data-sort") == "desc"
            col = [h.get_attribute("data-column")
                   for h in frame.locator("th[data-column]").all()].index("units")
            shown = [int(r.locator("td").nth(col + 1).text_content().replace(",", ""))
                     for r in rows.all()]
            assert shown == sorted(shown, reverse=True) and shown[0] == 40, shown

            # A download of what the grid shows (filtered to EMEA, by units descending)
            # goes to the host through `ui/download-file`: the file, given whole.
            frame.locator("input[data-testid=grid-filter][data-column=region]").fill("EMEA")
            deadline = time.monotonic() + 30
            while not frame.evaluate(
                    "() => { const r = [...document.querySelectorAll("
                    "'table[data-testid=grid] tbody tr')]; return r.length > 0"
                    " && r.every((x) => x.textContent.includes('EMEA')); }"):
                assert time.monotonic() < deadline, "the filter never applied"
                page.wait_for_timeout(100)
            page.wait_for_timeout(500)
            frame.locator("[data-testid=download-csv]").click()
            deadline = time.monotonic() + 60
            while not page.evaluate("() => window.__host.downloads.length"):
                assert time.monotonic() < deadline, frame.locator("body").text_content()[-500:]
                page.wait_for_timeout(100)
            [[item]] = page.evaluate("() => window.__host.downloads")
            assert item["type"] == "resource" and item["mimeType"] == "text/csv", item
            assert item["uri"].startswith("dataref://downloads/") and item["uri"].endswith(".csv")
            lines = [ln for ln in item["text"].split("\r\n") if ln]
            header = lines[0].split(",")
            body = [dict(zip(header, ln.split(","))) for ln in lines[1:]]
            emea = mcp_call(base, token, "run_sql", {
                "sql": "SELECT count(*) AS n FROM s WHERE region = 'EMEA'",
                "inputs": {"s": ref}, "store_as": "value"})["structuredContent"]["values"][0][0]
            assert len(body) == emea > 7, (len(body), emea)
            assert {r["region"] for r in body} == {"EMEA"}, body[:3]
            units = [int(r["units"]) for r in body]
            assert units == sorted(units, reverse=True), units[:20]
            note = frame.locator("[data-testid=export-done]").text_content()
            assert f"{emea} rows" in note.replace(",", ""), note
        finally:
            browser.close()


def test_a_host_without_downloads_gets_a_signed_link(served, site):
    """A host that does not declare `downloadFile`: the view's CSV button saves the whole
    table in the workspace (export_data) and asks the host to open its signed link, which
    downloads the file without a token."""
    build_host()
    base, token = served
    fetched = mcp_call(base, token, "fetch_sales", {"since": "2020-01-01"})["structuredContent"]
    ref = fetched["dataRef"]
    query = urllib.parse.urlencode({
        "mcp": f"{site.origin}/relay/mcp", "token": token, "download": "0",
        "tool": "render_table", "args": json.dumps({"dataRef": ref}),
    })
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
        ])
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            frame = grid_in_host(page, site, query)
            frame.locator("[data-testid=download-csv]").click()
            deadline = time.monotonic() + 60
            while not page.evaluate("() => window.__host.links.length"):
                assert time.monotonic() < deadline, frame.locator("body").text_content()[-500:]
                page.wait_for_timeout(100)
            [url] = page.evaluate("() => window.__host.links")
            assert page.evaluate("() => window.__host.downloads") == []
        finally:
            browser.close()
    assert url.startswith(f"{base}/files/exports/") and "sig=" in url, url
    with urllib.request.urlopen(url, timeout=60) as r:
        lines = r.read().decode("utf-8-sig").splitlines()
    assert lines[0] == "date,line,region,channel,units,revenue,discount", lines[0]
    assert len(lines) - 1 == fetched["rows"], (len(lines), fetched["rows"])
