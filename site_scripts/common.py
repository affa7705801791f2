"""What the site build's modules share: its mode, markdown tables, and the cached-artifact pattern (a key, a
computation, a stamp). The project root, hashing and the versions come from tools/common.py, the module below
both folders (site_scripts imports tools, never the other way).
"""

import json
import os
import re
import stat
from pathlib import Path

# Re-exported: the site's modules take them from here with the rest.
from tools.common import ROOT, cores, hash_parts, numpy_version, package_version, positive_int, torch_version  # noqa: F401

CACHE = ROOT / "build" / "cache"
QUICK_ENV = "SITE_QUICK"  # SITE_QUICK=1: the quick build, with the long runs shortened (the tests use it)
MODES = ("quick", "full")  # a report of one mode is stored as build/cache/<name>-<mode>.json


def mode():
    """The build's mode: "quick" when SITE_QUICK=1, else "full"."""
    return "quick" if os.environ.get(QUICK_ENV) == "1" else "full"


def verdict_text(passed, on_floor, floor_reason):
    """**FAIL**, pass, or pass on the absolute floor and why (a tensor that is ~0 in exact arithmetic, whose
    relative gap is only rounding noise): the words of the cross-check's rows and of the gradient checks."""
    if not passed:
        return "**FAIL**"
    return f"pass ({floor_reason})" if on_floor else "pass"


def stamps(root, folder, pattern):
    """(path, modification time, change time, size, inode) of each file of the folder matching the pattern: the
    state of the files, for caches that must notice an edit. The change time is there because tools that copy
    or unpack files (cp -p, rsync -t, tar) set the modification time, and nothing can set it. Folders are left
    out, and so is a file that is gone by the time it is read (an editor's lock file, a dangling link)."""
    found = []
    for path in sorted((Path(root) / folder).glob(pattern)):
        try:
            st = path.lstat()
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode):
            found.append((str(path), st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino))
    return tuple(found)


CODE_SPAN = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)")


def table_cell(text):
    """A cell's text with each | escaped, except inside a code span: a table does not split a row at a | between
    backticks, and a backslash there would show."""
    text, parts, last = str(text), [], 0
    for span in CODE_SPAN.finditer(text):
        parts += [text[last:span.start()].replace("|", "\\|"), span[0]]
        last = span.end()
    return "".join(parts + [text[last:].replace("|", "\\|")])


def md_table(header, rows):
    """A markdown table; a `|` inside a cell is escaped, except inside a code span."""
    lines = ["| " + " | ".join(map(table_cell, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(table_cell, row)) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_if_changed(path: Path, text: str) -> bool:
    """Write only a changed text, so `mkdocs serve` does not see an edit where there is none."""
    if path.exists() and path.read_text() == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return True


def is_current(stamp: Path, key: str) -> bool:
    """Whether the stamp beside a result says it was made under `key` (then the result is reused)."""
    return stamp.exists() and stamp.read_text() == key


def cached_json(path: Path, key: str, compute, force=False):
    """The JSON result stored at `path` if it was computed under `key`, else `compute()`, stored with the key.
    For a result kept in one file (the cross-check and mutation reports); pages and notebooks keep theirs in a
    stamp (is_current)."""
    if not force and path.exists():
        stored = json.loads(path.read_text())
        if stored.get("key") == key:
            return stored["value"]
    # the same types, and the same key order, as a reloaded one: a first build and a rebuild print alike
    value = json.loads(json.dumps(compute(), sort_keys=True))
    path.parent.mkdir(parents=True, exist_ok=True)
    # written beside it, then renamed: whole or absent; named by the process, since two workers of a build
    # (site_scripts/schedule.py) may write the same result at once (a source edited while the pages were made)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    partial.write_text(json.dumps({"key": key, "value": value}, sort_keys=True))
    partial.replace(path)
    return value
