"""The print edition: one PDF of the whole site (site/print/transformer.pdf), made by `mkdocs build` after the
pages are built (site_scripts/hook.py, on_post_build), and cited under every equation of the site.

1. print_gather and print_document put every page into one HTML page, sections and equations numbered;
2. print_pdf prints it with headless Chromium, filling in the contents' page numbers from a first print;
3. print_readback reads the PDF back with pypdf: each equation's section, number and page;
4. cite() writes those into the built pages, under each equation: "Print edition: Section S, Eq. N, p. P".
   The pages were gathered before, with the citations still empty, so citing cannot move a page of the PDF.

A print is kept in build/print/<mode>/ under a key of everything it shows (the page, the site's assets and
images, this code, Chromium's and pypdf's versions), so a build that changes none of it prints nothing; one
that does starts from the kept print's page numbers, and prints once more only where they moved.
SITE_PDF=0 (or `scripts/site --no-pdf`) builds the site without the PDF, its link and its citations;
`mkdocs serve` skips it too.
"""

import hashlib
import json
import os
import posixpath
import re
import shutil
import subprocess

from . import chromium, equations, print_document, print_gather, print_pdf, print_readback, registry
from .common import ROOT, mode

PDF = "print/transformer.pdf"  # under the site
SKIP_ENV = "SITE_PDF"  # SITE_PDF=0 skips the print edition
CACHE = ROOT / "build" / "print"
CODE = ["chromium.py", "print_edition.py", "print_gather.py", "print_document.py", "print_pdf.py", "print_readback.py"]
PLACEHOLDER = re.compile(r'<span class="print-citation" data-eq="([a-z0-9-]+)"></span>')


def wanted(command="build"):
    """Whether this build prints the edition: not under `mkdocs serve` (each edit would reprint it), not
    with SITE_PDF=0."""
    return command != "serve" and os.environ.get(SKIP_ENV, "1") != "0"


def placeholder(eq_id):
    """What the hook writes after an equation's 'Computed at' sentence; cite() fills it in."""
    return f' <span class="print-citation" data-eq="{eq_id}"></span>'


def key(site, page):
    """A hash of everything the print shows or depends on."""
    digest = hashlib.sha256(page.encode())
    files = sorted({*(site / "assets").rglob("*"), *(site / src for src in re.findall(r'src="([^":#?]+)"', page))})
    for path in (p for p in files if p.is_file()):
        digest.update(path.relative_to(site).as_posix().encode() + path.read_bytes())
    for name in CODE:
        digest.update((ROOT / "site_scripts" / name).read_bytes())
    from importlib.metadata import version

    browser = chromium.missing() or subprocess.run([chromium.CHROMIUM, "--version"], capture_output=True, text=True).stdout
    digest.update(f"{browser} playwright {version('playwright')} pypdf {version('pypdf')}".encode())
    return digest.hexdigest()


def printed(site, page, log):
    """The PDF's bytes and its citations, from the cache or a fresh print."""
    folder = CACHE / mode()
    digest = key(site, page)
    if (folder / "key").is_file() and (folder / "key").read_text() == digest:
        log("print edition: unchanged, the PDF is the cached one")
        return (folder / "transformer.pdf").read_bytes(), stored_citations(folder)
    problem = chromium.missing()
    if problem:
        raise RuntimeError(f"print edition: {problem}; run scripts/setup --browser, or build without the PDF: "
                           f"{SKIP_ENV}=0 (scripts/site --no-pdf)")
    guess = json.loads((folder / "pages.json").read_text()) if (folder / "pages.json").is_file() else {}
    (site / print_document.NAME).write_text(page)
    try:
        pdf, reading = print_pdf.print_site(site, guess, log)
    finally:
        (site / print_document.NAME).unlink()
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    (folder / "transformer.pdf").write_bytes(pdf)
    (folder / "pages.json").write_text(json.dumps({t: str(p.page) for t, p in reading.places.items()}, sort_keys=True))
    store_citations(folder, reading.citations)
    (folder / "key").write_text(digest)  # last: a print interrupted before this line is not a cached one
    return pdf, reading.citations


def store_citations(folder, citations):
    """Keep what pypdf read back from a print beside it: reading a PDF of 30 MB again takes seconds."""
    (folder / "citations.json").write_text(json.dumps({eq: [c.section, c.number, c.page]
                                                       for eq, c in citations.items()}, sort_keys=True))


def stored_citations(folder):
    """The citations `store_citations` kept, as Citations."""
    stored = json.loads((folder / "citations.json").read_text())
    return {eq: print_readback.Citation(*fields) for eq, fields in stored.items()}


def edition_page(site, config):
    """The print edition's HTML page, gathered from the built (and not yet cited) site in `site`."""
    declared = equations.all_equations()
    edition = print_gather.gather(site, [eq.id for eq in declared], config.get("site_url"))
    home = (site / "index.html").read_text()
    return print_document.document(edition, home, config, {eq.id: eq.title for eq in declared}, mode() == "quick")


def build(site, config, log=print):
    """Print the edition of the built site in `site`, put it at site/PDF and cite it on every page."""
    declared = equations.all_equations()
    pdf, citations = printed(site, edition_page(site, config), log)
    if sorted(citations) != sorted(eq.id for eq in declared):
        raise RuntimeError("print edition: the PDF numbers " + str(len(citations)) + " equations, the site declares "
                           + str(len(declared)))
    (site / PDF).parent.mkdir(parents=True, exist_ok=True)
    (site / PDF).write_bytes(pdf)
    cite(site, citations)


def cite(site, citations):
    """Fill every equation's placeholder on the built pages with its citation, linked to its page of the PDF."""
    cited = set()
    for page in registry.PAGES:
        folder = print_gather.page_dir(page.path)
        path = site / folder / "index.html"
        link = posixpath.relpath(PDF, folder or ".")

        def one(m):
            c = citations[m[1]]
            cited.add(m[1])
            return (f'<span class="print-citation" data-eq="{m[1]}">Print edition: '
                    f'<a href="{link}#page={c.page}">{c.text()}</a></span>')
        path.write_text(PLACEHOLDER.sub(one, path.read_text()))
    if cited != set(citations):
        raise RuntimeError(f"print edition: no place to cite equations {', '.join(sorted(set(citations) - cited))}")
