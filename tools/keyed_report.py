"""A report kept in the repository: results that take minutes to compute and whose inputs rarely change (which
check catches each mutant, which tests check each function), one entry per result.

Each entry is stored with the key of what it depends on (a hash the caller computes from those inputs) and the
commit it was computed at. While the key its inputs give now is the stored one, the entry is reused; otherwise
it is computed again. So a fresh clone, whose reports came with it, computes nothing, and an edit recomputes
only the entries whose inputs it touched.

A key can only hold what its author thought of. `sample` draws reused entries at random for the caller to
compute again and compare: CI does so on every run, and a disagreement fails it, which is how an input missing
from a key would show.

The file is JSON: {"entries": {name: {"key", "commit", "value"}}}, sorted and indented, so that a change to a
few entries is a small diff.
"""

import json
import os
import random
import subprocess
from functools import cache
from pathlib import Path

from .common import ROOT


@cache
def commit():
    """The commit the working tree is at ("unknown" outside a git checkout), with "+" when it has changes to
    tracked files: an entry computed then was computed on that commit plus those changes."""
    def git(*args):
        result = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return result.stdout.strip() if result.returncode == 0 else None

    head = git("rev-parse", "--short=12", "HEAD")
    if head is None:
        return "unknown"
    return head + ("+" if git("status", "--porcelain", "--untracked-files=no") else "")


class KeyedReport:
    """The entries of one report file; `save` writes it back (whole or not at all) when something changed."""

    def __init__(self, path):
        self.path = Path(path)
        self.entries = json.loads(self.path.read_text())["entries"] if self.path.exists() else {}
        self.computed = set()  # the names computed by this process
        self._saved = json.dumps(self.entries, sort_keys=True)

    def current(self, name, key):
        """The stored value of `name` if it was computed under `key`, else None."""
        entry = self.entries.get(name)
        return entry["value"] if entry is not None and entry["key"] == key else None

    def put(self, name, key, value):
        # the same types and key order as a reloaded one: a value just computed and one read back print alike
        value = json.loads(json.dumps(value, sort_keys=True))
        self.entries[name] = {"key": key, "commit": commit(), "value": value}
        self.computed.add(name)

    def keep_only(self, names):
        """Drop the entries of results that no longer exist (a mutant removed from the catalogue, say)."""
        self.entries = {name: entry for name, entry in self.entries.items() if name in set(names)}

    def reused(self):
        """The names of the entries this process did not compute."""
        return sorted(set(self.entries) - self.computed)

    def provenance(self):
        """Where the entries come from: how many were computed at each commit, the most first."""
        commits = {}
        for entry in self.entries.values():
            commits[entry["commit"]] = commits.get(entry["commit"], 0) + 1
        return ", ".join(f"{n} at commit `{c}`" for c, n in sorted(commits.items(), key=lambda item: -item[1]))

    def sample(self, count, seed):
        """`count` reused entries drawn at random (the same for the same seed and report)."""
        reused = self.reused()
        return sorted(random.Random(seed).sample(reused, min(count, len(reused))))

    def save(self):
        """Write the file when an entry changed: beside it first, then renamed, so it is whole or absent."""
        text = json.dumps({"entries": self.entries}, sort_keys=True, indent=1) + "\n"
        if json.dumps(self.entries, sort_keys=True) == self._saved and self.path.exists():
            return False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(f"{self.path.name}.{os.getpid()}.partial")
        partial.write_text(text)
        partial.replace(self.path)
        self._saved = json.dumps(self.entries, sort_keys=True)
        return True
