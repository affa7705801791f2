"""Every link inside the built site resolves, anchors included, and the site loads nothing from
another host. (mkdocs --strict checks the markdown's links; this reads the HTML that came out.)"""

import subprocess
import sys

from site_scripts.common import ROOT
from tools.linkcheck import check_site


def test_every_internal_link_and_anchor_of_the_built_site_resolves(built_site):
    problems = check_site(built_site)
    assert not problems, f"{len(problems)} broken links:\n" + "\n".join(problems[:50])


def write(path, html):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"<!doctype html><html><head></head><body>{html}</body></html>")


def test_a_broken_link_a_broken_anchor_and_an_outside_script_are_each_reported(tmp_path):
    """Negative control: one good page, one with each kind of fault; each is named with its page and link."""
    write(tmp_path / "index.html", '<h1 id="top">t</h1><a href="a/#here">ok</a> <a href="/a/">root</a>'
                                   ' <a href="#top">self</a> <a href="https://example.org/">outside, followed only</a>'
                                   ' <a href="mailto:x@example.org">mail</a> <img src="data:image/png;base64,AA==">')
    write(tmp_path / "a" / "index.html", '<p name="here">a</p><a href="../index.html#top">back</a>')
    assert check_site(tmp_path) == []

    write(tmp_path / "b" / "index.html", '<a href="../missing/">gone</a> <a href="../a/#nowhere">bad anchor</a>'
                                         ' <img src="fig.png"> <script src="https://cdn.example.org/x.js"></script>'
                                         ' <link rel="stylesheet" href="//cdn.example.org/x.css">'
                                         '<pre class="mermaid"><code>flowchart TD\n  a --&gt; b\n'
                                         '  click a href "../a/#here" "fine"\n  click b href "../a/#gone"</code></pre>')
    assert check_site(tmp_path) == [
        'b/index.html: loads https://cdn.example.org/x.js from another host (what a page loads must be served by '
        'the site)',
        'b/index.html: loads //cdn.example.org/x.css from another host (what a page loads must be served by the site)',
        'b/index.html: <a href="../missing/"> -> no file missing/index.html',
        'b/index.html: <a href="../a/#nowhere"> -> no id "nowhere" in a/index.html',
        'b/index.html: <img src="fig.png"> -> no file b/fig.png',
        'b/index.html: mermaid click href "../a/#gone" -> no id "gone" in a/index.html',
    ]


def test_the_command_line_exits_non_zero_on_a_broken_link(tmp_path):
    write(tmp_path / "index.html", '<a href="nowhere.html">x</a>')
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "linkcheck.py"), str(tmp_path)],
                            capture_output=True, text=True)
    assert result.returncode == 1 and "index.html: <a href=\"nowhere.html\"> -> no file nowhere.html" in result.stdout


def test_a_link_to_a_page_the_pdf_does_not_have_is_reported(tmp_path):
    """The print edition's citations link to `#page=N`: N must be one of the PDF's pages."""
    from pypdf import PdfWriter

    (tmp_path / "print").mkdir()
    writer = PdfWriter()
    for _ in range(3):
        writer.add_blank_page(width=595, height=842)
    writer.write(tmp_path / "print" / "book.pdf")
    write(tmp_path / "index.html", '<a href="print/book.pdf#page=3">last</a> <a href="print/book.pdf">whole</a>')
    assert check_site(tmp_path) == []
    write(tmp_path / "index.html", '<a href="print/book.pdf#page=4">past</a> <a href="print/book.pdf#eq-1">named</a>')
    assert check_site(tmp_path) == ['index.html: <a href="print/book.pdf#page=4"> -> no page "page=4" in print/book.pdf',
                                    'index.html: <a href="print/book.pdf#eq-1"> -> no page "eq-1" in print/book.pdf']
