"""What the page tests share: the page made from its source file, as the server serves it,
and waiting until it is ready."""

import base64
import hashlib
import time
from pathlib import Path

VIEW_HTML = Path(__file__).resolve().parents[2] / "crates" / "dataref-mcp" / "ui" / "view.html"


def page_from_source():
    """The page as crates/dataref-http/src/page.rs serves it, made from the source file: the
    document and its headers, the policy naming its one script and one style by SHA-256."""
    html = VIEW_HTML.read_text(encoding="utf-8")

    def hashed(tag):
        open_, close = f"<{tag}>", f"</{tag}>"
        assert html.count(f"<{tag}") == 1, f"view.html must have exactly one <{tag}>"
        start = html.index(open_) + len(open_)
        text = html[start:html.index(close, start)]
        return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"

    csp = (f"default-src 'none'; script-src {hashed('script')}; style-src {hashed('style')}; "
           "img-src 'self' data: blob:; connect-src 'self'; base-uri 'none'; "
           "form-action 'none'; frame-ancestors 'none'")
    return html.encode(), {
        "Content-Type": "text/html; charset=utf-8",
        "Content-Security-Policy": csp,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-cache",
        "Cross-Origin-Opener-Policy": "same-origin",
    }


def wait_ready(page, timeout_s=60):
    """Until the page says it is ready. Polled with `evaluate` of a function: the page's
    policy refuses `eval`, which `wait_for_function` runs its predicate through."""
    deadline = time.monotonic() + timeout_s
    while not page.evaluate("() => !!(window.__dataref && window.__dataref.ready)"):
        assert time.monotonic() < deadline, "the page never became ready"
        page.wait_for_timeout(50)
