"""Facts about the code, read from the code: where a function is, who calls it, which tests name it. The
pages print these; nothing is typed by hand. (Which tests check a function is measured instead, by running
them: tools/checked_by.py.)"""

import ast
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .common import ROOT, stamps
from .depends import read_text


@dataclass(frozen=True)
class Place:
    path: str  # relative to the project root
    line: int  # 1-based
    function: str  # the enclosing function ("<module>" at top level)


def _name_of(node):
    """The name an expression ends in (`f` or `obj.f`), else None: what a call calls, what a test mentions."""
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
                if isinstance(node, ast.Call) and _name_of(node.func):
                    # ast.walk visits outer functions first; the innermost one wins.
                    index.setdefault(_name_of(node.func), {})[node.lineno] = fn.name
    return index


@lru_cache(maxsize=256)
def _test_index(text):
    """[(test function, {mentioned name: first line})]."""
    tests = []
    for fn in ast.parse(text).body:
        if isinstance(fn, ast.FunctionDef) and fn.name.startswith("test_"):
            first = {}
            for node in ast.walk(fn):
                name = _name_of(node)
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


@lru_cache(maxsize=256)
def _tables_and_uses(text):
    """({function name: [(table, line)]} for module-level assignments that hold functions, {name: {line:
    function}} for every mention of a name inside a function)."""
    tree = ast.parse(text)
    tables = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            for n in ast.walk(node.value):
                if isinstance(n, ast.Name):
                    tables.setdefault(n.id, []).append((node.targets[0].id, node.lineno))
    uses = {}
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for n in ast.walk(fn):
                if isinstance(n, ast.Name):
                    uses.setdefault(n.id, {})[n.lineno] = fn.name
    return tables, uses


def called_through(name, root=ROOT, folder="transformer"):
    """[(table Place, [Places of the functions that use the table])] for each module-level table (a dict or
    tuple assigned at top level) that holds the function `name`."""
    return _tables_index(str(root), stamps(root, folder, "*.py")).get(name, [])


@lru_cache(maxsize=8)
def _tables_index(root, stamps):
    """called_through for every name at once, built once per state of the files (the cache keys of a
    build ask about each unit of each page: a thousand questions about the same files)."""
    indexes = {Path(path): _tables_and_uses(read_text(path)) for path, *_ in stamps}
    found = {}
    for path, (tables, _) in indexes.items():
        for name, entries in tables.items():
            for table, line in entries:
                users = [Place(p.relative_to(root).as_posix(), use_line, fn)
                         for p, (_, uses) in indexes.items() for use_line, fn in uses.get(table, {}).items()]
                users.sort(key=lambda u: (u.path, u.line))
                found.setdefault(name, []).append((Place(path.relative_to(root).as_posix(), line, table), users))
    return found


def all_test_mentions(root=ROOT, folder="tests"):
    """{name: [Place of the first mention in each test function]} over the test files. A mention says a test
    names a function, not that it checks it: which tests check what is measured (tools/checked_by.py)."""
    found = {}
    for path in sorted((Path(root) / folder).rglob("test_*.py"), key=lambda p: p.name):  # tests/unit, tests/site
        rel = path.relative_to(root).as_posix()
        for fn_name, first in _test_index(read_text(path)):
            for name, line in first.items():
                found.setdefault(name, []).append(Place(rel, line, fn_name))
    return found


def facts_by_name(root=ROOT):
    """{name: what the pages print of it (its calls in transformer/, the tables it is called through, the
    tests naming it)} for every name at once, worked out once per state of transformer/ and tests/: the
    cache key of every page holds the facts of each of its units, thousands of questions about the same
    files."""
    return _facts_by_name(str(root), stamps(root, "transformer", "*.py") + stamps(root, "tests", "**/test_*.py"))


@lru_cache(maxsize=4)
def _facts_by_name(root, _stamps):
    calls, tests = all_calls(root), all_test_mentions(root)
    through = _tables_index(root, stamps(root, "transformer", "*.py"))
    return {n: f"{calls.get(n, [])} {through.get(n, [])} {tests.get(n, [])}" for n in {*calls, *tests, *through}}


def called_by(name, root=ROOT, folder="transformer"):
    """Every call of `name` in the folder's .py files, with its innermost enclosing function."""
    return all_calls(root, folder).get(name, [])


def test_mentions(name, root=ROOT, folder="tests"):
    """Each test function that mentions `name`, at its first line doing so."""
    return all_test_mentions(root, folder).get(name, [])


def _top_level(path, root):
    """(name, first line with decorators, last line) of each top-level function and class of a file."""
    return _top_level_of(read_text(Path(root) / path))


@lru_cache(maxsize=256)
def _top_level_of(text):  # parsed once per text: every equation of every page asks
    return tuple((node.name, min([node.lineno] + [d.lineno for d in node.decorator_list]), node.end_lineno)
                 for node in ast.parse(text).body
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))


def top_level_function(path, line, root=ROOT):
    """(name, first line, last line) of the top-level function or class holding `line`."""
    found = next((place for place in _top_level(path, root) if place[1] <= line <= place[2]), None)
    if found is None:
        raise LookupError(f"{path}:{line} is not inside a top-level function")
    return found


def named_function(path, name, root=ROOT):
    """(name, first line, last line) of the top-level function or class `name` of `path`."""
    found = next((place for place in _top_level(path, root) if place[0] == name), None)
    if found is None:
        raise LookupError(f"{path} has no top-level function {name}")
    return found


def enclosing_function(path, line, root=ROOT):
    """The name of the innermost function that contains `line` of `path`."""
    tree = ast.parse((Path(root) / path).read_text())
    best = None
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.lineno <= line <= fn.end_lineno:
            if best is None or fn.lineno >= best.lineno:
                best = fn
    return best.name if best else "<module>"
