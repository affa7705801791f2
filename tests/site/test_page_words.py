"""Pages speak to a learner about the model: no word of the workshop (issues, bars, sessions, a figure that
"MISSES" its target) on any page a reader opens, and one glyph for each Greek letter on a page. The contributors'
page, which explains the tools, may name their internals."""

import re
from html.parser import HTMLParser

import pytest
from sitebuild import html_of

from site_scripts import registry

CONTRIBUTORS = {"architecture"}  # "How the site is built": the tools' internals belong there
# Words that belong to the team's work, not to the model: each as a pattern of whole words.
WORKSHOP = {
    "issue": r"\bissues?\b",
    "bar (a target to meet)": r"\b(?:meets?|misse[sd]|clears?|passe[sd]|beats?) (?:the|its|a|our) bars?\b"
                              r"|\bbars? of (?:the|an?|this) issue\b|\bthe issue's bars?\b",
    "session": r"\bsessions?\b",
    "MISSES / MEETS": r"\b(?:MISSES|MEETS)\b",
    "launcher, fork, pre-imported": r"\b(?:launchers?|pre-?imported|forks? (?:a|the|one) (?:worker|process))\b",
    "TODO, FIXME": r"\b(?:TODO|FIXME|XXX)\b",
}
# Two glyphs of one letter read as two symbols: a page uses one of each pair.
VARIANTS = (("ϕ", "φ"), ("ϵ", "ε"), ("ϑ", "θ"), (r"\varphi", r"\phi"), (r"\varepsilon", r"\epsilon"))


class Article(HTMLParser):
    """The article's text and its math as written (MathJax reads the TeX from the page): `parts` all of it,
    `prose` without code (a listing names what the code names)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.depth, self.code, self.parts, self.prose = 0, 0, [], []

    def handle_starttag(self, tag, attrs):
        self.depth += tag == "article"
        self.code += tag in ("pre", "code")

    def handle_endtag(self, tag):
        self.depth -= tag == "article"
        self.code -= tag in ("pre", "code")

    def handle_data(self, data):
        if self.depth:
            self.parts.append(data)
            if not self.code:
                self.prose.append(data)


def article(html):
    parser = Article()
    parser.feed(html)
    return " ".join(parser.parts), " ".join(parser.prose)


def workshop_words(text):
    return sorted({name for name, pattern in WORKSHOP.items() if re.search(pattern, text)})


def glyph_clashes(text):
    """Pairs of glyphs of one letter that both occur: \\phi followed by a letter (\\phantom) is not \\phi."""
    def has(glyph):
        return re.search(re.escape(glyph) + (r"(?![A-Za-z])" if glyph.startswith("\\") else ""), text)
    return [pair for pair in VARIANTS if has(pair[0]) and has(pair[1])]


READER_PAGES = [p for p in registry.PAGES if p.id not in CONTRIBUTORS]


@pytest.mark.parametrize("page", READER_PAGES, ids=lambda p: p.id)
def test_no_page_a_reader_opens_speaks_of_the_workshop(built_site, page):
    _, text = article(html_of(built_site, page.path))
    found = {name: re.search(WORKSHOP[name], text) for name in workshop_words(text)}
    assert not found, {name: text[max(m.start() - 60, 0):m.end() + 60] for name, m in found.items()}


@pytest.mark.parametrize("page", registry.PAGES, ids=lambda p: p.id)
def test_a_page_writes_each_greek_letter_with_one_glyph(built_site, page):
    assert not glyph_clashes(article(html_of(built_site, page.path))[0]), page.id


def test_the_word_checks_can_fail():
    """Negative controls, and the words that look alike but are not the workshop's."""
    assert workshop_words("The bars of the issue: 5.0x, MISSES the bar") == ["MISSES / MEETS", "bar (a target to meet)",
                                                                           "issue"]
    assert workshop_words("a bar chart; the session's notes") == ["session"]
    assert workshop_words("tissue, barely, crossbars, embarrass, a bar chart of the losses; the dark part of a bar "
                          "is what numpy holds, the light bars") == []
    assert glyph_clashes(r"\phi(x) and \varphi(x)") == [(r"\varphi", r"\phi")]
    assert glyph_clashes(r"\phantom{x} \varphi") == [] and glyph_clashes("φ then ϕ") == [("ϕ", "φ")]
