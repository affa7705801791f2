"""The site's equations are written in the docs pages' prose; this module finds them.

An equation is a `$$` block that follows either a heading with an `eq-` anchor (a headline equation,
listed in the page's contents) or a comment naming it (a step of a derivation, which may sit inside a
collapsible block, indented like it):

    ### Affine layer {#eq-linear}             <!-- eq linear-grad-x: The gradient to the input -->
                                              $$
    $$                                        \\frac{\\partial \\ell}{\\partial X} = \\ldots
    Y = X W + \\mathbf{1} b^\\top               $$
    $$

The lines of transformer/ that compute an equation carry the comment `# eq:<id>` (site_scripts/markers.py).
The build ties the two together and fails when an equation has no line or a marker names no equation; the
hook writes under each equation the links to its lines (site_scripts/hook.py).
"""

import re
from dataclasses import dataclass
from functools import lru_cache

from .common import ROOT
from .depends import read_text
from .registry import PAGES

HEADLINE = r"(?P<indent> *)#{2,6} (?P<title>[^\n]+?) \{#eq-(?P<id>[a-z0-9-]+)\}\n\n"
STEP = r"(?P<sindent> *)<!-- eq (?P<sid>[a-z0-9-]+): (?P<stitle>[^\n]+?) -->\n"
DECLARATION = re.compile(rf"^(?:{HEADLINE}|{STEP})(?P<block> *\$\$\n.*?\n *\$\$)$", re.M | re.S)
LOOSE = re.compile(r"^ *(?:#{1,6} .*\{#eq-|<!-- *eq\b)")  # a line that means to start a declaration


@dataclass(frozen=True)
class Equation:
    id: str  # the anchor eq-<id> and the marker # eq:<id>
    page: str  # the id of the page whose prose declares it (site_scripts/registry.py)
    title: str
    latex: str
    step: bool  # declared by a comment (a derivation's step), not a heading


@lru_cache(maxsize=256)
def parse(markdown, page):
    """The equations a page's markdown declares, in order; a mistyped declaration is an error. Kept per text:
    the build asks for them many times, and a page's text changes only between builds."""
    matches = list(DECLARATION.finditer(markdown))
    starts = {markdown.count("\n", 0, m.start()) for m in matches}
    for number, line in enumerate(markdown.splitlines()):
        if LOOSE.search(line) and number not in starts:
            raise RuntimeError(f"{page}: {line.strip()!r} declares no equation: write '### Title {{#eq-ID}}' or "
                             "'<!-- eq ID: Title -->', then a blank line (headings only) and a $$ block")
    return tuple(Equation(m["id"] or m["sid"], page, m["title"] or m["stitle"],
                          "\n".join(line.strip() for line in m["block"].splitlines()[1:-1]), m["sid"] is not None)
                 for m in matches)


def expand(markdown, computed_at):
    """The page's markdown with, under each equation, the sentence `computed_at(id)` (its lines of code);
    a derivation's step gets its title in bold, carrying the equation's anchor."""
    def one(m):
        if m["id"]:
            return f"{m[0]}\n\n{m['indent']}{computed_at(m['id'])}"
        indent = m["sindent"]
        return (f"{indent}**{m['stitle']}**\n{indent}{{: #eq-{m['sid']} }}\n\n{m['block']}\n\n"
                f"{indent}{computed_at(m['sid'])}")
    return DECLARATION.sub(one, markdown)


def all_equations(root=ROOT):
    """Every equation of every docs page, in the registry's page order; an id declared twice is an error."""
    found = [eq for page in PAGES if not page.notebook and (root / "docs" / page.path).exists()
             for eq in parse(read_text(root / "docs" / page.path), page.id)]
    seen = {}
    for eq in found:
        if eq.id in seen:
            raise RuntimeError(f"equation {eq.id!r} is declared twice: on the {seen[eq.id]} and {eq.page} pages")
        seen[eq.id] = eq.page
    return found


def by_id(root=ROOT):
    return {eq.id: eq for eq in all_equations(root)}


def page_equations(page, root=ROOT):
    return [eq for eq in all_equations(root) if eq.page == page]


def table_text(root=ROOT):
    """What generated pages print of the equations (their ids, pages and titles; the LaTeX only the prose
    shows), for the pages' cache keys."""
    return "\n".join(f"{eq.id} {eq.page} {eq.title}" for eq in all_equations(root))
