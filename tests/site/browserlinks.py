"""Follow, in the browser, the links that tie the site's equations, code and diagram together;
each function returns the problems it found on one loaded page, as lines of text."""

import html
import re
from urllib.parse import urljoin, urlsplit

from browsercheck import OPEN_SHADOW_ROOTS, STILL, follow, playwright_error, settle


def marks(line_text, eq_id):
    """Whether a code line carries the marker `# eq:<eq_id>` (and not only a longer id that starts with it)."""
    return re.search(rf"#.*\beq:{re.escape(eq_id)}(?![\w-])", line_text) is not None


def not_in_view(where):
    return f"is not in view after the click (its top at {where['top']} px; seen there: {where['seen']})"


def equation_link_problems(page, url):
    """Load the page at `url` and click every 'Computed at' link under every equation: each must
    show a code line marked `# eq:<that equation>`."""
    problems = settle(page, url)
    eq_ids = page.eval_on_selector_all("h3[id^='eq-']", "hs => hs.map(h => h.id.slice(3))")
    if not eq_ids:
        return problems + ["the page shows no equation"]
    for eq in eq_ids:
        links = page.locator(f"xpath=//h3[@id='eq-{eq}']/following-sibling::p[starts-with(normalize-space(.), "
                             f"'Computed at')][1]//a[contains(@href, '#__codelineno-')]")
        if links.count() == 0:
            problems.append(f"eq-{eq}: no 'Computed at' link to a code line")
        for i in range(links.count()):
            fragment = urlsplit(links.nth(i).get_attribute("href")).fragment
            where = follow(page, links.nth(i), fragment)
            if where is None or where["hash"] != f"#{fragment}":
                problems.append(f"eq-{eq}: the link to #{fragment} landed on {where and where['hash']}")
            elif not marks(where["text"], eq):
                problems.append(f"eq-{eq}: #{fragment} is the line {where['text'].strip()!r}, without # eq:{eq}")
            elif not where["visible"]:
                problems.append(f"eq-{eq}: the line #{fragment} {not_in_view(where)}")
    return problems


def open_annotation(annotation):
    """Open a code annotation's tooltip; the links to equations it then shows (Material fills a
    tooltip when it opens), or None when none shows. The keyboard's way, as the mouse's misses
    now and then: the marker pulses, so it is never still enough for a click, and a click on a
    link of a tooltip that is still moving into place is sometimes lost. The tooltip left open
    before is closed first. The focus scrolls the marker into view, and the links are returned
    only once nothing has scrolled for 200 ms since: at each scroll of the page or of its code
    block, Material puts an open tooltip back in its place, and a link so moved loses the
    keyboard's focus (a key pressed on it then goes nowhere). Raises playwright's timeout error
    if the page keeps scrolling for 5 s."""
    annotation.page.evaluate("() => document.activeElement?.blur()")
    annotation.page.wait_for_function("() => !document.querySelector('.md-tooltip--active')")
    annotation.page.evaluate(STILL, True)  # the quiet time starts at the focus
    annotation.locator(".md-annotation__index").focus()
    links = annotation.locator(".md-tooltip a[href*='#eq-']")
    try:
        links.first.wait_for(state="visible", timeout=10_000)  # slow under load; a missing link still fails
    except playwright_error():  # a timeout
        return None
    annotation.page.wait_for_function(STILL, timeout=5_000)
    return links


EQUATION_TITLES = ("H3", "H4", "P")  # a headline equation's heading, or a derivation step's bold title


def open_folds(page):
    """Open, as a reader does by clicking its title, every folded block that holds annotated code. A page's
    code listings are in its evidence, folded; Material fills a tooltip only once it can be seen, and folds
    the evidence again when a link on the page is followed."""
    titles = page.locator("details:not([open]):has(.highlight .md-annotation) > summary")
    for _ in range(titles.count()):
        titles.first.click()


def annotation_link_problems(page, url):
    """Load the page at `url` and follow every equation link of every code annotation (its folded code
    opened first): each must show an equation (its heading, then its typeset formula) that the annotated
    line is marked with."""
    problems = settle(page, url)
    annotations = page.locator(".highlight .md-annotation")
    if annotations.count() == 0:
        return problems + ["the page has no annotated code line"]
    for i in range(annotations.count()):
        line_id, line_text = annotations.nth(i).evaluate(
            "e => { const line = e.closest('[id^=__span-]'); return [line.id, line.textContent]; }")
        open_folds(page)
        links, j = open_annotation(annotations.nth(i)), 0
        if links is None:
            problems.append(f"{line_id}: its annotation shows no link to an equation")
        while links is not None and j < links.count():
            fragment = urlsplit(links.nth(j).get_attribute("href")).fragment
            where = follow(page, links.nth(j), fragment, keyboard=True)
            if where is None or where["hash"] != f"#{fragment}":
                problems.append(f"{line_id}: the link to #{fragment} landed on {where and where['hash']}")
            elif where["tag"] not in EQUATION_TITLES or not re.match(r'<div class="arithmatex"><mjx-container',
                                                                     where["next"]):
                problems.append(f"{line_id}: #{fragment} is not an equation's title followed by its formula")
            elif not marks(line_text, fragment[3:]):
                problems.append(f"{line_id}: leads to #{fragment}, but the line has no # eq:{fragment[3:]}: "
                                f"{line_text.strip()!r}")
            elif not where["visible"]:
                problems.append(f"{line_id}: the equation #{fragment} {not_in_view(where)}")
            j += 1
            if j < links.count():  # reopen the tooltip, on this page, for its next link
                if urlsplit(page.url).path != urlsplit(url).path:
                    problems += settle(page, url)
                open_folds(page)
                links = open_annotation(annotations.nth(i))
    return problems


def mermaid_clicks(page_html):
    """(label of the box, link) for each `click <box> href "<link>"` line of a page's mermaid diagrams,
    read from the page's HTML: the source mermaid draws from."""
    found = []
    for source in re.findall(r'<pre class="mermaid"><code>(.*?)</code></pre>', page_html, flags=re.S):
        source = html.unescape(source)
        # a box is defined as c1["forward<br/>line 345"] (or c1(["..."]), k1[("...")], d1>"..."]); an edge's label,
        # c0 -->|"dx"| c1, is not a box's
        labels = dict(re.findall(r'^\s*(\w+)[\[({>]+"([^"]*)"', source, flags=re.M))
        links = re.findall(r'^\s*click (\w+) href "([^"]+)"', source, flags=re.M)
        found += [(labels[box], href) for box, href in links]
    return found


def diagram_link_problems(page, url):
    """Load the page at `url`, whose mermaid diagram has boxes named after calls (`forward<br/>line 345`)
    that link to code lines: every click line of its source must be drawn as a link on its box,
    and clicking the box must show a code line calling (or defining) the function the box names.
    Mermaid draws into a closed shadow root: OPEN_SHADOW_ROOTS opens it, so that the drawn links
    can be found and clicked."""
    clicks = mermaid_clicks(page.request.get(url).text())
    if not clicks:
        return ["the page's diagrams have no click links"]
    page.add_init_script(OPEN_SHADOW_ROOTS)
    problems = settle(page, url)
    clicks.sort(key=lambda click: urlsplit(click[1]).path != "")  # those that stay on the page first
    drawn = page.locator("div.mermaid a")
    drawn_links = drawn.evaluate_all("as => as.map(a => [a.getAttribute('xlink:href'), a.textContent])")
    expected = [[href, label.replace("<br/>", "")] for label, href in clicks]
    if sorted(drawn_links) != sorted(expected):
        problems.append(f"the drawing's links {sorted(drawn_links)} are not the source's {sorted(expected)}")
    for label, href in clicks:
        if href not in [link for link, _ in drawn_links]:
            continue  # reported above
        if urlsplit(page.url).path != urlsplit(url).path:
            problems += settle(page, url)  # the last box led to another page
        name, fragment = re.match(r"\w+", label).group(), urlsplit(href).fragment
        where = follow(page, drawn.nth([link for link, _ in drawn_links].index(href)), fragment)
        if where is None or where["hash"] != f"#{fragment}" or where["path"] != urlsplit(urljoin(url, href)).path:
            problems.append(f"box {label!r}: {href} landed on {where and where['path'] + where['hash']}")
        elif not re.search(rf"\b{name}\(", where["text"]):
            problems.append(f"box {label!r}: {href} shows the line {where['text'].strip()!r}, which does not "
                            f"call {name}")
        elif not where["visible"]:
            problems.append(f"box {label!r}: the line {href} {not_in_view(where)}")
    return problems
