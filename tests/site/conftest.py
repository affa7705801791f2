"""Fixtures of the site's and the tools' tests: the site built once, and the browser that opens it.
Keep this file to fixtures only."""

import os
import re

import pytest


@pytest.fixture(scope="session")
def site_and_mode(tmp_path_factory):
    """(site, mode): scripts/site's site/ when current, else a quick build, chosen once per test session
    (tests/site/sitebuild.py); pytest-xdist's workers share the choice and the build."""
    import sitebuild

    folder = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        folder = folder.parent  # the session's folder, above each worker's own
    try:
        return sitebuild.build_once(folder)
    except RuntimeError as e:
        pytest.fail(str(e))


@pytest.fixture(scope="session")
def built_site(site_and_mode):
    """The built site's folder."""
    return site_and_mode[0]


@pytest.fixture
def built_mode(site_and_mode, monkeypatch):
    """The mode the built site was made in ("full" or "quick"), set for the test as the build set it, so that
    what the test recomputes or reads (fragments, notebooks, reports) is that build's."""
    mode = site_and_mode[1]
    if mode == "quick":
        monkeypatch.setenv("SITE_QUICK", "1")
    else:
        monkeypatch.delenv("SITE_QUICK", raising=False)
    return mode


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
