"""Where a build's time goes, part by part, recorded by the build itself and shown on "How the site is built".

Each part of a build that does work (bringing a report up to date, a page's generator, a notebook, converting the
pages to HTML, the print edition) records its wall-clock seconds when it runs, with the build that ran it, in
build/profile-<mode>.json. Once the site is built (hook.on_post_build, before the print edition gathers
the pages) a table of every part's last recorded time replaces the placeholder on that page: a cold build shows
its own profile, a rebuild the parts it reran beside the others' last times.
"""

import fcntl
import json
import os
import re
import threading
import time

import markdown

from .common import CACHE, md_table, mode

PLACEHOLDER = '<div id="build-profile"></div>'  # written in docs/reference/architecture.md
PAGE = "reference/architecture/index.html"
FILLED = r'<div id="build-profile">.*?</div>'  # the placeholder once filled: this build's own timings
_build = {}
_lock = threading.Lock()  # the two reports are brought up to date in two threads of one build


def without_profile(page):
    """The page's HTML (str or bytes) with the profile's table left out: each build writes its own timings, so
    the print edition and any comparison of two builds leave them out."""
    if isinstance(page, bytes):
        return re.sub(FILLED.encode(), b"", page, flags=re.S)
    return re.sub(FILLED, "", page, flags=re.S)


def path():
    """Beside build/cache/, not in it: the build's no-change check reads that folder's files."""
    return CACHE.parent / f"profile-{mode()}.json"


def start():
    """Mark the start of a build: its parts are recorded under its start time."""
    _build.update(id=time.strftime("%Y-%m-%d %H:%M:%S"), start=time.perf_counter())


def record(part, seconds):
    """Store one part's seconds under this build (the parts that ran in worker processes are recorded by the build
    process, from their reported times). Parts end at once in two threads of a build, and in the processes of a
    test run: each reads and rewrites the file holding a lock (the thread's, then the file's), and the file is
    replaced whole, so no reader sees it half-written and no part's time is lost."""
    path().parent.mkdir(parents=True, exist_ok=True)
    with _lock, open(path().with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # let go when the file closes
        stored = json.loads(path().read_text()) if path().exists() else {}
        stored[part] = {"seconds": round(seconds, 1), "build": _build.get("id", "")}
        partial = path().with_suffix(f".{os.getpid()}.partial")
        partial.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")
        partial.replace(path())


def table(stored, this_build, wall):
    """The profile as a markdown table, the longest parts first, and the build's wall time."""
    rows = sorted(stored.items(), key=lambda item: -item[1]["seconds"])
    cells = [[part, f"{v['seconds']:.1f}", "this build" if v["build"] == this_build else f"the build of {v['build']}"]
             for part, v in rows]
    return (md_table(["Part", "Seconds", "Last run by"], cells)
            + f"\nThis build ({this_build}, {mode()} mode) took {wall:.0f} s of wall time until the print edition; "
              "parts that ran side by side, one per core, overlap.\n")


def fill(site):
    """Write the profile into the built contributors' page, in place of its placeholder."""
    page = site / PAGE
    if not page.exists() or not _build:
        return
    wall = time.perf_counter() - _build["start"]
    stored = json.loads(path().read_text()) if path().exists() else {}
    html = markdown.markdown(table(stored, _build["id"], wall), extensions=["tables"])
    text = page.read_text()
    if PLACEHOLDER not in text:
        raise RuntimeError(f"{PAGE} has no {PLACEHOLDER} for the build's profile")
    page.write_text(text.replace(PLACEHOLDER, f'<div id="build-profile">{html}</div>'))
