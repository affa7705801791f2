"""What every page of a built site shows, as a list a change can be compared against: each page's
sections (heading level, id and text), tables (their header rows) and the files served beside it (its
figures, and data its scripts read).

    python -m tools.page_inventory site                 # print the inventory of site/ as JSON
    python -m tools.page_inventory site --check FILE    # exit 1 if a section or table of FILE is gone
    python -m tools.page_inventory site --write FILE    # record the inventory (after a wanted change)

The site tests compare the site they read with tests/site/page_inventory-<mode>.json (one per build
mode: the experiments' tables name their run lengths), so a refactor of the machinery cannot drop a
section or a table unnoticed. Numbers are not part of it: they change with the code, and the
fragments' own tests and the rebuild check them.
"""

import argparse
import json
import sys
from html.parser import HTMLParser
from pathlib import Path

HEADINGS = ("h1", "h2", "h3", "h4")


class _Page(HTMLParser):
    """Collects the headings and the tables' header rows of the article (not the theme's navigation)."""

    def __init__(self):
        super().__init__()
        self.sections, self.tables, self.images = [], [], []
        self._in_article = 0
        self._heading = None  # [tag, id, text] while inside one
        self._header = None  # header cells of the table being read
        self._cell = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "article":
            self._in_article += 1
        if not self._in_article:
            return
        if tag == "img" and attrs.get("src") and not attrs["src"].startswith(("data:", "http:", "https:")):
            self.images.append(attrs["src"])  # a figure the page shows, wherever it is served
        if tag in HEADINGS:
            self._heading = [tag, attrs.get("id", ""), ""]
        elif tag == "table":
            self._header = []
        elif tag == "th" and self._header is not None:
            self._cell = ""
        elif tag == "a" and self._heading and "headerlink" in (attrs.get("class") or ""):
            self._heading.append("skip")  # the permalink's ¶ is not part of the title

    def handle_endtag(self, tag):
        if tag == "article":
            self._in_article -= 1
        elif tag in HEADINGS and self._heading:
            level, anchor, text = self._heading[:3]
            self.sections.append(f"{level} #{anchor} {' '.join(text.split())}")
            self._heading = None
        elif tag == "a" and self._heading and self._heading[-1] == "skip":
            self._heading.pop()
        elif tag == "th" and self._cell is not None:
            self._header.append(" ".join(self._cell.split()))
            self._cell = None
        elif tag == "thead" and self._header is not None:
            self.tables.append(" | ".join(self._header))
            self._header = None

    def handle_data(self, data):
        if self._heading and self._heading[-1] != "skip":
            self._heading[2] += data
        if self._cell is not None:
            self._cell += data


KINDS = ("sections", "tables", "files")


def pages(site: Path):
    """(page's URL path, its HTML, the files beside it) for every page of a built site, in order (the assets'
    pages left out)."""
    for html in sorted(site.rglob("index.html")):
        if "assets" not in html.relative_to(site).parts:
            beside = sorted(p.name for p in html.parent.iterdir() if p.is_file() and p.name != "index.html")
            yield html.parent.relative_to(site).as_posix() + "/", html.read_text(encoding="utf-8"), beside


def inventory(site: Path):
    """{page's URL path: {"sections": [...], "tables": [...], "files": [...]}} for every page of a built site; its
    files are those beside it and the images its article shows (by their path from the page)."""
    out = {}
    for page, text, beside in pages(site):
        parser = _Page()
        parser.feed(text)
        files = sorted(set(beside) | set(parser.images))
        out[page] = {"sections": parser.sections, "tables": parser.tables, "files": files}
    return out


def missing(recorded, now):
    """What `recorded` lists that `now` lacks: pages, sections, tables (a table counted as often as it stands) and
    files."""
    gone = []
    for page, was in recorded.items():
        if page not in now:
            gone.append(f"{page}: the whole page")
            continue
        for kind in KINDS:
            left = list(now[page].get(kind, []))
            for item in was.get(kind, []):
                if item in left:
                    left.remove(item)
                else:
                    gone.append(f"{page}: {kind[:-1]} {item!r}")
    return gone


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site", type=Path, help="a built site (the folder mkdocs build wrote)")
    parser.add_argument("--check", type=Path, help="a recorded inventory that must still hold")
    parser.add_argument("--write", type=Path, help="record the inventory here")
    args = parser.parse_args(argv)
    if not (args.site / "index.html").exists():
        print(f"error: {args.site} is not a built site (no index.html)", file=sys.stderr)
        return 2
    now = inventory(args.site)
    if args.write:
        args.write.write_text(json.dumps(now, indent=1, ensure_ascii=False) + "\n")
    if args.check:
        gone = missing(json.loads(args.check.read_text()), now)
        for line in gone:
            print(f"missing: {line}")
        print(f"{len(gone)} sections, tables or files of {args.check} missing from {args.site}")
        return 1 if gone else 0
    if not args.write:
        print(json.dumps(now, indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
