"""Run the page generators, each only when something it depends on changed.

A page generator is a module site_scripts/pages/<name>.py with a function
generate(context) -> {fragment name: markdown}. Its fragments are written to
build/snippets/<name>/<fragment>.md, which the docs pages include with
pymdownx.snippets (`--8<-- "<name>/<fragment>.md"`).

A page's cache key hashes everything its output depends on: its generator's
source, the shared site_scripts modules, the source and first line of every
transformer function and class it can reach (site_scripts/depends.py), the
callers and the tests of those functions (the pages print them), the numpy
and torch versions, the build context (the repository URL) and whatever the
generator's optional key_inputs(context) returns. Editing one
function therefore reruns exactly the pages that reach it. Files are
rewritten only when their content changes, so `mkdocs serve` does not
rebuild forever.

    python -m site_scripts.build [--page NAME ...] [--force]
"""

import argparse
import hashlib
import importlib
import json
import sys
import time
from pathlib import Path

from . import depends

ROOT = Path(__file__).resolve().parent.parent
SNIPPETS = ROOT / "build" / "snippets"
PAGES_DIR = ROOT / "site_scripts" / "pages"
SHARED = ["build.py", "depends.py", "equations.py", "markers.py", "code_facts.py", "sections.py"]


def page_names():
    return sorted(p.stem for p in PAGES_DIR.glob("*.py") if not p.name.startswith("_"))


def page_sources(name, root=ROOT):
    """The page generator and the site_scripts helpers it imports (beyond the shared ones)."""
    path = root / "site_scripts" / "pages" / f"{name}.py"
    helpers = sorted(set(depends.Source(path.read_text()).site_modules) - {s[:-3] for s in SHARED} - {"pages"})
    return [path] + [root / "site_scripts" / f"{h}.py" for h in helpers]


def code_facts_text(units, root=ROOT):
    """Who calls each unit and which tests mention it: the pages print both."""
    from .code_facts import all_calls, all_test_mentions, called_through

    calls, tests, checks = all_calls(root), all_test_mentions(root), all_test_mentions(root, checking=True)
    names = sorted({unit for _, unit in units if unit != depends.MODULE})
    return "\n".join(f"{n}: {calls.get(n, [])} {called_through(n, root)} {tests.get(n, [])} {checks.get(n, [])}"
                     for n in names)


def titles_text(root=ROOT):
    """The title of every docs page: pages print each other's titles in links."""
    from .sections import markdown_title

    return "\n".join(markdown_title(p.read_text()) for p in sorted((root / "docs").rglob("*.md")))


def page_key(name, context, root=ROOT) -> str:
    """The hash of everything the page's output depends on (see the module docstring)."""
    import numpy

    units = depends.page_units(root / "site_scripts" / "pages" / f"{name}.py", root)
    digest = hashlib.sha256()
    for part in [*[p.read_text() for p in page_sources(name, root)],
                 *[(root / "site_scripts" / s).read_text() for s in SHARED],
                 depends.units_text(units, root), code_facts_text(units, root), titles_text(root),
                 numpy.__version__, torch_version(), json.dumps(context, sort_keys=True), extra_key(name, context)]:
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()


def extra_key(name, context):
    """What a generator declares beyond the code it reaches: its optional key_inputs(context) -> str
    (the mutants page hashes the whole package, the tests and the run's tools, which it runs in copies)."""
    module = importlib.import_module(f"site_scripts.pages.{name}")
    key_inputs = getattr(module, "key_inputs", None)
    return key_inputs(context) if key_inputs else ""


def torch_version():
    try:
        from importlib.metadata import version
        return version("torch")
    except Exception:  # noqa: BLE001 - no torch means no cross-check rows, which the key must reflect
        return "none"


def write_if_changed(path: Path, text: str) -> bool:
    if path.exists() and path.read_text() == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return True


def generate(name, context, force=False) -> bool:
    """Rerun one page's generator if its key changed. Returns True if it ran."""
    key = page_key(name, context)
    stamp = SNIPPETS / name / ".key"
    if not force and stamp.exists() and stamp.read_text() == key:
        return False
    module = importlib.import_module(f"site_scripts.pages.{name}")
    fragments = module.generate(context)
    for fragment, text in fragments.items():
        write_if_changed(SNIPPETS / name / f"{fragment}.md", text)
    for stale in set((SNIPPETS / name).glob("*.md")) - {SNIPPETS / name / f"{f}.md" for f in fragments}:
        stale.unlink()  # a fragment the generator no longer makes must not linger
    write_if_changed(stamp, key)
    return True


def generate_all(context, pages=None, force=False, log=print):
    """Check the equation ties, then run every (or the named) page generator."""
    from .markers import check_ties, collect_markers

    problems = check_ties(collect_markers())
    if problems:
        raise RuntimeError("equations and code are not tied:\n  " + "\n  ".join(problems))
    reran = []
    for name in pages or page_names():
        start = time.perf_counter()
        if generate(name, context, force):
            reran.append(name)
            log(f"generated page {name} in {time.perf_counter() - start:.1f} s")
    return reran


def main():
    parser = argparse.ArgumentParser(description="run the site's page generators")
    parser.add_argument("--page", nargs="+", choices=page_names(), help="only these pages")
    parser.add_argument("--force", action="store_true", help="rerun even when nothing changed")
    parser.add_argument("--repo-url", default="https://github.com/transformer-explained/transformer")
    args = parser.parse_args()
    reran = generate_all({"repo_url": args.repo_url}, args.page, args.force)
    print(f"reran: {', '.join(reran) or 'nothing (all up to date)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
