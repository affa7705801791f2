"""The Model chapter's quiz in Chromium, answered as a reader answers it: a right choice chosen with the mouse
and wrong ones with the keyboard (Enter, Space) are marked right and wrong and show their own explanations, while
the choices not chosen keep theirs hidden; the quiz works reached by Material's instant navigation and opened from
disk; in print, and without JavaScript, every explanation shows and the right choice is marked. The page itself
passes test_site_browser.py's checks (no console error, every formula typeset at a width) with every other page.
Run with `scripts/test -m browser`."""

import pytest
from sitebuild import page_dir

from site_scripts.pages import quiz_model

pytestmark = pytest.mark.browser
URL = page_dir("model/quiz.md")
SCORES, MASK = quiz_model.attention_weights(), quiz_model.mask_rows()  # the questions answered here


def open_quiz(page, url):
    """The quiz page, loaded and answerable; the list it returns fills with every console error and uncaught
    exception while the test drives the page."""
    errors = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    page.wait_for_selector(".quiz.quiz-live")
    return errors


def choices(page, question, right):
    """The choices of a question on the page that are right (one) or wrong (the others)."""
    return page.locator(f'#{question.id} .quiz-choice[data-right="{str(right).lower()}"]')


def shown(choice):
    """Whether a choice's explanation can be seen: laid out, visible, and of some height."""
    return choice.locator(".quiz-why").is_visible()


def verdict(choice):
    return choice.locator(".quiz-verdict").text_content().strip()


def test_a_right_and_a_wrong_choice_are_marked_and_explained_and_the_others_stay_hidden(page, site_url):
    errors = open_quiz(page, site_url + URL)
    assert page.locator(".quiz-why").count() > 0
    assert not any(w.is_visible() for w in page.locator(".quiz-why").all())  # nothing chosen, nothing shown
    right = choices(page, SCORES, True)
    assert right.count() == 1 and right.locator(".quiz-pick").text_content().strip() == SCORES.right.text.strip("`")
    right.locator(".quiz-pick").click()
    assert "quiz-right" in right.get_attribute("class") and shown(right) and verdict(right) == "Right."
    assert right.locator(".quiz-pick").get_attribute("aria-expanded") == "true"
    for n, key in enumerate(("Enter", " ")):  # two wrong choices of another question, chosen with the keyboard
        wrong = choices(page, MASK, False).nth(n)
        wrong.locator(".quiz-pick").focus()
        page.keyboard.press(key)
        assert "quiz-wrong" in wrong.get_attribute("class") and shown(wrong) and verdict(wrong) == "Not this one."
    # Not chosen: the scores' wrong choices, the mask's right one and its last wrong one.
    unchosen = [*choices(page, SCORES, False).all(), choices(page, MASK, True), *choices(page, MASK, False).all()[2:]]
    assert len(unchosen) == len(SCORES.choices) + len(MASK.choices) - 3
    for choice in unchosen:
        assert not shown(choice) and "quiz-chosen" not in choice.get_attribute("class")
        assert choice.locator(".quiz-pick").get_attribute("aria-expanded") == "false"
    assert not errors, errors


def test_the_quiz_answers_when_reached_by_instant_navigation(page, site_url):
    """Material draws the next page into the same document, without loading it: the quiz must start on its
    document$ event. Material navigates so on a click only where the sitemap lists the page, which it does only
    on a site built with its address (SITE_URL); here the navigation is asked of Material directly, as a click
    would ask it, on its location$."""
    page.goto(site_url + page_dir("model/gpt2.md"))
    page.wait_for_function("() => window.document$ !== undefined && window.location$ !== undefined")
    page.evaluate("""() => { window.stillHere = true; const url = new URL('../quiz/', location.href);
        history.pushState(null, '', url); window.location$.next(url); }""")
    page.wait_for_selector(".quiz.quiz-live")
    assert page.evaluate("() => window.stillHere === true")  # the same document: instant navigation drew it
    right = choices(page, SCORES, True)
    right.locator(".quiz-pick").click()
    assert shown(right) and "quiz-right" in right.get_attribute("class")


def test_the_quiz_answers_opened_from_disk(page, built_site):
    """A page opened as a file (file://), where Material announces no page."""
    page.goto((built_site / URL / "index.html").as_uri())
    page.wait_for_selector(".quiz.quiz-live")
    wrong = choices(page, SCORES, False).first
    wrong.locator(".quiz-pick").click()
    assert shown(wrong) and "quiz-wrong" in wrong.get_attribute("class")
    assert not shown(choices(page, SCORES, True))


MARK = "(c) => getComputedStyle(c.querySelector('.quiz-pick'), '::before').content"


def every_answer_shown_and_the_right_one_marked(page):
    """Every explanation shows, and the right choice carries the mark, the others none (a wrong one chosen on
    screen included)."""
    for question in (SCORES, MASK):
        for right in (True, False):
            for choice in choices(page, question, right).all():
                mark = choice.evaluate(MARK)
                assert shown(choice) and ("✓" in mark if right else mark == "none"), (question.id, right, mark)


def test_in_print_every_explanation_shows_and_the_right_choice_is_marked(page, site_url):
    open_quiz(page, site_url + URL)
    choices(page, MASK, False).first.locator(".quiz-pick").click()  # a wrong choice, chosen on screen
    page.emulate_media(media="print")
    every_answer_shown_and_the_right_one_marked(page)


def test_without_javascript_every_explanation_shows_and_the_right_choice_is_marked(browser, site_url):
    context = browser.new_context(java_script_enabled=False)
    try:
        page = context.new_page()
        page.goto(site_url + URL)
        assert page.locator(".quiz.quiz-live").count() == 0
        every_answer_shown_and_the_right_one_marked(page)
    finally:
        context.close()
