"""Printing the print edition's page (site_scripts/print_document.py) to PDF with headless Chromium.

Chromium loads the page from the built site, served on 127.0.0.1; once MathJax has typeset every formula
and mermaid has drawn every diagram, display formulas and tables wider than the page are scaled down to
fit, and the page is printed. The page numbers of the contents and of the list of equations are read back
from that print (site_scripts/print_readback.py), written in, and the page printed again, until a print
shows the numbers it holds (a number's box is as wide as its placeholder, so this takes two prints).
"""

import re
import time

from . import chromium, print_readback
from .print_document import NAME

TIMEOUT_MS = 180_000  # for the whole site to typeset its formulas and draw its diagrams, on 2 busy cores
ROUNDS = 4  # prints before giving up on page numbers that keep moving
PDF_OPTIONS = dict(
    format="A4", print_background=True, outline=True, tagged=True, display_header_footer=True,
    margin={"top": "16mm", "bottom": "18mm", "left": "16mm", "right": "16mm"},
    header_template="<span></span>",
    footer_template='<div style="width:100%;text-align:center;font-size:8pt;color:#555">'
                    '<span class="pageNumber"></span></div>',
)

# What keeps the page from printing as the site shows it: formulas MathJax did not typeset or could not
# read, diagrams mermaid did not draw, images that did not load.
PROBLEMS = """() => {
  const problems = [];
  for (const e of document.querySelectorAll(".arithmatex"))
    if (!e.querySelector("mjx-container")) problems.push(`formula not typeset: ${e.textContent.trim().slice(0, 60)}`);
  for (const e of document.querySelectorAll("mjx-merror")) problems.push(`MathJax error: ${e.dataset.mjxError}`);
  for (const pre of document.querySelectorAll("pre.mermaid"))
    problems.push(`diagram not drawn: ${pre.textContent.trim().split("\\n")[0]}`);
  for (const img of document.images) if (img.naturalWidth === 0) problems.push(`image not loaded: ${img.src}`);
  return problems;
}"""

# Scale down what is wider than the text (a long formula, a table of many columns) so that print does not
# cut it off; CSS zoom, unlike a transform, also shrinks the room it takes.
FIT_WIDTH = """() => {
  for (const e of document.querySelectorAll(".print-equation .arithmatex, .md-typeset__table, .mermaid")) {
    const room = e.parentElement.clientWidth - (e.nextElementSibling?.offsetWidth || 0);
    if (e.scrollWidth > room) e.style.zoom = Math.max(0.45, room / e.scrollWidth);
  }
}"""

PAGE_REFS = "() => Object.fromEntries([...document.querySelectorAll('.print-page-ref')].map(e => [e.dataset.target, e.textContent]))"
FILL = """pages => { for (const e of document.querySelectorAll(".print-page-ref")) e.textContent = pages[e.dataset.target]; }"""


def settle(page, url):
    """Load the page and wait until it is drawn; a script that throws stops the wait at once."""
    seen = []
    page.on("pageerror", lambda e: seen.append(f"uncaught exception: {e}"))
    page.on("requestfailed", lambda r: seen.append(f"request failed: {r.url}"))
    page.add_init_script(chromium.NOTE_UNCAUGHT)
    page.goto(url, timeout=TIMEOUT_MS)
    try:
        page.wait_for_function(f"() => window.__uncaught || ({chromium.SETTLED})()", timeout=TIMEOUT_MS)
        if not seen:
            page.evaluate(chromium.TYPESET)
    except chromium.playwright_error() as e:  # a timeout
        seen.append(f"not drawn after {TIMEOUT_MS} ms: {str(e).splitlines()[0]}")
    seen += page.evaluate(PROBLEMS)
    if seen:
        raise RuntimeError("print edition: the page did not render:\n  " + "\n  ".join(seen[:10]))


def numbered(page, guess, log):
    """Print until the page numbers the page shows are the pages its places landed on, starting from
    `guess` (target -> page, from an earlier print; one print when it is right); returns the PDF's bytes
    and its Reading."""
    shown = page.evaluate(PAGE_REFS)
    page.evaluate(FILL, {target: guess.get(target, shown[target]) for target in shown})
    for _ in range(ROUNDS):
        pdf = page.pdf(**PDF_OPTIONS)
        reading = print_readback.read(pdf)
        shown = page.evaluate(PAGE_REFS)
        missing = sorted(set(shown) - set(reading.places))
        if missing:
            raise RuntimeError(f"print edition: no place in the PDF for {', '.join(missing[:5])}")
        landed = {target: str(reading.places[target].page) for target in shown}
        if landed == shown:
            return pdf, reading
        log(f"print edition: {sum(landed[t] != shown[t] for t in shown)} page numbers to fill in; printing again")
        page.evaluate(FILL, landed)
    raise RuntimeError(f"print edition: the page numbers still moved after {ROUNDS} prints")


def print_site(site, guess, log=print):
    """Print site/NAME (served from `site`), its page numbers first guessed as `guess`; returns the PDF's
    bytes and its Reading."""
    started = time.perf_counter()
    with chromium.serve(site) as url, chromium.chromium() as browser:
        page = browser.new_page(color_scheme="light")
        settle(page, url + NAME)
        page.evaluate(FIT_WIDTH)
        log(f"print edition: rendered in {time.perf_counter() - started:.1f} s")
        pdf, reading = numbered(page, guess, log)
    log(f"print edition: {reading.pages} pages, printed in {time.perf_counter() - started:.1f} s in all")
    return normalised(pdf), reading


DATES = re.compile(rb"/(CreationDate|ModDate) \(D:\d{14}[^)]*\)")
NODE_ID = re.compile(rb"\(node(\d{8})\)")  # a tagged element's ID (a table cell's, which its row's /Headers name)


def normalised(pdf, date=b"D:20000101000000+00'00'"):
    """The PDF with what Chromium writes differently each time replaced in place, by values of the same length
    (the cross-reference table counts bytes): the dates (the time of printing) by a fixed one, and the tagged
    elements' IDs (the browser's own numbers for the page's nodes, which depend on what asked for one before)
    by their rank, which keeps their order (the ID tree is sorted by them). Two prints of one page are then
    the same bytes."""
    def one_date(m):
        new = b"/" + m.group(1) + b" (" + date + b")"
        if len(new) != len(m.group(0)):
            raise RuntimeError(f"print edition: unexpected date format {m.group(0)!r}")
        return new
    rank = {old: b"%08d" % i for i, old in enumerate(sorted(set(NODE_ID.findall(pdf))))}
    pdf = NODE_ID.sub(lambda m: b"(node" + rank[m.group(1)] + b")", pdf)
    return DATES.sub(one_date, pdf)
