"""Check every link inside a built site: each `href` and `src`, and each link of
a mermaid diagram, that stays on the site must name a file that exists and,
with a `#fragment`, an element of that file with that id (or name), or for a PDF
(the print edition) `#page=N` with N one of its pages. Links to
other hosts are skipped, but nothing a page loads (a script, a stylesheet, an
image, an icon) may come from one: the site works offline. Other schemes
(mailto:, data:) are not checked.

mkdocs --strict checks the links written in markdown; this reads the HTML that
came out, so it also covers what the theme, mkdocstrings, the notebooks and
the raw HTML of the code listings add.

    python -m tools.linkcheck [SITE_DIR]    # default: site/; exit 1 on any problem
"""

import argparse
import posixpath
import re
import sys
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

LINK_ATTRS = {"href", "src"}
LOADED_RELS = {"stylesheet", "icon", "preload", "modulepreload", "manifest", "prefetch", "preconnect", "dns-prefetch"}


MERMAID_CLICK = re.compile(r'^\s*click\s+\S+\s+href\s+"([^"]+)"', flags=re.M)


class _Page(HTMLParser):
    """The ids (and names) of one HTML file, and every link it holds as (how it is written, URL):
    the href and src attributes, and the `click ... href "URL"` lines of mermaid diagrams (the
    browser draws them into links)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids, self.links, self.remote_assets = set(), [], []
        self.mermaid = None  # the source of the mermaid diagram being read

    def handle_data(self, data):
        if self.mermaid is not None:
            self.mermaid += data

    def handle_endtag(self, tag):
        if tag == "pre" and self.mermaid is not None:
            self.links += [(f'mermaid click href "{url}"', url) for url in MERMAID_CLICK.findall(self.mermaid)]
            self.mermaid = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for key in ("id", "name"):
            if attrs.get(key):
                self.ids.add(attrs[key])
        if tag == "pre" and "mermaid" in (attrs.get("class") or "").split():
            self.mermaid = ""
        for key in sorted(LINK_ATTRS & attrs.keys()):
            url = attrs[key] or ""
            self.links.append((f'<{tag} {key}="{url}">', url))
            if is_remote(url) and loaded_by_browser(tag, key, attrs):
                self.remote_assets.append(url)


def loaded_by_browser(tag, attr, attrs):
    """Whether the browser fetches this URL to show the page (a script, image, stylesheet, icon ...),
    rather than only when the reader follows it."""
    return attr == "src" or tag == "link" and bool(LOADED_RELS & set((attrs.get("rel") or "").lower().split()))


def is_remote(url):
    """On another host: http://host/..., https://host/... or //host/..."""
    return bool(urlsplit(url).netloc)


def is_local(url):
    """A path on this site: no scheme and no host (a mailto: or data: URL is neither)."""
    parts = urlsplit(url)
    return not (parts.scheme or parts.netloc)


def parse(path):
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    page.close()
    return page


def target_of(site, page_rel, url):
    """The file a site-internal URL of the page `page_rel` (posix path under site) points at, and its fragment."""
    parts = urlsplit(url)
    path = unquote(parts.path)
    if not path:
        joined = page_rel
    elif path.startswith("/"):
        joined = path.lstrip("/")
    else:
        joined = posixpath.normpath(posixpath.join(posixpath.dirname(page_rel), path))
    target = site / joined
    if path.endswith("/") or target.is_dir():
        target = target / "index.html"
    return target, unquote(parts.fragment)


def pdf_has(path, fragment, counts):
    """Whether the PDF at `path` has the page a `page=N` fragment names (`counts` keeps each file's
    page count, read once with pypdf)."""
    if path not in counts:
        from pypdf import PdfReader  # imported here: only a site with a PDF needs it

        counts[path] = len(PdfReader(path).pages)
    number = fragment.removeprefix("page=")
    return fragment.startswith("page=") and number.isdigit() and 1 <= int(number) <= counts[path]


def check_site(site):
    """Every problem found, as 'page: link -> what is missing', in file order, a repeated one once
    with its count; [] when all resolve."""
    site = Path(site)
    pages = {p: parse(p) for p in sorted(site.rglob("*.html"))}
    problems, pdf_pages = [], {}
    for path, page in pages.items():
        rel = path.relative_to(site).as_posix()
        for url in page.remote_assets:
            problems.append(f"{rel}: loads {url} from another host (what a page loads must be served by the site)")
        for written, url in page.links:
            if not is_local(url):
                continue
            target, fragment = target_of(site, rel, url)
            shown = f"{rel}: {written}"
            if not target.resolve().is_relative_to(site.resolve()):
                problems.append(f"{shown} -> leaves the site")
            elif not target.is_file():
                problems.append(f"{shown} -> no file {target.relative_to(site).as_posix()}")
            elif fragment and target.suffix == ".html" and fragment not in pages[target].ids:
                problems.append(f"{shown} -> no id \"{fragment}\" in {target.relative_to(site).as_posix()}")
            elif fragment and target.suffix == ".pdf" and not pdf_has(target, fragment, pdf_pages):
                problems.append(f"{shown} -> no page \"{fragment}\" in {target.relative_to(site).as_posix()}")
    counts = Counter(problems)
    return [p + (f" ({counts[p]} times)" if counts[p] > 1 else "") for p in counts]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("site", nargs="?", default="site", help="the built site (default: site)")
    args = parser.parse_args(argv)
    if not (Path(args.site) / "index.html").is_file():
        parser.error(f"{args.site} holds no built site (index.html): build it with scripts/site")
    problems = check_site(args.site)
    print("\n".join(problems) or f"every internal link of {args.site} resolves")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
