"""The explorer in Chromium, driven as a reader drives it: every forward and backward step visited, every value
shown read back from the page and compared with NumPy's (the model run again here); a chosen attention entry
marking exactly the rows at or before its position; the keyboard moving between entries and choosing one; the
seed changing the numbers. The page itself passes test_site_browser.py's checks (no console error, nothing
requested off the site) with every other page. Run with `scripts/test -m browser`."""

import re
from urllib.parse import urlsplit

import numpy as np
import pytest
from sitebuild import page_dir

from site_scripts.pages import explorer

pytestmark = pytest.mark.browser
URL = page_dir("model/explorer.md")
LABEL = re.compile(r"^(?P<symbol>.+)\[(?P<r>\d+), (?P<c>\d+)\] = (?P<value>\S+)$")


def open_explorer(page, site_url):
    """The explorer's page, loaded; the list it returns fills with every console error, uncaught exception, failed
    request and request off the site while the test drives the page."""
    errors, host = [], urlsplit(site_url).netloc
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("requestfailed", lambda r: errors.append(f"failed: {r.url}"))
    page.on("request", lambda r: errors.append(f"off the site: {r.url}") if urlsplit(r.url).netloc != host else None)
    page.goto(site_url + URL)
    page.wait_for_selector(".explorer .xp-cell")
    return errors


def shown(page):
    """(title, every cell's aria-label) of what the explorer shows now."""
    return page.evaluate("""() => [document.querySelector('.xp-title').textContent,
        [...document.querySelectorAll('.xp-cell')].map(c => [c.dataset.tensor, c.dataset.role, Number(c.dataset.input),
                                                             Number(c.dataset.index), c.getAttribute('aria-label')])]""")


def test_every_step_forward_and_backward_shows_numpys_values(page, site_url):
    errors = open_explorer(page, site_url)
    sequence = next(iter(explorer.SEQUENCES))
    run = explorer.run(sequence, 0)
    n = len(run.steps)
    checked, worst = 0, 0.0
    for position in range(2 * n):
        title, cells = shown(page)
        backward = position >= n
        step = run.steps[2 * n - 1 - position if backward else position]
        assert title.startswith("Backward" if backward else "Forward") and step.title in title, title
        for tensor, role, k, index, label in cells:
            m = LABEL.match(label)
            assert m, label
            if not backward:
                want = run.matrix(tensor).ravel()[index]
            else:  # the output's whole gradient; what this step sends each input
                want = np.ravel(run.grads[tensor] if role == "output" else step.dx[k])[index]
            got = float(m["value"])
            worst = max(worst, abs(got - want) / max(abs(want), 1e-300))
            checked += 1
        if position < 2 * n - 1:
            page.click(".xp-next")
    assert checked >= 200 and worst <= 1e-12, (checked, worst)
    page.select_option(".xp-seed", "1")  # a choice whose data file the page has not loaded yet
    page.wait_for_function(f"() => document.querySelector('.explorer').dataset.shown === '{explorer.key(sequence, 1)}'")
    assert page.is_disabled(".xp-next") and not errors, errors


def test_a_chosen_attention_entry_marks_the_rows_at_or_before_it(page, site_url):
    open_explorer(page, site_url)
    run = explorer.run(next(iter(explorer.SEQUENCES)), 0)
    position = [s.id for s in run.steps].index("b1.attn")
    page.evaluate(f"() => {{ const s = document.querySelector('.xp-slider'); s.value = '{position}'; "
                  "s.dispatchEvent(new Event('input')); }")
    rows, cols = run.matrix("b1.attn").shape
    for t in range(rows):
        page.click(f'.xp-cell[data-role="output"][data-index="{t * cols + 1}"]')
        marked = page.evaluate("() => [...document.querySelectorAll('.xp-cell.xp-dep')].map(c => Number(c.dataset.index))")
        assert sorted(marked) == list(range((t + 1) * cols)), (t, marked)
        assert page.locator(".xp-flow").count() == (t + 1) * cols


def test_the_keyboard_moves_between_entries_and_chooses_one(page, site_url):
    open_explorer(page, site_url)
    page.focus('.xp-cell[data-role="output"][data-index="0"]')
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowDown")
    focused = page.evaluate("() => [document.activeElement.dataset.role, document.activeElement.dataset.index]")
    cols = explorer.run(next(iter(explorer.SEQUENCES)), 0).matrix("embedding").shape[1]
    assert focused == ["output", str(1 + cols)]
    page.keyboard.press("Enter")
    assert page.locator(".xp-cell.xp-chosen").count() == 1
    assert page.locator(".xp-cell.xp-dep").count() == 2  # one entry of each table: its token's and its position's
    assert "depends on 2 input entries" in page.text_content(".xp-summary") and page.locator(".xp-flow").count() == 2
    assert page.get_attribute(".xp-cell.xp-chosen", "aria-pressed") == "true"
    assert page.locator('.xp-cell[tabindex="0"]').count() == page.locator(".xp-cells").count()  # one stop a grid


def test_another_seed_shows_that_runs_numbers(page, site_url):
    open_explorer(page, site_url)
    sequence = list(explorer.SEQUENCES)[1]
    page.select_option(".xp-sequence", sequence)
    page.select_option(".xp-seed", "2")
    key = explorer.key(sequence, 2)
    page.wait_for_function(f"() => document.querySelector('.explorer').dataset.shown === '{key}'")
    run = explorer.run(sequence, 2)
    _, cells = shown(page)
    values = {(t, i): float(LABEL.match(label)["value"]) for t, _, _, i, label in cells}
    want = run.matrix("embedding").ravel()
    assert all(abs(values["embedding", i] - want[i]) <= 1e-12 * abs(want[i]) for i in range(want.size))


def test_the_explorer_works_opened_from_disk(page, built_site):
    """A page opened as a file (file://), where Material announces no page and a browser fetches no file: the data
    comes by a script tag, and the first choice is drawn."""
    errors = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto((built_site / "model" / "explorer" / "index.html").as_uri())
    page.wait_for_function("() => document.querySelector('.explorer').dataset.shown")
    first = explorer.key(next(iter(explorer.SEQUENCES)), explorer.SEEDS[0])
    assert page.get_attribute(".explorer", "data-shown") == first and page.locator(".xp-cell").count() > 0
    assert not errors, errors


def test_without_scripts_the_still_picture_stands_in(browser, site_url):
    page = browser.new_page(java_script_enabled=False)
    try:
        page.goto(site_url + URL)
        assert page.locator(".xp-cell").count() == 0 and page.is_visible("img.xp-still")
    finally:
        page.close()
    # and with them, the explorer is drawn in its place
    page = browser.new_page()
    try:
        open_explorer(page, site_url)
        assert not page.is_visible("img.xp-still")
    finally:
        page.close()

