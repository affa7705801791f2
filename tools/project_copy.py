"""A temporary copy of the project, and pytest run in it: what the mutation tools (tools/mutants.py,
tools/scale_backward_outputs.py) and tools/checked_by.py do, so that the working tree is never touched.

The copy holds the package, the unit tests (tests/unit: the tests that judge the model), pyproject.toml
(pytest's settings) and, where set-up has fetched them, GPT-2's tokenizer files (data/gpt2, which the
tokenizer's tests read); nothing of the site or the tools.
"""

import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .common import ROOT

UNIT_TESTS = "tests/unit"
COPIED = ("transformer", UNIT_TESTS, "pyproject.toml")
COPIED_IF_THERE = ("data/gpt2",)  # fetched by scripts/setup, not in git


@contextmanager
def project_copy(change=None, prefix="mutant-", source=ROOT):
    """A temporary folder holding COPIED as in `source` (the working tree, or another copy: a run takes one copy
    of the tree as it was when it started, computes its keys from it and copies it for each check, so an edit
    made meanwhile changes neither); `change(folder)` edits it before use."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        copy = Path(tmp)
        for item in COPIED + tuple(i for i in COPIED_IF_THERE if (Path(source) / i).exists()):
            src = Path(source) / item
            if src.is_dir():
                shutil.copytree(src, copy / item, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy(src, copy / item)
        if change is not None:
            change(copy)
        yield copy


def run_in(copy, cmd, timeout=None, threads=None, env=None):
    """Run `cmd` in the copy, which is what `transformer` imports there; None when it ran past `timeout`.
    `threads` caps the BLAS and OpenMP threads (the default: as many as they take); `env` adds variables."""
    env = dict(os.environ, **(env or {}), PYTHONPATH=str(copy), PYTHONDONTWRITEBYTECODE="1")
    if threads is not None:
        env.update(OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    try:
        return subprocess.run(cmd, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


@dataclass(frozen=True)
class PytestRun:
    returncode: int
    failures: tuple  # node ids of the FAILED and ERROR lines of pytest's summary, in its order
    failed: tuple  # those of the FAILED lines alone
    reasons: tuple  # for each of `failures`, what its line says after the node id (the exception), or ""
    summary: str  # pytest's last line counting what passed ("12 passed in 3.40s"), or ""
    stderr: str


def run_pytest(copy, args=(UNIT_TESTS,), timeout=None, threads=None):
    """pytest -x on `args` in the copy (it stops at the first failure); None when it ran past `timeout`."""
    # pytest cuts each summary line to the terminal's width, the exception first: room for it after a long id
    result = run_in(copy, [sys.executable, "-m", "pytest", *args, "-x", "-q", "-p", "no:cacheprovider"],
                    timeout, threads, env={"COLUMNS": "300"})
    if result is None:
        return None
    lines = result.stdout.splitlines()
    named = []  # (FAILED or ERROR, the test's node id, what the line says after " - ")
    for line in lines:
        if line.startswith(("FAILED ", "ERROR ")):
            kind, rest = line.split(" ", 1)
            test, _, why = rest.partition(" - ")
            named.append((kind, test, why.rstrip(": ")))
    passed = [line for line in lines if " passed" in line]
    return PytestRun(result.returncode, tuple(test for _, test, _ in named),
                     tuple(test for kind, test, _ in named if kind == "FAILED"), tuple(why for _, _, why in named),
                     passed[-1].strip("= ") if passed else "", result.stderr)
