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


@dataclass(frozen=True)
class Call(Place):
    """A call site, and the function of the package it calls, as the file's imports say ("module:name", the
    module that defines it): "" where the code does not say (a method, a function passed in as an argument,
    a builtin)."""
    unit: str = ""


def _imported(node, module, package):
    """{local name: (module, name)} bound by one import statement of the package's `module`: name None
    where the local name is a module (`from . import model`); {} for an import from outside the package."""
    if isinstance(node, ast.Import):
        return {alias.asname: (alias.name.removeprefix(f"{package}."), None) for alias in node.names
                if alias.asname and alias.name.startswith(f"{package}.")}
    source = node.module or ""
    if node.level == 0:  # `from transformer.model import forward`, `from transformer import model`
        if source != package and not source.startswith(f"{package}."):
            return {}
        source = source.removeprefix(package).removeprefix(".")
    elif node.level > 1 or "." in module:
        return {}  # beyond the package's one level
    if not source:
        return {alias.asname or alias.name: (alias.name, None) for alias in node.names}
    return {alias.asname or alias.name: (source, alias.name) for alias in node.names}


def _in_scope(nodes):
    """Every node among `nodes` and inside them, not looking inside the functions and classes they define:
    one scope's statements (those inside an if, a try or a loop too)."""
    for node in nodes:
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            yield from _in_scope(ast.iter_child_nodes(node))


def _imports_in(nodes, module, package):
    """The bindings of one scope's import statements among `nodes`."""
    found = {}
    for node in _in_scope(nodes):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.update(_imported(node, module, package))
    return found


def _local_names(fn):
    """The names a function binds itself, other than by importing: its parameters and what it assigns."""
    args = fn.args
    params = [*args.posonlyargs, *args.args, *args.kwonlyargs, *filter(None, (args.vararg, args.kwarg))]
    stored = (n.id for n in _in_scope(fn.body) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))
    return {a.arg for a in params} | set(stored)


@lru_cache(maxsize=256)
def _module_names(text, module, package):
    """(top-level functions and classes, {name: (module, name)} of the module-level imports) of one file."""
    tree = ast.parse(text)
    defined = {node.name for node in tree.body
               if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    return frozenset(defined), _imports_in(tree.body, module, package)


def _callee(func, names):
    """(module, name) that a call's function expression names through `names`, else None."""
    if isinstance(func, ast.Name) and names.get(func.id, (None, None))[1]:
        return names[func.id]
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        module, name = names.get(func.value.id, (None, ""))
        if module and name is None:  # `model.forward(...)` with `from . import model`
            return module, func.attr
    return None


@lru_cache(maxsize=256)
def _call_index(text, module, package):
    """({called name: {line: (innermost enclosing function, (module, name) it calls or None)}}, [(line, innermost
    enclosing function, (module, name)) of each name used there without being called]) for one file, each name
    resolved through the names in scope there: the module's top-level functions and imports, then each
    enclosing function's own imports; a parameter or a local variable of the same name hides them. A function
    named without a call is handed on as a value (an argument, a variable, a return value): whoever receives
    it calls it."""
    tree = ast.parse(text)
    defined, imports = _module_names(text, module, package)
    calls, named = {}, []

    def visit(node, function, names, called=False):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function, shadowed = node.name, _local_names(node)
            names = {**{k: v for k, v in names.items() if k not in shadowed}, **_imports_in(node.body, module, package)}
        if isinstance(node, ast.Call) and function and _name_of(node.func):
            calls.setdefault(_name_of(node.func), {})[node.lineno] = (function, _callee(node.func, names))
        elif function and not called and isinstance(getattr(node, "ctx", None), ast.Load):
            target = _callee(node, names)
            if target:
                named.append((node.lineno, function, target))
        for child in ast.iter_child_nodes(node):
            visit(child, function, names, called=isinstance(node, ast.Call) and child is node.func)

    visit(tree, None, {**{name: (module, name) for name in defined}, **imports})
    return calls, named


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
    """{called name: [Call of each call]} over the folder's .py files (a package: the folder's name is its
    name). A call of a function that a module only imports from another (a re-export) is resolved to the
    module that defines it."""
    return {name: sorted(calls, key=lambda c: (c.path, c.line)) for name, calls in _all_uses(root, folder)[0].items()}


def _all_uses(root, folder):
    """(all_calls, [Call of each place that names a function without calling it]); a class or a constant
    named without a call (`isinstance(w, NF4Weight)`) is not handed on to be called, and is left out."""
    files = {path.stem: read_text(path) for path in sorted((Path(root) / folder).glob("*.py"))}
    names = {module: _module_names(text, module, folder) for module, text in files.items()}
    functions = {f"{module}:{f}" for module, text in files.items() for f in _functions_of(text)}

    def defining(module, name):
        for _ in range(len(names)):
            defined, imports = names.get(module, (frozenset(), {}))
            if name in defined or name not in imports or imports[name][1] is None:
                break
            module, name = imports[name]
        return module

    calls, named = {}, []
    for module, text in files.items():
        rel = f"{folder}/{module}.py"
        index, names_of = _call_index(text, module, folder)
        for name, lines in index.items():
            calls.setdefault(name, []).extend(Call(rel, line, fn, f"{defining(*callee)}:{callee[1]}" if callee else "")
                                              for line, (fn, callee) in lines.items())
        named += [Call(rel, line, fn, f"{defining(*target)}:{target[1]}") for line, fn, target in names_of]
    return calls, [place for place in named if place.unit in functions]


@lru_cache(maxsize=256)
def _functions_of(text):
    """The names of a file's top-level functions."""
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    return frozenset(node.name for node in ast.parse(text).body if isinstance(node, functions))


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
    resolved = {}  # the calls that resolve to a function of this name, under its own name or another
    for call in (call for calls in calls.values() for call in calls if call.unit):
        resolved.setdefault(call.unit.partition(":")[2], []).append(call)
    return {n: f"{calls.get(n, [])} {resolved.get(n, [])} {through.get(n, [])} {tests.get(n, [])}"
            for n in {*calls, *resolved, *tests, *through}}


def called_by(unit, root=ROOT, folder="transformer"):
    """Every call of the function `unit` ("module:name") in the folder's .py files, with its innermost enclosing
    function: the calls that the imports in scope (or the module's own definition) tie to that module's
    function. A function of the same name elsewhere (`autograd_model.forward` beside `model.forward`) does not
    count, nor does a call of a function passed in as an argument (`passed_by` finds where it is named)."""
    calls = (call for calls in all_calls(root, folder).values() for call in calls if call.unit == unit)
    return sorted(calls, key=lambda c: (c.path, c.line))  # under its own name or another (`import ... as`)


def calls_named(name, root=ROOT, folder="transformer"):
    """Every call in the folder's .py files whose function expression ends in `name` (`f(...)`, `obj.f(...)`),
    whatever it resolves to: methods too."""
    return all_calls(root, folder).get(name, [])


def passed_by(unit, root=ROOT, folder="transformer"):
    """Every place in the folder's .py files that names the function `unit` ("module:name") inside a function
    without calling it, resolved as `called_by` resolves calls: where it is handed on as a value (an argument,
    a variable), to be called by whoever receives it."""
    return sorted((place for place in _all_uses(root, folder)[1] if place.unit == unit), key=lambda c: (c.path, c.line))


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
