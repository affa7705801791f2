"""The print edition (site_scripts/print_edition.py): the PDF of the whole site numbers every declared equation,
every equation on the site cites it, and a citation names the page where the PDF shows that equation, as
the PDF's own text (its contents and the equation's printed number) says, not as the build's reading of
its named destinations says."""

import os
import re
import shutil

import pytest

from site_scripts import equations, print_edition, print_gather, print_pdf, print_readback, registry
from sitebuild import html_of

CITATION = re.compile(r'<span class="print-citation" data-eq="([a-z0-9-]+)">Print edition: '
                      r'<a href="([^"#]+)#page=(\d+)">Section (\d+\.\d+), Eq\. (\d+), p\. (\d+)</a></span>')
SAMPLE = 12  # citations checked against the PDF's text (each needs two of its pages extracted)


@pytest.fixture(scope="module")
def printed_site(built_site):
    """The built site, which must hold its print edition unless the tests were told to build it without."""
    if os.environ.get(print_edition.SKIP_ENV) == "0":
        pytest.skip(f"{print_edition.SKIP_ENV}=0: the site was built without its print edition")
    return built_site


@pytest.fixture(scope="module")
def pdf(printed_site):
    return (printed_site / print_edition.PDF).read_bytes()


@pytest.fixture(scope="module")
def citations(printed_site):
    """Every citation on the built pages: equation id -> (section, number, page), and the pages that hold each."""
    found, where = {}, {}
    for page in registry.PAGES:
        for eq_id, link, linked_page, section, number, cited_page in CITATION.findall(html_of(printed_site, page.path)):
            assert linked_page == cited_page, (eq_id, "the link opens another page than the one cited")
            assert link.endswith("print/transformer.pdf"), link
            found[eq_id] = (section, int(number), int(cited_page))
            where.setdefault(eq_id, []).append(page.path)
    return found, where


MOST_PAGES = 250  # the print edition is the reading path; the evidence stays on the site


def test_the_print_edition_is_lean(pdf):
    """The evidence blocks stay on the site: the PDF holds the reading path, in at most MOST_PAGES pages."""
    import io

    from pypdf import PdfReader

    pages = len(PdfReader(io.BytesIO(pdf)).pages)
    assert 0 < pages <= MOST_PAGES, f"the print edition has {pages} pages"


def test_the_pdf_numbers_at_least_every_declared_equation(pdf):
    reading = print_readback.read(pdf)
    declared = [eq.id for eq in equations.all_equations()]
    assert len(reading.citations) >= len(declared)
    assert sorted(reading.citations) == sorted(declared)
    assert sorted(c.number for c in reading.citations.values()) == list(range(1, len(declared) + 1))


def test_the_citations_on_the_pages_are_what_the_pdf_reads_back(pdf, citations):
    """A build reads the citations back from the PDF once per print and keeps them beside it
    (build/print/<mode>/citations.json); what the pages cite is what reading the PDF they link gives now."""
    found, _ = citations
    assert found == {eq_id: (c.section, c.number, c.page) for eq_id, c in print_readback.read(pdf).citations.items()}


def test_the_citations_kept_beside_a_cached_print_are_the_ones_read_back(pdf, tmp_path):
    """A build that finds its print cached cites from citations.json instead of reading the PDF again: what
    it stores and reads back is what the PDF reads back, entry for entry (the test above sees this only when
    the test build found a cached print)."""
    read_back = print_readback.read(pdf).citations
    print_edition.store_citations(tmp_path, read_back)
    assert print_edition.stored_citations(tmp_path) == read_back


def test_every_equation_on_the_site_cites_the_print_edition_once(printed_site, citations):
    found, where = citations
    shown = {}
    for page in registry.PAGES:
        for eq_id in re.findall(r'\bid="eq-([a-z0-9-]+)"', html_of(printed_site, page.path)):
            shown[eq_id] = page.path
    assert shown and set(found) == set(shown), sorted(set(found) ^ set(shown))
    assert all(where[eq_id] == [shown[eq_id]] for eq_id in shown)


def contents_text(pdf, first=2):
    """The text of the contents, which start on page `first` and end with the list of equations' line."""
    texts = []
    for page in range(first, first + 5):
        texts.append(print_readback.page_texts(pdf, [page])[page])
        if "List of equations" in texts[-1]:
            return "\n".join(texts)
    raise AssertionError(f"no contents end within pages {first} to {first + 4}")


def toc_sections(contents_text):
    """The contents page's sections in order: (number, first page)."""
    return [(m[1], int(m[2])) for m in re.finditer(r"^(\d+\.\d+) .*? (\d+)$", contents_text, flags=re.M)]


def citation_problems(texts, toc, eq_id, section, number, page):
    """Why the citation (Section `section`, Eq. `number`, p. `page`) does not name the place of equation
    `eq_id` in a PDF whose pages' texts are `texts` and whose contents list the sections `toc`; "" if it does."""
    if f"\n({number})\n" not in f"\n{texts[page]}\n":  # the number printed beside the formula, on a line of its own
        return f"{eq_id}: p. {page} does not show the equation number ({number})"
    starts = dict(toc)
    later = [first for _, first in toc if first > starts.get(section, 10**9)]
    if section not in starts or not starts[section] <= page < min(later, default=10**9):
        return f"{eq_id}: p. {page} is not in Section {section} as the contents list it"
    return ""


def test_a_sample_of_citations_lands_on_the_page_that_shows_the_equation(pdf, citations):
    """And the negative control: each citation moved one page later, or to the next section, fails."""
    found, _ = citations
    ordered = sorted(found, key=lambda eq_id: found[eq_id][1])
    sample = ordered[::max(1, len(ordered) // SAMPLE)]
    pages = {found[eq][2] + shift for eq in sample for shift in (0, 1)}
    texts = print_readback.page_texts(pdf, sorted(pages))
    toc = toc_sections(contents_text(pdf))
    assert len(toc) == sum(1 for _, number in print_gather.numbered_pages() if number)
    for eq_id in sample:
        section, number, page = found[eq_id]
        assert citation_problems(texts, toc, eq_id, section, number, page) == ""
        assert "does not show" in citation_problems(texts, toc, eq_id, section, number, page + 1)
        following = toc[[s for s, _ in toc].index(section) + 1][0] if section != toc[-1][0] else toc[0][0]
        assert "is not in Section" in citation_problems(texts, toc, eq_id, following, number, page)


def test_the_footer_of_every_page_links_to_the_pdf(printed_site):
    for page in registry.PAGES:
        link = "../" * print_gather.page_dir(page.path).count("/") + print_edition.PDF
        assert f'<a href="{link}">Print edition (PDF)</a>' in html_of(printed_site, page.path), page.path


def test_what_varies_from_print_to_print_is_replaced_in_place():
    stamped = (b"%PDF\n/CreationDate (D:20261202161050+00'00')\n/ModDate (D:20261202161051+00'00')\n"
               b"/ID (node00000907) /Headers [(node00000903)] /ID (node00000903)\nxref 42")
    fixed = print_pdf.normalised(stamped)
    assert len(fixed) == len(stamped) and b"2026" not in fixed and fixed.endswith(b"xref 42")
    assert b"/ID (node00000001) /Headers [(node00000000)] /ID (node00000000)" in fixed


def test_an_equation_above_every_section_is_refused():
    place = print_readback.Place
    outline = [(1, "1.1 Tokenizer", place(3, -700.0))]
    assert print_readback.cite({"eqno-a": place(3, -500.0)}, outline)["a"] == print_readback.Citation("1.1", 1, 3)
    with pytest.raises(RuntimeError, match="equation b .* stands under no numbered section"):
        print_readback.cite({"eqno-b": place(2, -100.0)}, outline)


@pytest.mark.slow
def test_printing_the_same_site_again_gives_the_same_pdf_byte_for_byte(printed_site, built_mode, pdf, tmp_path):
    """A fresh print (no cache) of the built site, its citations emptied again as they were when it was
    printed, is the PDF the build made, byte for byte (about two minutes)."""
    from mkdocs.config import load_config

    from site_scripts.common import ROOT
    from site_scripts.print_document import NAME

    site = tmp_path / "site"
    shutil.copytree(printed_site, site)
    for path in site.rglob("index.html"):
        path.write_text(re.sub(r'(<span class="print-citation" data-eq="[a-z0-9-]+">).*?</a></span>', r"\1</span>",
                               path.read_text()))
    (site / NAME).write_text(print_edition.edition_page(site, load_config(str(ROOT / "mkdocs.yml"))))
    guess = {name: str(place.page) for name, place in print_readback.read(pdf).places.items()}
    again, _ = print_pdf.print_site(site, guess)
    assert again == pdf


def test_a_page_left_out_of_print_keeps_its_title_and_opening_paragraph():
    text = '<h1 id="api">API</h1>\n<p>What the site has here.</p>\n<h2>Model</h2><p>Long reference.</p>'
    assert print_gather.opening(text) == '<h1 id="api">API</h1><p>What the site has here.</p>'
    with pytest.raises(RuntimeError, match="needs a title and an opening paragraph"):
        print_gather.opening("<h2>No title</h2>")
    assert [p.id for p in registry.PAGES if not p.printed] == ["find_the_bug", "api"]  # puzzles, and docstrings
