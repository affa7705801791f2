"""Facts about the code, read from the code: where a function is, who calls
it, which tests exercise it. The pages print these; nothing is typed by hand.
"""

import ast
import inspect
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .depends import read_text

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Place:
    path: str  # relative to the project root
    line: int  # 1-based
    function: str  # the enclosing function ("<module>" at top level)


def function_location(func):
    """(path, first line, last line) of a function's source, as the file numbers it."""
    lines, start = inspect.getsourcelines(func)
    path = Path(inspect.getsourcefile(func)).resolve().relative_to(ROOT).as_posix()
    return path, start, start + len(lines) - 1


def _called_name(func):
    """The name a call's function expression ends in (f(...) or obj.f(...)), else None."""
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _mentioned_name(node):
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


@lru_cache(maxsize=256)
def _call_index(text):
    """{called name: {line: innermost enclosing function}} for one source file."""
    index = {}
    for fn in ast.walk(ast.parse(text)):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and _called_name(node.func):
                    # ast.walk visits outer functions first; the innermost one wins.
                    index.setdefault(_called_name(node.func), {})[node.lineno] = fn.name
    return index


@lru_cache(maxsize=256)
def _test_index(text):
    """[(test function, {mentioned name: first line})] for one test file."""
    tests = []
    for fn in ast.parse(text).body:
        if isinstance(fn, ast.FunctionDef) and fn.name.startswith("test_"):
            first = {}
            for node in ast.walk(fn):
                name = _mentioned_name(node)
                if name and (name not in first or node.lineno < first[name]):
                    first[name] = node.lineno
            tests.append((fn.name, first))
    return tests


def all_calls(root=ROOT, folder="transformer"):
    """{called name: [Place of each call]} over the folder's .py files."""
    found = {}
    for path in sorted((Path(root) / folder).glob("*.py")):
        rel = path.relative_to(root).as_posix()
        for name, lines in _call_index(read_text(path)).items():
            found.setdefault(name, []).extend(Place(rel, line, fn) for line, fn in lines.items())
    return {name: sorted(places, key=lambda p: (p.path, p.line)) for name, places in found.items()}


def all_test_mentions(root=ROOT, folder="tests"):
    """{name: [Place of the first mention in each test function]} over the test files."""
    found = {}
    for path in sorted((Path(root) / folder).glob("test_*.py")):
        rel = path.relative_to(root).as_posix()
        for fn_name, first in _test_index(read_text(path)):
            for name, line in first.items():
                found.setdefault(name, []).append(Place(rel, line, fn_name))
    return found


def called_by(name, root=ROOT, folder="transformer"):
    """Every call of `name` in the folder's .py files, with its enclosing function.

    A call inside a nested function is reported once, for the innermost function.
    """
    return all_calls(root, folder).get(name, [])


def test_mentions(name, root=ROOT, folder="tests"):
    """Each test function that calls or references `name`, at its first line doing so."""
    return all_test_mentions(root, folder).get(name, [])


def tested_by(name, root=ROOT, folder="tests"):
    """Test functions that call or reference `name`, as pytest node ids."""
    return [f"{p.path}::{p.function}" for p in test_mentions(name, root, folder)]


def top_level_function(path, line, root=ROOT):
    """(name, first line, last line) of the top-level function or class holding `line`."""
    tree = ast.parse((Path(root) / path).read_text())
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            if first <= line <= node.end_lineno:
                return node.name, first, node.end_lineno
    raise LookupError(f"{path}:{line} is not inside a top-level function")


def named_function(path, name, root=ROOT):
    """(name, first line, last line) of the top-level function or class `name` of `path`."""
    tree = ast.parse((Path(root) / path).read_text())
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            return node.name, first, node.end_lineno
    raise LookupError(f"{path} has no top-level function {name}")


def enclosing_function(path, line, root=ROOT):
    """The name of the innermost function that contains `line` of `path`."""
    tree = ast.parse((Path(root) / path).read_text())
    best = None
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.lineno <= line <= fn.end_lineno:
            if best is None or fn.lineno >= best.lineno:
                best = fn
    return best.name if best else "<module>"
