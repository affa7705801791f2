"""What the tools share, and the site build takes from them: the project root, hashing, the versions a result
depends on, the cores, and the corpus the training checks read.

The lowest module above the package: it imports nothing from the project, so every tool and the site build
(site_scripts/, which sits above tools/) can use it. Run the tools from the project root, as `python -m
tools.NAME`.
"""

import ast
import hashlib
import json
import os
from functools import cache, lru_cache
import platform
import subprocess
import sys
import threading
import tomllib
from pathlib import Path

from transformer.parallel import cores  # noqa: F401  (the tools import it from here)

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "data" / "tinyshakespeare" / "input.txt"
FETCH_CORPUS = ROOT / "scripts" / "fetch_corpus.py"  # puts the corpus in place, verified against its SHA-256
# The packages whose version can change what a check computes or which tests run (a test skips without
# bitsandbytes, scipy or hypothesis): the environment of a stored result.
CHECKED_PACKAGES = ("numpy", "scipy", "torch", "pytest", "hypothesis", "bitsandbytes")
_PARSING = threading.Lock()


def parse(source):
    """ast.parse, one call at a time in a process. CPython keeps the depth of the tree it is building once per
    interpreter, so two threads parsing at once can fail with "SystemError: AST constructor recursion depth
    mismatch" (python/cpython#106905); the site build brings both reports up to date in threads side by side,
    and the mutation run applies mutants in threads. The tools parse through here."""
    with _PARSING:
        return ast.parse(source)


def package_version(name):
    """An installed package's version, read from its metadata (nothing is imported), or "none"."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "none"


def numpy_version():
    return package_version("numpy")


def torch_version():
    return package_version("torch")


@cache
def environment():
    """The Python and the versions of CHECKED_PACKAGES, as one text: part of the key of every stored result
    of a check."""
    versions = ", ".join(f"{name} {package_version(name)}" for name in CHECKED_PACKAGES)
    return f"Python {platform.python_version()} on {platform.machine()}; {versions}"


def blas_threads_env(count):
    """The environment variables that give a process started with them at most `count` BLAS and OpenMP threads."""
    return dict.fromkeys(("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"), str(count))


def positive_int(text):
    """An argparse type: a whole number of at least 1 (a job count, say)."""
    value = int(text)
    if value < 1:
        import argparse

        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def hash_parts(*parts) -> str:
    """A SHA-256 of text parts, each ended by a NUL so that ("ab", "c") and ("a", "bc") differ."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part if isinstance(part, bytes) else str(part).encode())
        digest.update(b"\0")
    return digest.hexdigest()


def pytest_settings(root=ROOT):
    """pyproject.toml's `[tool.pytest.ini_options]` as one text: all of that file a test's result can depend on.
    A key holds this, not the whole file, so that editing the project's dependency lists or metadata does not
    make every stored test result stale."""
    with open(Path(root) / "pyproject.toml", "rb") as f:
        table = tomllib.load(f)["tool"]["pytest"]["ini_options"]
    return "pyproject.toml [tool.pytest.ini_options]\0" + json.dumps(table, sort_keys=True)


def files_text(*names, root=ROOT, code=False):
    """The paths and texts of the named files and of the .py files under the named folders, in order: what a
    key holds of them (with code=True, each .py file as `code_text`). Each folder is listed once per
    process; the files are read again whenever their size or modification time changed."""
    paths = [p for name in names for p in _files(Path(root), name)]
    states = tuple((p, *_stat(p)) for p in paths)
    return _joined(Path(root), states, code)


@lru_cache(maxsize=256)
def _files(root, name):
    folder = root / name
    if not folder.is_dir():
        return (str(folder),)
    return tuple(sorted(str(p) for p in folder.rglob("*.py") if "__pycache__" not in p.parts))


def _stat(path):
    stat = os.stat(path)
    return stat.st_mtime_ns, stat.st_size


@lru_cache(maxsize=512)
def _joined(root, states, code):
    cut = len(str(root)) + 1
    texts = (_read(path, mtime, size) for path, mtime, size in states)
    return "".join(f"{path[cut:]}\0{code_text(text) if code and path.endswith('.py') else text}\0"
                   for (path, _, _), text in zip(states, texts))


@lru_cache(maxsize=1024)
def code_text(source):
    """Python source as the interpreter sees it: without comments, docstrings or layout (the code `ast` reads,
    written back). A key that holds code this way does not change when only its words do."""
    tree = parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree)


def read_text(path):
    """A file's text, read again only when its size or modification time changed (a key reads the same files
    many times)."""
    return _read(str(path), *_stat(path))


@lru_cache(maxsize=2048)
def _read(path, mtime_ns, size):
    return Path(path).read_text()


def ensure_corpus():
    """Put the corpus in place, verified against the SHA-256 that scripts/fetch_corpus.py pins (it copies or
    downloads it when it is missing or another file)."""
    subprocess.run([sys.executable, str(FETCH_CORPUS)], check=True)


def pinned_corpus_digest():
    """The SHA-256 that scripts/fetch_corpus.py requires of the corpus, read from its source (not run)."""
    import ast

    for node in parse(FETCH_CORPUS.read_text()).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["SHA256"]:
            return ast.literal_eval(node.value)
    raise ValueError(f"{FETCH_CORPUS.relative_to(ROOT)} pins no SHA256")
