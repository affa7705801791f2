"""Headless Chromium through playwright, for the two things that need a real browser: printing the
print edition (site_scripts/print_pdf.py) and the browser tests (tests/site/browsercheck.py). Both
serve the built site on 127.0.0.1 and wait, on each page, until its formulas are typeset, its
diagrams drawn and its images loaded."""

import functools
import http.server
import os
import threading
from contextlib import contextmanager

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")  # `scripts/setup --browser` installs Debian's
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]
HOST = "127.0.0.1"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@contextmanager
def serve(folder):
    """The base URL of a static server of `folder` on 127.0.0.1 and a free port, running in a thread."""
    server = http.server.ThreadingHTTPServer((HOST, 0), functools.partial(_QuietHandler, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{HOST}:{server.server_port}/"
    finally:
        server.shutdown()
        server.server_close()


def missing():
    """Why Chromium cannot run here (playwright or the browser missing), or "" when it can."""
    from importlib.util import find_spec

    if find_spec("playwright") is None:  # found, not imported: every build asks, only a print needs it
        return "playwright is not installed"
    if not os.access(CHROMIUM, os.X_OK):
        return f"no Chromium at {CHROMIUM}"
    return ""


@contextmanager
def chromium():
    """Chromium, headless, through playwright's sync API."""
    problem = missing()
    if problem:
        raise RuntimeError(f"{problem}: run scripts/setup --browser (or set CHROMIUM to a Chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def playwright_error():
    """playwright's error class (its TimeoutError is one), imported late like playwright itself."""
    from playwright.sync_api import Error

    return Error


# Marks a page on which a script threw: SETTLED then stops waiting for diagrams (a diagram that
# failed to draw stays undrawn, and the exception is reported by whoever listens for it).
NOTE_UNCAUGHT = """
addEventListener("error", () => { window.__uncaught = true; });
addEventListener("unhandledrejection", () => { window.__uncaught = true; });
"""


# Done when MathJax has loaded, every mermaid diagram has been replaced by its drawing (or a
# script threw: see NOTE_UNCAUGHT), and every image has loaded or failed (lazy ones are made
# eager first). Then TYPESET waits for MathJax's queue: docs/assets/mathjax-config.js chains
# each typeset pass onto MathJax.startup.promise.
SETTLED = """() => {
  for (const img of document.images) img.loading = "eager";
  return Boolean(window.MathJax?.startup?.promise) && (!document.querySelector("pre.mermaid") || window.__uncaught)
    && [...document.images].every(img => img.complete);
}"""
TYPESET = """async () => {
  let promise;
  do { promise = MathJax.startup.promise; await promise; } while (promise !== MathJax.startup.promise);
}"""


def settle(page, url, timeout_ms, wait_until="load"):
    """Load `url` and wait until `wait_until` (playwright's: "load", "networkidle"), the formulas
    are typeset, the diagrams drawn and the images loaded. Returns [] or the one problem that kept
    it from settling."""
    page.goto(url, wait_until=wait_until)
    try:
        page.wait_for_function(SETTLED, timeout=timeout_ms)
        page.evaluate(TYPESET)
    except playwright_error() as e:  # a timeout
        return [f"MathJax, diagrams or images not done after {timeout_ms} ms: {str(e).splitlines()[0]}"]
    return []
