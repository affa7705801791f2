"""What the browser tests need besides pytest: a static server for a folder, Chromium through
playwright (both from site_scripts/chromium.py, which the print edition shares), and `check_page`,
which loads one page and lists everything wrong with it."""

import re
import shutil
from urllib.parse import urlsplit

from site_scripts import chromium as _chromium
from site_scripts.chromium import HOST, NOTE_UNCAUGHT, chromium, playwright_error, serve  # noqa: F401 (the tests' names)

TIMEOUT_MS = 15_000  # for one page to typeset its formulas, draw its diagrams and load its images


def fault_path(name):
    """Where a copy of a page with the fault `name` goes: beside the site's own pages in model/,
    so that its relative links work."""
    return f"model/fault-{re.sub(r'[^a-z]+', '-', name.lower())}/"


def plant_faults(site, folder, faults):
    """A copy of the built `site` in `folder`, plus fault_path(name)/index.html (beside a copy of the
    page's pictures) for each name: (page's path under the site, its text to replace once, the
    replacement) of `faults`."""
    shutil.copytree(site, folder)
    for name, (page_html, old, new) in faults.items():
        original = (site / page_html).read_text()
        if old not in original:
            raise ValueError(f"{page_html} does not hold {old!r}: the fault {name!r} cannot be planted")
        path = folder / fault_path(name) / "index.html"
        # The page's folder comes along: its pictures are addressed relative to the page.
        shutil.copytree((site / page_html).parent, path.parent)
        path.write_text(original.replace(old, new, 1))
    return folder


def watch(page):
    """A list that fills with what goes wrong while `page` loads: console errors, uncaught
    exceptions, failed requests, error responses, and any request to a host other than ours."""
    seen = []

    def on_request(request):
        parts = urlsplit(request.url)
        if parts.scheme in ("http", "https", "ws", "wss") and parts.hostname != HOST:
            seen.append(f"request to another host: {request.url}")

    page.on("request", on_request)
    page.on("console", lambda m: seen.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: seen.append(f"uncaught exception: {e}"))
    page.on("requestfailed", lambda r: seen.append(f"request failed ({r.failure}): {r.url}"))
    page.on("response", lambda r: seen.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)
    page.add_init_script(NOTE_UNCAUGHT)
    return seen


# Each problem of the rendered page as a line of text.
RENDERING_PROBLEMS = """() => {
  const problems = [];
  const shown = e => !e.closest("details:not([open])");  // a folded formula has no width
  for (const e of document.querySelectorAll(".arithmatex")) {
    const math = e.querySelector("mjx-container");
    const items = window.MathJax?.startup?.document?.getMathItemsWithin?.(e) || [];
    const tex = (items.length ? items[0].math : e.textContent).trim().slice(0, 80) || "(empty)";
    const error = e.querySelector("mjx-merror");
    if (!math) problems.push(`formula not typeset: ${tex}`);
    else if (error) problems.push(`formula with a MathJax error (${error.dataset.mjxError}): ${tex}`);
    else if (math.querySelector('[style*="color: red"]')) problems.push(`formula with red error text: ${tex}`);
    else if (shown(e) && math.getBoundingClientRect().width === 0) problems.push(`formula of zero width: ${tex}`);
  }
  for (const img of document.images)
    if (img.naturalWidth === 0) problems.push(`image not loaded: ${img.src}`);
  for (const pre of document.querySelectorAll("pre.mermaid"))
    problems.push(`mermaid diagram not drawn: ${pre.textContent.trim().split("\\n")[0]}`);
  for (const d of document.querySelectorAll("div.mermaid"))
    if (d.getBoundingClientRect().height === 0) problems.push("mermaid diagram of zero height");
  return problems;
}"""


def settle(page, url, wait_until="load"):
    """Load `url` and wait until its formulas are typeset, its diagrams drawn and its images loaded
    (site_scripts/chromium.py); [] or the one problem that kept it from settling."""
    return _chromium.settle(page, url, TIMEOUT_MS, wait_until)


def check_page(page, url):
    """Load `url` in `page` (a fresh one: it keeps listening) and return every problem found
    on it, as lines of text; [] when all is well."""
    seen = watch(page)
    seen += settle(page, url, wait_until="networkidle")  # to see what the page requests after its load
    return list(dict.fromkeys(seen + page.evaluate(RENDERING_PROBLEMS)))  # each once, in order


# Where a followed link landed: the element named by location.hash, the text of what it shows
# (a code line: the line's span; otherwise the element), the element after it, and whether the
# reader sees it (its left edge, halfway down, is not under the sticky header or off screen).
LANDED = """() => {
  const target = document.getElementById(decodeURIComponent(location.hash.slice(1)));
  if (!target) return null;
  const shown = target.id.startsWith("__codelineno-") ? target.parentElement : target;
  const box = shown.getBoundingClientRect();
  const hit = document.elementFromPoint(box.left + 2, box.top + box.height / 2);
  return {hash: location.hash, path: location.pathname, tag: target.tagName, text: shown.textContent,
          next: target.nextElementSibling?.outerHTML.slice(0, 200) || "",
          visible: Boolean(hit && shown.contains(hit)), top: Math.round(box.top),
          seen: hit ? `${hit.tagName.toLowerCase()}.${[...hit.classList].join(".")}` : "nothing"};
}"""


# True once nothing on the page has scrolled for 200 ms: neither the page (polled at every frame) nor any
# element in it, such as a code block brought into view sideways (a listener hears every scroll event; it is put
# in place by the first call in a window, which outlives Material's instant navigation). Called with true, it
# starts the 200 ms anew: a scroll that an action is about to cause is heard only at the next frame.
STILL = """(restart) => {
  const now = performance.now();
  if (!window.__stillHeard) {
    window.__stillHeard = true;
    document.addEventListener("scroll", () => { window.__stillSince = performance.now(); }, true);
  }
  if (restart || window.__lastScrollY !== scrollY) { window.__lastScrollY = scrollY; window.__stillSince = now; }
  return now - window.__stillSince > 200;
}"""


def follow(page, link, fragment, keyboard=False):
    """Click `link` (a locator; or focus it and press Enter), wait until the page shows the element
    `#fragment` and has stopped scrolling (Material scrolls more than once), and return LANDED's
    account of where it landed (None when no element has that id)."""
    if keyboard:
        link.focus()
        page.keyboard.press("Enter")
    else:
        link.click()
    try:
        page.wait_for_function(f"h => location.hash === h && ({LANDED})()?.visible", arg=f"#{fragment}",
                               timeout=5_000)
    except playwright_error():  # a timeout: LANDED below says what is wrong
        pass
    page.wait_for_function(STILL, timeout=5_000)
    return page.evaluate(LANDED)


# Mermaid draws into a closed shadow root, which no selector can enter. Run before the page's
# own scripts, this makes every shadow root open, so that the drawn diagram's links can be found
# and clicked like any other element; nothing else about the drawing changes.
OPEN_SHADOW_ROOTS = """{
  const attach = Element.prototype.attachShadow;
  Element.prototype.attachShadow = function (init) { return attach.call(this, {...init, mode: "open"}); };
}"""
