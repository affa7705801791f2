"""Find the `# eq:<id>` markers in the source and tie them to the declared equations.

    python -m site_scripts.markers      # prints the ties; exit 1 if any is broken
"""

import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .common import ROOT, stamps
from .equations import by_id

MARKER = re.compile(r"\beq:([a-z0-9][a-z0-9-]*)")


@dataclass(frozen=True)
class Marker:
    eq_id: str
    path: str  # relative to the project root, with forward slashes
    line: int  # 1-based
    code: str  # the code on that line, without the comment


def collect_markers(root=ROOT, package="transformer"):
    """Every marker in the package's .py files, in file and line order (read again only when a file
    changed: every equation of every page asks)."""
    return list(_markers(str(root), package, stamps(root, package, "*.py")))


@lru_cache(maxsize=4)
def _markers(root, package, _stamps):
    found = []
    for path in sorted((Path(root) / package).glob("*.py")):
        for number, text in enumerate(path.read_text().splitlines(), start=1):
            if "#" not in text:
                continue
            code, comment = text.split("#", 1)
            for eq_id in MARKER.findall(comment):
                found.append(Marker(eq_id, path.relative_to(root).as_posix(), number, code.rstrip()))
    return tuple(found)


def check_ties(markers, equations=None):
    """Problems as sentences: markers naming no equation, equations with no marker."""
    equations = by_id() if equations is None else equations
    problems = [f"{m.path}:{m.line} marks eq:{m.eq_id}, which no docs page declares"
                for m in markers if m.eq_id not in equations]
    implemented = {m.eq_id for m in markers}
    problems += [f"equation {eq_id!r} has no implementing line (no '# eq:{eq_id}' marker in transformer/)"
                 for eq_id in equations if eq_id not in implemented]
    return problems


def main():
    markers = collect_markers()
    for m in markers:
        print(f"eq:{m.eq_id:<22} {m.path}:{m.line:<4} {m.code.strip()}")
    problems = check_ties(markers)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    print(f"{len(markers)} markers, {len({m.eq_id for m in markers})} of {len(by_id())} equations implemented")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
