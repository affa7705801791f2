"""The print edition's one HTML document, gathered from the built site in the navigation's order.

Each page's article (its content, without the theme's header, navigation or footer) becomes a section:
the n-th page of the m-th navigation section is Section m.n, its own headings are numbered below it
(m.n.k, m.n.k.j), and a page outside any section (Home) opens the book unnumbered. Every equation that
site_scripts/equations.py finds in the prose gets the next number, printed beside it. Links between pages
become links inside the document, ids are made unique by the page's id, collapsed blocks are opened and
code listings carry their line numbers inside each line, so a long line wraps under its number. A page's evidence
(the block that site_scripts/anatomy.py folds at its end: symbols, code, checks) is left out, and a link to what it
held keeps its words without its target: the print edition is the reading path, the site has the evidence.

The numbers written here are the document's; the citations on the site are read back from the printed
PDF (site_scripts/print_readback.py), not from here.
"""

import html
import re
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

from . import registry
from .profile import without_profile

ARTICLE = re.compile(r'<article class="md-content__inner md-typeset">(.*?)</article>', re.S)
HEADING = re.compile(r"<h([1-6])([^>]*)>(.*?)</h\1>", re.S)
PAGE_REF = "000"  # the placeholder of a page number, as wide as the numbers that replace it
# Mermaid draws its shapes' outlines through rough.js, which samples them at random points unless given a
# seed: two prints of one diagram would differ in every curve.
MERMAID_SEED = '%%{init: {"handDrawnSeed": 1}}%%'


@dataclass(frozen=True)
class Section:
    """A page of the site as a section of the print edition."""
    page: str  # its id in site_scripts/registry.py
    number: str  # "1.4"; "" for a page outside the navigation's sections
    title: str  # its first heading, as printed
    chapter: str  # its navigation section; "" for none


@dataclass(frozen=True)
class Numbered:
    """An equation as the print edition numbers it."""
    id: str
    number: int
    page: str


@dataclass(frozen=True)
class Edition:
    html: str
    sections: list
    equations: list


def page_anchor(page):
    return f"p-{page}"


def chapter_anchor(number):
    return f"c-{number.split('.')[0]}"


def equation_anchor(eq_id):
    """The id of an equation's number in print, which the list of equations links to."""
    return f"eqno-{eq_id}"


def page_dir(md_path):
    """Where mkdocs serves a page: model/x.md -> model/x/, index.md -> ""."""
    folder, _, name = md_path.rpartition("/")
    return (f"{folder}/" if folder else "") if name == "index.md" else md_path[:-3] + "/"


def numbered_pages():
    """(page, its section number) in the navigation's order: m.n within the m-th section, "" outside one."""
    chapters, out = [], []
    for page in registry.PAGES:
        if not page.section:
            out.append((page, ""))
            continue
        if page.section not in chapters:
            chapters.append(page.section)
        count = sum(1 for p, _ in out if p.section == page.section) + 1
        out.append((page, f"{len(chapters)}.{count}"))
    return out


def article(site, page):
    found = ARTICLE.search((site / page_dir(page.path) / "index.html").read_text())
    if not found:
        raise RuntimeError(f"print edition: {page_dir(page.path)}index.html has no article")
    return found.group(1)


def opening(text):
    """A page that is not printed: its title and first paragraph, which say what the site has there."""
    title = re.search(r"<h1\b.*?</h1>", text, flags=re.S)
    first = re.search(r"<p\b.*?</p>", text, flags=re.S)
    if not title or not first:
        raise RuntimeError("print edition: a page left out of print needs a title and an opening paragraph")
    return title.group(0) + first.group(0)


def plain(fragment):
    return html.unescape(re.sub(r"<[^>]+>", "", fragment)).strip()


class Rewriter:
    """Makes one page's article fit in the one document: unique ids, links between pages turned into
    links inside it, asset paths relative to the site's root (where the document is served)."""

    def __init__(self, page, pages, site_url):
        self.page, self.site_url = page, site_url
        self.dir = page_dir(page.path)
        self.where = {page_dir(p.path): p.id for p in pages}  # a page's folder on the site -> its id

    def anchor(self, fragment, page=None):
        page = page or self.page.id
        return f"{page}--{fragment}" if fragment else page_anchor(page)

    def href(self, url):
        """The link as the document holds it; None where it has no place in a PDF (a file of the site
        when the site's address is unknown)."""
        if urlsplit(url).scheme or url.startswith("//"):
            return url
        if url.startswith("#"):
            return "#" + self.anchor(url[1:])
        parts = urlsplit(urljoin("http://site/" + self.dir, url))
        path = parts.path.lstrip("/").removesuffix("index.html")
        if path in self.where:
            return "#" + self.anchor(parts.fragment, self.where[path])
        return urljoin(self.site_url, path) + (f"#{parts.fragment}" if parts.fragment else "") if self.site_url else None

    def src(self, url):
        if urlsplit(url).scheme or url.startswith("//"):
            return url
        return urlsplit(urljoin("http://site/" + self.dir, url)).path.lstrip("/")

    def rewrite(self, text):
        text = re.sub(r'(?<=\s)(id|name|for)="([^"]+)"', lambda m: f'{m[1]}="{self.anchor(m[2])}"', text)
        text = re.sub(r'(?<=\s)src="([^"]+)"', lambda m: f'src="{self.src(m[1])}"', text)
        text = re.sub(r'click (\S+) href "([^"]+)"',
                      lambda m: f'click {m[1]} href "{self.href(m[2]) or "#"}"', text)  # a mermaid diagram's links

        def link(m):
            target = self.href(html.unescape(m[1]))
            return f'href="{html.escape(target)}"' if target is not None else ""
        return re.sub(r'(?<=\s)href="([^"]*)"', link, text)


def without_evidence(text):
    """The article without its evidence blocks (`<details class="... evidence ...">`, with the blocks inside)."""
    while (start := text.find('<details class="abstract evidence"')) >= 0:
        depth, at = 0, start
        for tag in re.finditer(r"<(/?)details\b", text[start:]):
            depth += -1 if tag[1] else 1
            if depth == 0:
                at = start + tag.end()
                break
        text = text[:start] + text[text.index(">", at) + 1:]
    return text


def unlinked_where_gone(document):
    """A link to an id that the document no longer has (it was in an evidence block) keeps its words only."""
    ids = set(re.findall(r'\bid="([^"]+)"', document))
    return re.sub(r'<a\b[^>]*?\shref="#([^"]+)"[^>]*>(.*?)</a>', lambda m: m[0] if m[1] in ids else m[2],
                  document, flags=re.S)


def strip_for_print(text):
    """Without the evidence, the build's profile, the edit button and the headings' permalinks, with every other collapsed block
    open, the diagrams drawn from a fixed seed, and each code line carrying its number (the separate column of
    numbers is dropped: a wrapped line would leave it)."""
    text = without_evidence(text)
    text = without_profile(text)  # this build's timings: on the site only
    text = re.sub(r'<a [^>]*class="md-content__button[^"]*"[^>]*>.*?</a>', "", text, flags=re.S)
    text = re.sub(r'<a class="headerlink"[^>]*>.*?</a>', "", text, flags=re.S)
    text = re.sub(r"<details( [^>]*)?>", lambda m: f"<details{m[1] or ''} open>", text)
    text = text.replace('<pre class="mermaid"><code>', f'<pre class="mermaid"><code>{MERMAID_SEED}\n')
    text = re.sub(r'<td class="linenos">.*?</td>', "", text, flags=re.S)
    return re.sub(r'(<span id="__span-[^"]*-(\d+)">)<a id="(__codelineno-[^"]*)"[^>]*></a>',
                  r'\1<a id="\3"></a><span class="print-lineno">\2</span>', text)  # (a line's link to itself dropped)


def number_equations(text, page, start):
    """The (rewritten) article with each declared equation's display wrapped beside its number, from `start`
    on; returns it and the Numbered equations, in order."""
    found = []

    def one(m):
        eq_id = m["id"]
        found.append(Numbered(eq_id, start + len(found), page))
        number = f'<span class="print-eq-number" id="{equation_anchor(eq_id)}">({found[-1].number})</span>'
        return f'{m["anchor"]}<div class="print-equation">{m["math"]}{number}</div>'
    pattern = (rf'(?P<anchor><(?P<tag>h[2-6]|p) id="{re.escape(page)}--eq-(?P<id>[a-z0-9-]+)">.*?</(?P=tag)>\s*)'
               r'(?P<math><div class="arithmatex">.*?</div>)')
    text = re.sub(pattern, one, text, flags=re.S)
    if len(found) != text.count(f'id="{page}--eq-'):
        raise RuntimeError(f"print edition: on the {page} page an equation's anchor is not followed by its formula")
    return text, found


def number_headings(text, number):
    """Headings one level deeper (the page's title becomes a section of its chapter), numbered `number`.k.j
    down to the page's third level; returns the text and the page's title."""
    counts, title = [0, 0], None

    def one(m):
        nonlocal title
        level, attrs, inner = int(m[1]), m[2], m[3]
        label = ""
        if level == 1:
            title, label = plain(inner), number
        elif level <= 3 and number:
            counts[level - 2] += 1
            if level == 2:
                counts[1] = 0
            label = ".".join([number, *map(str, counts[:level - 1])])
        label = f'<span class="print-number">{label}</span> ' if label else ""
        return f"<h{min(level + 1, 6)}{attrs}>{label}{inner}</h{min(level + 1, 6)}>"
    return HEADING.sub(one, text), title


def gather(site, equation_ids, site_url=None):
    """The Edition of the built site in folder `site`: every nav page, its headings and the equations of
    `equation_ids` numbered; an equation the pages do not show (or show but do not declare) is an error."""
    sections, equations, body, chapter = [], [], [], None
    for page, number in numbered_pages():
        if page.section and page.section != chapter:
            chapter = page.section
            body.append(f'<h1 class="print-chapter" id="{chapter_anchor(number)}"><span class="print-number">'
                        f'{number.split(".")[0]}</span> {html.escape(chapter)}</h1>')
        text = Rewriter(page, registry.PAGES, site_url).rewrite(strip_for_print(
            article(site, page) if page.printed else opening(article(site, page))))
        text, found = number_equations(text, page.id, len(equations) + 1)
        text, title = number_headings(text, number)
        equations += found
        sections.append(Section(page.id, number, title or page.title, page.section))
        body.append(f'<section class="print-page" id="{page_anchor(page.id)}">{text}</section>')
    shown = [eq.id for eq in equations]
    if sorted(shown) != sorted(equation_ids):
        raise RuntimeError("print edition: the pages show equations " + ", ".join(sorted(set(shown) ^ set(equation_ids)))
                           + " that site_scripts/equations.py does not declare, or not the ones it does")
    return Edition(unlinked_where_gone("\n".join(body)), sections, equations)
