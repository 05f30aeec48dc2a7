"""The page on a real `dataref demo` run: the demo asks its question through the agent loop
(the scripted analyst: no model endpoint is configured) and stores the session; `dataref web`
on the same home, as the demo's principal, shows that session in Debian's Chromium (driven by
Playwright, no browser download): the question, the steps the analyst took, the chart, the
answer the demo printed, and the fetched table opened in the grid beside the chat.

Its screenshot is the docs' picture of the page: `target/browser-screenshots/page-demo.png`
always, and docs/page.png too when DATAREF_UPDATE_DOCS is set (as the docs' generated
reference pages are refreshed).

The demo's home is fresh for each run (so the page lists the demo's session alone) and lives
under `target/tmp/`, not pytest's private temporary directory: `run_python`'s sandboxed jobs
run as uid 65534 when run as root, which must be able to enter the home's job directories and
its Python runtime (installed into the fresh home by the demo, from pip's usual sources).

Run by `scripts/test`, which installs Chromium, builds the binary and sets DATAREF_BIN.
DATAREF_PAGE_FROM_SOURCE=1 serves `/` from crates/dataref-mcp/ui/view.html as it is now
(intercepted in the browser, with the policy the server would send for it) instead of the
copy the binary embeds, to try an edit of the page without a rebuild.
"""

import os
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

from page_support import page_from_source, wait_ready

BIN = os.environ.get("DATAREF_BIN")
CHROMIUM = os.environ.get("DATAREF_CHROMIUM", "/usr/bin/chromium")
ROOT = Path(__file__).resolve().parents[2]
# Where the end-to-end tests keep data dirs that sandboxed jobs enter (searchable by others).
HOMES = ROOT / "target" / "tmp"
SHOTS = ROOT / "target" / "browser-screenshots"
DOCS_SHOT = ROOT / "docs" / "page.png"
PAGE_FROM_SOURCE = os.environ.get("DATAREF_PAGE_FROM_SOURCE") == "1"
# Set (to anything) writes docs/page.png, as `check_generated` in crates/dataref/tests/it/docs.rs.
UPDATE_DOCS = os.environ.get("DATAREF_UPDATE_DOCS") is not None
# `dataref demo` stores its run as this principal ("a demo principal of its own", demo.rs).
PRINCIPAL = "demo"
# What the scripted analyst calls, in order (crates/dataref-agent/src/scripted.rs).
STEPS = ["fetch_sales", "run_python", "render_chart", "export_data"]

pytestmark = pytest.mark.timeout(900)


def clean_env():
    """The environment without anything that would change the demo or the server: no
    DATAREF_* (a home, a config, a principal, a model endpoint: without DATAREF_LLM_URL the
    demo's agent is the scripted analyst) and no other model settings."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("DATAREF_", "OPENAI_", "ANTHROPIC_")) and "LLM" not in k}


class Demo:
    """What `dataref demo` printed about its agent run."""

    def __init__(self, stdout):
        agent = stdout[stdout.index("\nthe agent: "):]
        self.question = re.search(r"^question: (.+)$", agent, re.M).group(1)
        # `  fetch_sales → ok: data_… · 48210 rows (167 ms)`, one line per step.
        self.steps = re.findall(r"^  (\w+) → (\w+): (.*) \(\d+ ms\)$", agent, re.M)
        fetched = next(s for s in self.steps if s[0] == "fetch_sales")[2]
        m = re.match(r"(data_[A-Za-z0-9_-]{22}) · (\d+) rows", fetched)
        assert m, f"the demo's fetch_sales step: {fetched!r}"
        self.sales, self.rows = m.group(1), int(m.group(2))
        self.answer = re.search(r"^answer:\n(.*?)\n\n\| turn ", agent, re.M | re.S).group(1)
        self.session = re.search(r"^session (s-\S+) ", agent, re.M).group(1)


def run_demo(home, env):
    done = subprocess.run([BIN, "demo", "--home", str(home)], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, (
        f"`dataref demo` exited with {done.returncode}\n--- stdout\n{done.stdout[-4000:]}"
        f"\n--- stderr\n{done.stderr[-4000:]}")
    assert "model: scripted (no model endpoint configured)" in done.stdout, (
        "the demo's agent is the scripted analyst when no model endpoint is configured\n"
        + done.stdout[-2000:])
    return Demo(done.stdout)


def start_web(home, env):
    """`dataref web` on the demo's home as its principal: the page's address and token (a
    token for this run, printed on stderr with the address) and the process."""
    server = subprocess.Popen(
        [BIN, "web", "--home", str(home), "--principal", PRINCIPAL],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=env)
    lines, found = [], None
    for line in server.stdout:
        lines.append(line)
        found = re.search(r"open (http://\S+)/#token=(\S+)", line)
        if found:
            break
    if not found:
        server.kill()
        server.wait(timeout=30)
        raise AssertionError("`dataref web` printed no address to open:\n" + "".join(lines))
    threading.Thread(target=lambda: [None for _ in server.stdout], daemon=True).start()
    return found.group(1), found.group(2), server


def answer_lines(text):
    """The answer's lines as the page shows its Markdown: a list item without its `- `."""
    return [re.sub(r"^- ", "", ln.strip()) for ln in text.splitlines() if ln.strip()]


def fresh_home():
    """A new data dir under target/tmp that uid 65534 can enter (see the module's docs)."""
    HOMES.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="page-demo-", dir=HOMES))
    home.chmod(0o755)
    for p in [home, *home.parents]:
        assert os.stat(p).st_mode & 0o001, (
            f"{p} must be searchable by others: run_python's jobs run as uid 65534")
    return home


def test_the_page_shows_the_demos_session_with_its_chart_and_the_fetched_table():
    assert BIN and Path(BIN).is_file(), (
        f"DATAREF_BIN must name the dataref binary (scripts/test sets it); got {BIN!r}")
    assert Path(CHROMIUM).exists(), f"no Chromium at {CHROMIUM} (scripts/test installs it)"
    home = fresh_home()
    try:
        show_the_demo(home)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def show_the_demo(home):
    env = clean_env()
    demo = run_demo(home, env)
    assert [s[0] for s in demo.steps] == STEPS, demo.steps
    assert all(outcome == "ok" for _, outcome, _ in demo.steps), demo.steps
    assert demo.rows > 0 and "lost the most revenue" in demo.answer, demo.answer

    base, token, server = start_web(home, env)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
                "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync",
            ])
            try:
                context = browser.new_context(viewport={"width": 1280, "height": 900})
                if PAGE_FROM_SOURCE:
                    body, headers = page_from_source()
                    context.route(f"{base}/", lambda route: route.fulfill(
                        status=200, headers=headers, body=body))
                page = context.new_page()
                errors = []
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.on("console", lambda m: m.type == "error" and errors.append(m.text))
                page.goto(f"{base}/#token={token}")
                wait_ready(page)
                check_page(page, demo)
                assert not errors, errors
                SHOTS.mkdir(parents=True, exist_ok=True)
                shot = SHOTS / "page-demo.png"
                page.screenshot(path=str(shot))
                if UPDATE_DOCS:
                    shutil.copyfile(shot, DOCS_SHOT)
            finally:
                browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)


def check_page(page, demo):
    # The demo's session is the principal's one session; a click shows it.
    item = page.locator(f"[data-testid=session-item][data-id='{demo.session}']")
    expect(item).to_be_visible(timeout=30_000)
    expect(page.get_by_test_id("session-item")).to_have_count(1)
    item.click()
    expect(item).to_have_class(re.compile(r"\bactive\b"))

    # The question, then each step the analyst took, in order, each done.
    expect(page.locator(".msg-user")).to_have_text(demo.question, timeout=30_000)
    steps = page.get_by_test_id("tool-step")
    expect(steps).to_have_count(len(STEPS), timeout=30_000)
    assert steps.evaluate_all("s => s.map((n) => n.getAttribute('data-tool'))") == STEPS
    for tool in STEPS:
        step = page.locator(f"[data-testid=tool-step][data-tool={tool}]")
        expect(step).to_have_attribute("data-outcome", "ok")
        expect(step.locator(".tool-name")).to_have_text(tool)
    # fetch_sales' step names the table the demo fetched.
    fetch = page.locator("[data-testid=tool-step][data-tool=fetch_sales]")
    expect(fetch).to_contain_text(demo.sales)

    # The answer the demo printed, line by line (its list rendered as a list).
    answer = page.get_by_test_id("answer")
    expect(answer).to_have_count(1)
    for line in answer_lines(demo.answer):
        expect(answer).to_contain_text(line)
    expect(answer.locator("li")).to_have_count(
        sum(1 for ln in demo.answer.splitlines() if ln.startswith("- ")))

    # The chart render_chart made, drawn from its points: the ten biggest losers as bars.
    chart = page.locator("[data-testid=tool-step][data-tool=render_chart] "
                         "[data-testid=chart][data-kind=bar]")
    expect(chart).to_be_visible(timeout=60_000)
    expect(chart.locator("rect.bar")).to_have_count(10, timeout=60_000)

    # The fetched table opens in the grid beside the chat, all its rows counted.
    fetch.get_by_test_id("open-table").click()
    grid = page.get_by_test_id("grid")
    expect(grid).to_have_attribute("data-ref", demo.sales, timeout=30_000)
    status = page.get_by_test_id("grid-status")
    expect(status).to_contain_text(f"of {demo.rows:,}", timeout=60_000)
    expect(page.locator("tbody tr").first).to_be_visible()

    # The picture: the chat from the chart's step to the end of the answer, the grid beside it.
    page.locator("[data-testid=tool-step][data-tool=render_chart]").evaluate(
        "(n) => n.scrollIntoView({block: 'start'})")
    expect(chart).to_be_in_viewport(ratio=0.99)
    expect(answer).to_be_in_viewport(ratio=0.99)
