"""Every component page reads as a story first: measured on the built HTML, the explanation is at least half of
what a reader sees before opening the evidence, and the tiny example's first number comes in the first third."""

import re
from html.parser import HTMLParser

import pytest
from sitebuild import html_of

from site_scripts import registry

COMPONENTS = [p for p in registry.PAGES if p.functions and not p.notebook]
CHECK_COLUMNS = ("Result", "Largest gap", "Relative gap", "Passed")  # a table of checks, not of the story
EVIDENCE = ("symbols-and-tensor-shapes", "actual-implementation", "code-and-math", "gradient-check",
            "cross-check-on-devices", "where-is-it-used", "status")  # the standard sections of the evidence


class Visible(HTMLParser):
    """The article's text as a reader sees it with every folded block closed, as (kind, text) pieces in order:
    "evidence" under the headings of the standard evidence sections, "code" for code blocks, "check" for tables
    of checks, "text" for the rest; and where the tiny example starts (a character offset of that text)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.pieces, self.example_at = [], None
        self.in_article = self.in_pre = 0
        self.details = []  # for each open <details>: whether its content is folded
        self.in_summary = False
        self.table = None  # the pieces of the table being read, classified when it ends
        self.header = []
        self.section = ""  # the id of the last h2

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.in_article += tag == "article"
        if not self.in_article:
            return
        if tag == "details":
            self.details.append("open" not in attrs)
        elif tag == "summary":
            self.in_summary = True
        elif tag == "pre":
            self.in_pre += 1
        elif tag == "table":
            self.table, self.header = [], []
        if tag == "h2":
            self.section = attrs.get("id", "")
        if attrs.get("id") == "tiny-numerical-example" and self.example_at is None:
            self.example_at = len(self.text())

    def handle_endtag(self, tag):
        if tag == "article":
            self.in_article -= 1
        elif tag == "details" and self.details:
            self.details.pop()
        elif tag == "summary":
            self.in_summary = False
        elif tag == "pre":
            self.in_pre -= 1
        elif tag == "thead" and self.table is not None:
            self.header = [t for _, t in self.table]
        elif tag == "table" and self.table is not None:
            check = any(c in " ".join(self.header) for c in CHECK_COLUMNS)
            self.pieces += [("check" if check and kind == "text" else kind, t) for kind, t in self.table]
            self.table = None

    def handle_data(self, data):
        folded = any(self.details[:-1]) or (self.details and self.details[-1] and not self.in_summary)
        if not self.in_article or folded or not data.strip():
            return
        kind = "evidence" if self.section in EVIDENCE else "code" if self.in_pre else "text"
        piece = (kind, " ".join(data.split()))
        (self.table if self.table is not None else self.pieces).append(piece)

    def text(self):
        return " ".join(t for _, t in self.pieces)


def visible(html):
    parser = Visible()
    parser.feed(html)
    return parser


@pytest.mark.parametrize("page", COMPONENTS, ids=lambda p: p.id)
def test_the_explanation_is_at_least_half_of_what_a_reader_sees_before_the_evidence(built_site, page):
    seen = visible(html_of(built_site, page.path))
    total = sum(len(t) for _, t in seen.pieces)
    explanation = sum(len(t) for kind, t in seen.pieces if kind == "text")
    assert explanation >= total / 2, f"{page.id}: explanation {explanation} of {total} characters seen"


@pytest.mark.parametrize("page", [p for p in COMPONENTS if "init_params" in p.seeds], ids=lambda p: p.id)
def test_the_tiny_examples_first_number_comes_in_the_first_third_of_the_page(built_site, page):
    seen = visible(html_of(built_site, page.path))
    text = seen.text()
    start = seen.example_at
    assert start is not None, f"{page.id}: no tiny example (an element with id tiny-numerical-example)"
    number = re.compile(r"-?\d+\.\d+").search(text, start)
    assert number and number.start() <= len(text) / 3, \
        f"{page.id}: the tiny example's first number at {number.start() if number else None} of {len(text)}"


def test_folded_blocks_code_and_check_tables_are_told_apart():
    """Negative control of the measure: a folded block counts for nothing, a code block and a table of checks
    count as not explanation, an open block and a plain table as explanation."""
    html = ("<article><p>one two</p><details><summary>Evidence</summary><p>hidden words here</p></details>"
            "<details open><summary>s</summary><p>open</p></details><pre><code>x = 1</code></pre>"
            "<table><thead><tr><th>Gradient</th><th>Result</th></tr></thead><tbody><tr><td>dx</td><td>pass</td>"
            "</tr></tbody></table><h2 id='tiny-numerical-example'>T</h2><p>0.5</p></article>")
    seen = visible(html)
    kinds = {}
    for kind, t in seen.pieces:
        kinds.setdefault(kind, []).append(t)
    assert "hidden words here" not in seen.text() and "Evidence" in seen.text() and "open" in kinds["text"]
    assert kinds["code"] == ["x = 1"] and "pass" in kinds["check"] and seen.example_at is not None
