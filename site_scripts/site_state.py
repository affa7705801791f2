"""Whether the built site is current: nothing it was built from changed since the last build that ended well.

`scripts/site` asks before it runs mkdocs, and a site that is current is not built again: mkdocs would convert
every page to HTML anew to write the same bytes. The state is one hash of the stamps (size, times, inode) of
every file a build reads (the build's sources, `build.source_state`; mkdocs.yml and the theme's overrides; the
corpus the notebooks train on; the pages' fragments and the notebooks' pages), the versions of the packages
that make the site, the settings in the environment, and the built site's own files. The hook stores it when a
build ends well (on_post_build).

    python -m site_scripts.site_state [--site-dir site]    # exit 0 when the site is current, 1 when not
"""

import argparse
import os
import sys

from . import build
from .common import ROOT, hash_parts, mode, package_version, stamps

PACKAGES = ("mkdocs", "mkdocs-material", "pymdown-extensions", "Markdown", "Pygments", "mkdocstrings",
            "mkdocstrings-python", "mkdocs-autorefs", "numpy", "torch", "bitsandbytes", "matplotlib", "jupytext",
            "nbclient", "playwright", "pypdf")
SETTINGS = ("SITE_PDF", "SITE_REPO_URL", "SITE_URL", "SITE_QUICK")
CORPUS = "data/tinyshakespeare"


def state(site_dir):
    """The hash of everything the built site in `site_dir` was made from, and of the site itself."""
    files = [*build.source_state(), *stamps(ROOT, ".", "mkdocs.yml"), *stamps(ROOT, "overrides", "**/*"),
             *stamps(ROOT, CORPUS, "*"), *stamps(ROOT, "build/snippets", f"{mode()}/**/*"),
             *stamps(ROOT, "build/notebooks", f"{mode()}/**/*"), *stamps(site_dir, ".", "**/*")]
    return hash_parts(*map(str, files), *(package_version(p) for p in PACKAGES),
                      *(f"{name}={os.environ.get(name, '')}" for name in SETTINGS), mode(), str(site_dir))


def stored_path(site_dir):
    return ROOT / "build" / "cache" / f"site-{mode()}-{hash_parts(str(site_dir))[:12]}"


def record(site_dir):
    """Store the state of a site just built (the hook, once the build ended well)."""
    path = stored_path(site_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(state(site_dir))


def is_current(site_dir):
    path = stored_path(site_dir)
    return (site_dir / "index.html").exists() and path.exists() and path.read_text() == state(site_dir)


def main():
    parser = argparse.ArgumentParser(prog="python -m site_scripts.site_state", description=__doc__.splitlines()[0])
    parser.add_argument("--site-dir", default="site", help="the built site (default: site)")
    site_dir = (ROOT / parser.parse_args().site_dir).resolve()
    return 0 if is_current(site_dir) else 1


if __name__ == "__main__":
    sys.exit(main())
