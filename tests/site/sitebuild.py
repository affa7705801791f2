"""Which built site the tests read, and where each nav page lands in it. The `built_site` fixture
(conftest.py) asks once per test session: `scripts/site`'s own site/ when it is current (the README runs
`scripts/site` first, so the tests check the very site a reader opens, and a second build would only
repeat it), else a quick build (the notebooks shortened) into the session's folder."""

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

from site_scripts import registry
from site_scripts.common import ROOT
# The environment of the tests' builds: the default repository URL, the mode each build names.
ENV = {k: v for k, v in os.environ.items() if k not in ("SITE_REPO_URL", "SITE_QUICK")}
ENV["NO_MKDOCS_2_WARNING"] = "1"
REUSE_ENV = "SITE_TESTS_REUSE"  # SITE_TESTS_REUSE=0: the tests build their own quick site even when site/ is current


def mkdocs_build(site_dir, cwd=ROOT, mode="quick"):
    """`python -m mkdocs build --strict` in `mode` (quick: the notebooks shortened), as scripts/site runs it from
    the project root (which is then on sys.path); a build of another folder's site finds the project through
    PYTHONPATH."""
    env = {k: v for k, v in ENV.items() if k != "PYTHONPATH"}
    if mode == "quick":
        env["SITE_QUICK"] = "1"
    if Path(cwd) != ROOT:
        env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)],
                          cwd=cwd, capture_output=True, text=True, env=env)


def current_full_site():
    """site/ when `scripts/site` built it and nothing it is built from changed since (site_scripts/site_state.py),
    with the settings the tests build with (the print edition unless SITE_PDF=0, the default repository URL)."""
    state = subprocess.run([sys.executable, "-m", "site_scripts.site_state"], cwd=ROOT, env=ENV)
    return ROOT / "site" if state.returncode == 0 else None


def build_once(folder):
    """(site, mode): the site the tests read, and the mode it was built in ("full" or "quick"). The first call
    of a test session decides, and later ones (in this process or another pytest-xdist worker, which waits
    on the lock meanwhile) read its choice: site/ when current, else folder/site, built quick. Raises with
    mkdocs' output when the build fails."""
    site, choice = folder / "site", folder / "site.choice"
    with open(folder / "site.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if choice.exists():
            path, mode = choice.read_text().split("\n")
            return Path(path), mode
        full = current_full_site() if os.environ.get(REUSE_ENV, "1") == "1" else None
        if full is not None:
            choice.write_text(f"{full}\nfull")
            return full, "full"
        if not (ROOT / "docs/assets/vendor/mathjax/tex-mml-chtml.js").exists():
            raise RuntimeError("docs/assets/vendor is missing: run scripts/setup")
        partial = folder / "site.partial"
        shutil.rmtree(partial, ignore_errors=True)
        result = mkdocs_build(partial)
        if result.returncode != 0:
            raise RuntimeError(f"mkdocs build failed:\n{result.stderr[-3000:]}")
        partial.rename(site)
        choice.write_text(f"{site}\nquick")
    return site, "quick"


def nav_pages():
    """The markdown path of every page in the navigation (site_scripts/registry.py, through the hook)."""
    return [page.path for page in registry.PAGES]


def page_dir(md_path):
    """The URL path, relative to the site root, where a page's markdown file is served: model/x.md -> model/x/."""
    folder, _, name = md_path.rpartition("/")
    return (f"{folder}/" if folder else "") if name == "index.md" else md_path[:-3] + "/"


def html_of(site, md_path):
    return (site / page_dir(md_path) / "index.html").read_text()
