"""What the printed PDF says, read back with pypdf: where each named place landed, and from that each
equation's citation (Section S, Eq. N, p. P).

Chromium makes a named destination of every element that a link inside the document points to (the
contents point to every chapter and section, the list of equations to every equation's number), and an
outline (bookmarks) of the headings. An equation's page P is the page of its number's destination; its
number N is its rank among the equations' destinations in reading order (page, then from the top); its
section S is the number of the last section heading of the outline ("1.4 LayerNorm") above it.
"""

import io
import re
from dataclasses import dataclass

EQUATION = "eqno-"  # the prefix of an equation number's id (site_scripts/print_gather.py)
SECTION_TITLE = re.compile(r"^(\d+\.\d+)\s")  # an outline entry of a page-level section: "1.4 LayerNorm"


@dataclass(frozen=True, order=True)
class Place:
    page: int  # counted from 1, as the footer prints it
    down: float  # how far down the page (minus the PDF's y, which grows upwards): sorts in reading order


@dataclass(frozen=True)
class Citation:
    section: str
    number: int
    page: int

    def text(self):
        return f"Section {self.section}, Eq. {self.number}, p. {self.page}"


@dataclass(frozen=True)
class Reading:
    pages: int
    places: dict  # named destination -> Place
    outline: list  # (depth, title, Place), in the outline's order
    citations: dict  # equation id -> Citation


def _place(reader, destination):
    return Place(reader.get_destination_page_number(destination) + 1, -float(destination.top or 0))


def _outline(reader, items, depth=0):
    out = []
    for item in items:
        if isinstance(item, list):
            out += _outline(reader, item, depth + 1)
        else:
            out.append((depth, item.title, _place(reader, item)))
    return out


def cite(places, outline):
    """Each equation's Citation from the places of the equations' numbers and the outline."""
    sections = sorted((place, m.group(1)) for _, title, place in outline if (m := SECTION_TITLE.match(title)))
    equations = sorted((place, name[len(EQUATION):]) for name, place in places.items() if name.startswith(EQUATION))
    citations = {}
    for number, (place, eq_id) in enumerate(equations, 1):
        above = [section for where, section in sections if where <= place]
        if not above:
            raise RuntimeError(f"print edition: equation {eq_id} (p. {place.page}) stands under no numbered section")
        citations[eq_id] = Citation(above[-1], number, place.page)
    return citations


def read(pdf_bytes):
    """The Reading of a PDF's bytes."""
    from pypdf import PdfReader  # imported here: only the print edition needs it

    reader = PdfReader(io.BytesIO(pdf_bytes))
    places = {name.lstrip("/"): _place(reader, d) for name, d in reader.named_destinations.items()}
    outline = _outline(reader, reader.outline)
    return Reading(len(reader.pages), places, outline, cite(places, outline))


def page_texts(pdf_bytes, pages):
    """The text pypdf extracts from each of `pages` (counted from 1), as {page: text}."""
    from pypdf import PdfReader

    reader = PdfReader(io.BytesIO(pdf_bytes))
    return {p: reader.pages[p - 1].extract_text() for p in pages}
