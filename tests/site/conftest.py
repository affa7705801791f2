"""Fixtures of the site's and the tools' tests: the site built once, and the browser that opens it.
Keep this file to fixtures only."""

import os
import re

import pytest


@pytest.fixture(scope="session")
def built_site(tmp_path_factory):
    """The site, built (quick notebooks) once per test session: pytest-xdist's workers share one build."""
    import sitebuild

    folder = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        folder = folder.parent  # the session's folder, above each worker's own
    try:
        return sitebuild.build_once(folder)
    except RuntimeError as e:
        pytest.fail(str(e))


# ---------------------------------------------------------------- the browser tests (test_site_browser*.py)

@pytest.fixture(scope="module")
def browser():
    """Headless Chromium (scripts/setup --browser installs it; playwright comes with the site tools)."""
    import browsercheck

    with browsercheck.chromium() as b:
        yield b


@pytest.fixture(scope="module")
def site_url(built_site):
    """The built site, served on 127.0.0.1."""
    import browsercheck

    with browsercheck.serve(built_site) as url:
        yield url


@pytest.fixture
def page(browser):
    """A fresh page in a fresh context (its own stored palette, its own listeners). A request off
    the site is refused at once, so that a machine with a network behaves like one without."""
    import browsercheck

    off_site = re.compile(rf"^(https?|wss?)://(?!{re.escape(browsercheck.HOST)}[:/])")
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(15_000)
    context.route(off_site, lambda route: route.abort("blockedbyclient"))
    yield context.new_page()
    context.close()
