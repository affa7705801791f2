"""Run the page generators, each only when something it depends on changed.

A page generator is a module site_scripts/pages/<name>.py with a function
generate(context) -> {fragment name: markdown}. Its fragments are written to
build/snippets/<name>/<fragment>.md, which the docs pages include with
pymdownx.snippets (`--8<-- "<name>/<fragment>.md"`).

A page's cache key hashes everything its output depends on: its generator's
source, the shared site_scripts modules, the source of every transformer
module it imports (and what those import), the numpy and torch versions and
the build context (the repository URL). Files are rewritten only when their
content changes, so `mkdocs serve` does not rebuild forever.

    python -m site_scripts.build [--page NAME ...] [--force]
"""

import argparse
import ast
import hashlib
import importlib
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SNIPPETS = ROOT / "build" / "snippets"
PAGES_DIR = ROOT / "site_scripts" / "pages"
SHARED = ["build.py", "equations.py", "markers.py", "code_facts.py", "sections.py"]


def page_names():
    return sorted(p.stem for p in PAGES_DIR.glob("*.py") if not p.name.startswith("_"))


def transformer_dependencies(source: str) -> set:
    """transformer modules a source file imports, followed through their own imports."""
    todo, seen = set(_imports(source, absolute=True)), set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = ROOT / "transformer" / f"{name}.py"
        todo |= set(_imports(path.read_text(), absolute=False))
    return seen


def _imports(source, absolute):
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if absolute and node.module and node.module.startswith("transformer."):
                yield node.module.split(".")[1]
            elif absolute and node.module == "transformer":
                yield from (a.name for a in node.names if (ROOT / "transformer" / f"{a.name}.py").exists())
            elif not absolute and node.level == 1 and node.module:
                yield node.module.split(".")[0]
        elif isinstance(node, ast.Import) and absolute:
            yield from (a.name.split(".")[1] for a in node.names if a.name.startswith("transformer."))


def page_key(name, context) -> str:
    import numpy

    source = (PAGES_DIR / f"{name}.py").read_text()
    digest = hashlib.sha256()
    for part in [source, *[(ROOT / "site_scripts" / s).read_text() for s in SHARED],
                 *[(ROOT / "transformer" / f"{m}.py").read_text() for m in sorted(transformer_dependencies(source))],
                 numpy.__version__, _torch_version(), json.dumps(context, sort_keys=True)]:
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()


def _torch_version():
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
