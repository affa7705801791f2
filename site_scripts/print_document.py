"""The print edition's HTML page: a title page, the contents, the gathered sections
(site_scripts/print_gather.py) and a list of the equations, inside the theme's own head and
scripts (taken from the built home page), so that MathJax, mermaid and the theme's styles
render it as they render the site. The contents and the list leave each page number as a
placeholder that site_scripts/print_pdf.py fills in from a first print."""

import html
import json
import re

from .print_gather import PAGE_REF, chapter_anchor, equation_anchor, page_anchor

NAME = "print-edition.html"  # written at the site's root while Chromium prints it, then removed


def page_ref(target):
    return f'<span class="print-leader"></span><span class="print-page-ref" data-target="{target}">{PAGE_REF}</span>'


def contents(edition):
    """The contents: each chapter and each section, with the page it starts on."""
    rows, chapter = [], None
    for s in edition.sections:
        if s.number and s.number.split(".")[0] != chapter:
            chapter = s.number.split(".")[0]
            target = chapter_anchor(s.number)
            rows.append(f'<li class="print-toc-chapter"><a href="#{target}">{chapter}&ensp;'
                        f'{html.escape(s.chapter)}</a>{page_ref(target)}</li>')
        label = f"{s.number}&ensp;" if s.number else ""
        rows.append(f'<li class="print-toc-section"><a href="#{page_anchor(s.page)}">{label}{html.escape(s.title)}</a>'
                    f'{page_ref(page_anchor(s.page))}</li>')
    rows.append(f'<li class="print-toc-chapter"><a href="#print-equations">List of equations</a>'
                f'{page_ref("print-equations")}</li>')
    return f'<nav class="print-toc"><h1 id="print-contents">Contents</h1><ol>{"".join(rows)}</ol></nav>'


def equation_list(edition, titles):
    """Every numbered equation with its title, its section and its page."""
    sections = {s.page: s for s in edition.sections}
    rows = [f'<li><a href="#{equation_anchor(eq.id)}">({eq.number})&ensp;{html.escape(titles[eq.id])}</a>'
            f'<span class="print-eq-section">&ensp;{sections[eq.page].number}</span>'
            f'{page_ref(equation_anchor(eq.id))}</li>' for eq in edition.equations]
    return (f'<section class="print-page print-eq-list" id="print-equations"><h1>List of equations</h1>'
            f'<ol>{"".join(rows)}</ol></section>')


def title_page(site_name, description, quick):
    note = ("<p>This copy was built in quick mode: the experiments ran shortened, and their pages say so.</p>"
            if quick else "")
    return (f'<section class="print-title"><h1 class="print-title__name">{html.escape(site_name)}</h1>'
            f"<p>{html.escape(description)}</p><p>The print edition: every page of the site, in the order of "
            "its navigation, with its sections and equations numbered. Every number in it was computed by the "
            f"code when the site was built.</p>{note}</section>")


def without_features(m):
    """The theme's configuration with none of its optional features: for print, code annotations stay the
    numbered notes under their listing (the theme turns them into tooltips, sometimes before a print and
    sometimes after), and no copy buttons or instant loading are added."""
    config = json.loads(m[2])
    config["features"] = []
    return m[1] + json.dumps(config) + m[3]


def shell(home_html, title):
    """The built home page, whole (the theme's scripts expect its header, navigation and footer, which its
    print styles hide), titled `title`; returns the text (before, after) its article's content."""
    page = re.sub(r"<title>.*?</title>", f"<title>{html.escape(title)}</title>", home_html, count=1, flags=re.S)
    page = re.sub(r'<link rel="(?:next|prev)"[^>]*>', "", page)
    page = re.sub(r'(<script id="__config" type="application/json">)(.*?)(</script>)', without_features, page,
                  count=1, flags=re.S)
    found = re.search(r'(<article class="md-content__inner md-typeset)(">).*?(</article>)', page, flags=re.S)
    if not found:
        raise RuntimeError("print edition: the home page has no article")
    return page[:found.start()] + found[1] + ' print-edition' + found[2], page[found.start(3):]


def document(edition, home_html, config, titles, quick):
    """The whole page, as text."""
    before, after = shell(home_html, f"{config['site_name']}: print edition")
    return "\n".join([before, title_page(config["site_name"], config["site_description"] or "", quick),
                      contents(edition), edition.html, equation_list(edition, titles), after])
