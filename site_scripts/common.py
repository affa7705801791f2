"""What the site build and the tools share: the project root, the versions a result depends on, markdown
tables, and the cached-artifact pattern (a key, a computation, a stamp). A leaf module: it imports nothing from
the project, so `site_scripts` and `tools` can both use it without importing each other.
"""

import hashlib
import json
import os
import stat
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "build" / "cache"
QUICK_ENV = "SITE_QUICK"  # SITE_QUICK=1: the quick build, with the long runs shortened (the tests use it)
MODES = ("quick", "full")  # a report of one mode is stored as build/cache/<name>-<mode>.json


def mode():
    """The build's mode: "quick" when SITE_QUICK=1, else "full"."""
    return "quick" if os.environ.get(QUICK_ENV) == "1" else "full"


def package_version(name):
    """An installed package's version, read from its metadata (nothing is imported), or "none" (a key too)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "none"


def torch_version():
    return package_version("torch")


def numpy_version():
    return package_version("numpy")


def cores():
    """The number of cores this process may run on: what transformer.parallel.cores says, without importing the
    package (and scipy with it), which would cost every build of the site 0.2 s before it knows it has work."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS has no affinity mask
        return os.cpu_count() or 1


def positive_int(text):
    """An argparse type: a whole number of at least 1 (a job count, say)."""
    value = int(text)
    if value < 1:
        import argparse

        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


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


def hash_parts(*parts) -> str:
    """A SHA-256 of text parts, each ended by a NUL so that ("ab", "c") and ("a", "bc") differ."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part if isinstance(part, bytes) else str(part).encode())
        digest.update(b"\0")
    return digest.hexdigest()


def md_table(header, rows):
    """A markdown table; a `|` inside a cell is escaped."""
    lines = ["| " + " | ".join(str(h).replace("|", "\\|") for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
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
