"""Compare what two built sites say: the text of every page's article (not the theme's navigation), line by line.

    python -m tools.site_diff SITE_A SITE_B

Two builds of one commit, in the same mode (full or SITE_QUICK=1), from the locked packages, should print the
same tensors, losses, gradient gaps, counts and checks, character for character; what may differ is what
was measured with a clock or a memory counter (times, rates, peaks) and the sentences that report those.
This prints, for each page whose text differs, the differing lines of each site (text of figures drawn
inline, such as axis labels, included; PNG figures and the PDF not compared), and a summary.
Exit status 0 when every page reads the same, 1 when some page differs, 2 when a folder is not a built site.
"""

import argparse
import difflib
import sys
from html.parser import HTMLParser
from pathlib import Path


from tools.page_inventory import pages

SKIPPED = ("script", "style")  # their text is code, not what the page says
# Tags that start a line of their own, so that neighbouring cells, items or figure labels never run together.
BLOCKS = {"p", "div", "li", "tr", "td", "th", "pre", "h1", "h2", "h3", "h4", "h5", "h6", "text", "br", "table",
          "figcaption", "summary", "details", "blockquote", "dt", "dd"}


class _Article(HTMLParser):
    """The text inside <article>, one line per line of the page's text, blank lines dropped."""

    def __init__(self):
        super().__init__()
        self.text, self._article, self._skipping = [], 0, 0

    def handle_starttag(self, tag, attrs):
        self._article += tag == "article"
        self._skipping += tag in SKIPPED
        if tag in BLOCKS:
            self.text.append("\n")

    def handle_endtag(self, tag):
        self._article = max(0, self._article - (tag == "article"))  # a stray </article> ends nothing
        self._skipping = max(0, self._skipping - (tag in SKIPPED))
        if tag in BLOCKS:
            self.text.append("\n")

    def handle_data(self, data):
        if self._article > 0 and not self._skipping:
            self.text.append(data)

    def lines(self):
        return [" ".join(line.split()) for line in "".join(self.text).splitlines() if line.strip()]


def page_texts(site: Path):
    """{page's URL path: [lines of its article's text]} of a built site."""
    out = {}
    for page, text, _ in pages(site):
        parser = _Article()
        parser.feed(text)
        out[page] = parser.lines()
    return out


def differences(a, b):
    """{page: [(line of a or None, line of b or None)]} for every page whose lines differ, and pages only one has."""
    out = {}
    for page in sorted(set(a) | set(b)):
        if page not in a or page not in b:
            out[page] = [("(no such page)" if page not in a else "(the page)", "(no such page)" if page not in b
                          else "(the page)")]
            continue
        changed = []
        for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a[page], b[page], autojunk=False).get_opcodes():
            if tag != "equal":
                left, right = a[page][i1:i2], b[page][j1:j2]
                changed += [(left[k] if k < len(left) else None, right[k] if k < len(right) else None)
                            for k in range(max(len(left), len(right)))]
        if changed:
            out[page] = changed
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site_a", type=Path, help="a built site (the folder mkdocs build wrote)")
    parser.add_argument("site_b", type=Path, help="another build of it")
    args = parser.parse_args(argv)
    for site in (args.site_a, args.site_b):
        if not (site / "index.html").exists():
            print(f"error: {site} is not a built site (no index.html)", file=sys.stderr)
            return 2
    a, b = page_texts(args.site_a), page_texts(args.site_b)
    found = differences(a, b)
    for page, lines in found.items():
        print(f"{page}: {len(lines)} line(s) differ")
        for left, right in lines:
            print(f"  - {left if left is not None else '(nothing)'}")
            print(f"  + {right if right is not None else '(nothing)'}")
    pages = len(set(a) | set(b))
    print(f"{pages - len(found)} of {pages} pages read the same; {len(found)} differ")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
