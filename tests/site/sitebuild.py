"""How the tests build the site: strictly, with the quick notebooks, into a folder of their
choosing; and where each nav page lands in it. The `built_site` fixture (conftest.py) builds
it once per test session."""

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

from site_scripts import registry
from site_scripts.common import ROOT
ENV = dict(os.environ, NO_MKDOCS_2_WARNING="1", SITE_QUICK="1")  # quick notebooks: see site_scripts/notebooks.py
ENV.pop("SITE_REPO_URL", None)


def mkdocs_build(site_dir, cwd=ROOT):
    """`python -m mkdocs build --strict`, as scripts/site runs it from the project root (which is then on
    sys.path); a build of another folder's site finds the project through PYTHONPATH."""
    env = {k: v for k, v in ENV.items() if k != "PYTHONPATH"}
    if Path(cwd) != ROOT:
        env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)],
                          cwd=cwd, capture_output=True, text=True, env=env)


def build_once(folder):
    """folder/site, built unless an earlier call (in this process or another pytest-xdist worker,
    which waits on the lock meanwhile) built it. Raises with mkdocs' output when the build fails."""
    site = folder / "site"
    with open(folder / "site.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (site / "index.html").is_file():
            if not (ROOT / "docs/assets/vendor/mathjax/tex-mml-chtml.js").exists():
                raise RuntimeError("docs/assets/vendor is missing: run scripts/setup")
            partial = folder / "site.partial"
            shutil.rmtree(partial, ignore_errors=True)
            result = mkdocs_build(partial)
            if result.returncode != 0:
                raise RuntimeError(f"mkdocs build failed:\n{result.stderr[-3000:]}")
            partial.rename(site)
    return site


def nav_pages():
    """The markdown path of every page in the navigation (site_scripts/registry.py, through the hook)."""
    return [page.path for page in registry.PAGES]


def page_dir(md_path):
    """The URL path, relative to the site root, where a page's markdown file is served: model/x.md -> model/x/."""
    folder, _, name = md_path.rpartition("/")
    return (f"{folder}/" if folder else "") if name == "index.md" else md_path[:-3] + "/"


def html_of(site, md_path):
    return (site / page_dir(md_path) / "index.html").read_text()
