"""The built site in Chromium: every page loads with no console error, no failed request and no
request off the site, and shows its formulas, diagrams and images; a full-page screenshot of
each goes to build/screenshots/. The checks' negative controls run on copies of a page with a
fault planted. Run with `scripts/test -m browser` (after `scripts/setup --browser`)."""

import markdown
import pytest
from browsercheck import RENDERING_PROBLEMS, check_page, fault_path, plant_faults, playwright_error, serve
from sitebuild import ROOT, nav_pages, page_dir

pytestmark = pytest.mark.browser
SCREENSHOTS = ROOT / "build" / "screenshots"


def report(what, problems):
    return f"{what}: {len(problems)} problems\n  " + "\n  ".join(problems)


# ------------------------------------------------------------------ every page

@pytest.mark.parametrize("md", nav_pages())
def test_page_loads_cleanly_and_shows_its_formulas_diagrams_and_images(page, site_url, md):
    problems = check_page(page, site_url + page_dir(md))
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SCREENSHOTS / (md[:-3].replace("/", "-") + ".png"), full_page=True)
    assert not problems, report(md, problems)


@pytest.mark.parametrize("md", nav_pages())
def test_page_opened_from_disk_typesets_its_formulas_and_draws_its_diagrams(page, built_site, md):
    """site/.../index.html opened as a file (file://), where Material's page events never fire."""
    page.goto((built_site / page_dir(md) / "index.html").as_uri())
    try:  # until every formula is typeset and every diagram drawn; what is not, RENDERING_PROBLEMS names
        page.wait_for_function("() => !document.querySelector('.arithmatex:not(:has(mjx-container))') && "
                               "!document.querySelector('pre.mermaid')", timeout=15_000)
    except playwright_error():
        pass
    problems = page.evaluate(RENDERING_PROBLEMS)
    assert not problems, report(f"{md} from disk", problems)


# ------------------------------------------------------------------ negative controls of check_page

def formula(tex):
    """What pymdownx.arithmatex makes of inline math, as on the site's pages."""
    return markdown.markdown(tex, extensions=["pymdownx.arithmatex"],
                             extension_configs={"pymdownx.arithmatex": {"generic": True}})


FAULTS = {  # name: (HTML put at the top of a copy of a real page, the start of a problem check_page must report)
    "none": ("", None),
    "unclosed formula": (formula(r"$\frac{$"), r"formula not typeset: \(\frac{\)"),
    "formula error": (formula(r"$\frac{a}$"), r"formula with a MathJax error (Missing argument for \frac): \frac{a}"),
    "undefined macro": (formula(r"$\nosuchmacro$"), r"formula with red error text: \nosuchmacro"),
    "blank formula": (r'<p><span class="arithmatex">\(\)</span></p>', "formula of zero width: "),
    "missing image": ('<img src="missing.png">', "image not loaded: {url}missing.png"),
    "missing script": ('<script src="missing.js"></script>', "HTTP 404: {url}missing.js"),
    "outside host": ('<img src="https://cdn.example.org/x.png">', "request to another host: https://cdn.example.org/x.png"),
    "console error": ('<script>console.error("on purpose")</script>', "console error: on purpose"),
    "exception": ("<script>null.x</script>", "uncaught exception: Cannot read properties of null"),
    "broken diagram": ('<pre class="mermaid"><code>flowchart TD\n  a --&gt; ((</code></pre>',
                       "mermaid diagram not drawn: flowchart TD"),
    "hidden diagram": ('<div hidden><pre class="mermaid"><code>flowchart TD\n  a --&gt; b</code></pre></div>',
                       "mermaid diagram of zero height"),
}


@pytest.fixture(scope="module")
def faulty_url(built_site, tmp_path_factory):
    """The site with, for each fault, a copy of the LayerNorm page with the fault at its top."""
    article = '<article class="md-content__inner md-typeset">'
    faults = {name: ("model/layernorm/index.html", article, article + fault) for name, (fault, _) in FAULTS.items()}
    with serve(plant_faults(built_site, tmp_path_factory.mktemp("faulty") / "site", faults)) as url:
        yield url


@pytest.mark.parametrize("name", FAULTS)
def test_check_page_reports_each_planted_fault(page, faulty_url, name):
    """Negative controls: the unchanged copy passes; each fault is reported, named as expected."""
    url = faulty_url + fault_path(name)
    problems = check_page(page, url)
    expected = FAULTS[name][1]
    if expected is None:
        assert problems == []
    else:
        assert any(p.startswith(expected.replace("{url}", url)) for p in problems), report(name, problems)
