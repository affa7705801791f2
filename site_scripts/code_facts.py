"""Facts about the code, read from the code: where a function is, who calls
it, which tests exercise it. The pages print these; nothing is typed by hand.
"""

import ast
import inspect
from dataclasses import dataclass
from pathlib import Path

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


def _functions_with_nodes(tree):
    """(function name, node) for every node inside each top-level or nested function."""
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                yield fn.name, node


def _mentions(node, name):
    return (isinstance(node, ast.Name) and node.id == name) or (isinstance(node, ast.Attribute) and node.attr == name)


def called_by(name, root=ROOT, folder="transformer"):
    """Every call of `name` in the folder's .py files, with its enclosing function.

    A call inside a nested function is reported once, for the innermost function.
    """
    places = {}
    for path in sorted((Path(root) / folder).glob("*.py")):
        tree = ast.parse(path.read_text())
        for fn_name, node in _functions_with_nodes(tree):
            if isinstance(node, ast.Call) and _mentions(node.func, name):
                key = (path, node.lineno)
                # ast.walk visits outer functions first; the innermost one wins.
                places[key] = Place(path.relative_to(root).as_posix(), node.lineno, fn_name)
    return sorted(places.values(), key=lambda p: (p.path, p.line))


def tested_by(name, root=ROOT, folder="tests"):
    """Test functions that call or reference `name`, as pytest node ids."""
    found = []
    for path in sorted((Path(root) / folder).glob("test_*.py")):
        tree = ast.parse(path.read_text())
        for fn in tree.body:
            if isinstance(fn, ast.FunctionDef) and fn.name.startswith("test_"):
                if any(_mentions(node, name) for node in ast.walk(fn)):
                    found.append(f"{path.relative_to(root).as_posix()}::{fn.name}")
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
