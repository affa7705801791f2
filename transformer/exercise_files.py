"""The reader's file: its skeleton, the reference solution in the same form, and loading it to be graded.

A skeleton holds, for each function of an exercise, the reference's signature and docstring (shapes, the cache
it returns), the ids of the equations its lines compute, and a body that raises NotImplementedError. Its header
imports what the reference function uses from elsewhere (numpy, the cache's NamedTuple, the helpers of its
module), read from the function's own code, so that the reader writes the function and nothing else.
"""

import ast
import builtins
import importlib
import importlib.util
import inspect
import re
import sys
import textwrap
import types
from pathlib import Path

from .errors import TransformerError

EQ_MARKER = re.compile(r"eq:([a-z0-9-]+)")


class ExerciseError(TransformerError):
    """An exercise that does not exist, or a reader's file that is missing or would be overwritten."""


def reference(module, name):
    """The reference function (or class) `name` of `transformer.<module>`."""
    return getattr(importlib.import_module(f"transformer.{module}"), name)


def equations(module, name):
    """The ids of the equations the reference function's lines compute (their `# eq:<id>` markers), in order."""
    found = EQ_MARKER.findall(inspect.getsource(reference(module, name)))
    return list(dict.fromkeys(found))


def imports(exercise):
    """The import lines of the exercise's file: every global name its reference functions read that is not
    itself one of them, a builtin or defined in the function."""
    lines, names = [], {}
    for module, name in exercise.functions:
        tree = ast.parse(textwrap.dedent(inspect.getsource(reference(module, name))))
        loads = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        space = vars(importlib.import_module(f"transformer.{module}"))
        for used in sorted(loads):
            if used in space and used not in {f for _, f in exercise.functions} and not hasattr(builtins, used):
                names[used] = (module, space[used])
    froms = {}
    for used, (module, value) in sorted(names.items()):
        if isinstance(value, types.ModuleType):
            lines.append(f"import {value.__name__}" + ("" if value.__name__ == used else f" as {used}"))
        else:  # from the module that defines it, where that is the package's
            home = getattr(value, "__module__", None) or ""
            froms.setdefault(home if home.startswith("transformer.") else f"transformer.{module}", []).append(used)
    lines += [f"from {home} import {', '.join(sorted(used))}" for home, used in froms.items()]
    return sorted(set(lines), key=lambda line: (not line.startswith("import"), line))


def stub(module, name, page):
    """A function's skeleton: the reference's signature and docstring, its equations, a body that raises."""
    source = source_of(module, name)
    node = ast.parse(source).body[0]
    lines = source.splitlines()
    signature = "\n".join(lines[node.lineno - 1:node.body[0].lineno - 1])  # the def line(s), as written
    doc = textwrap.indent(ast.get_docstring(node) or "", "    ")
    eqs = ", ".join(equations(module, name)) or "none"
    return (f"{signature}\n    \"\"\"{doc.strip()}\n\n    Equations (on {page}): {eqs}\n    \"\"\"\n"
            f"    raise NotImplementedError(\"{name}: write it here\")\n")


def source_of(module, name):
    """The reference function's own source, as its file has it."""
    return textwrap.dedent(inspect.getsource(reference(module, name)))


def header(exercise, what):
    return (f'"""{what} of the exercise `{exercise.name}`: {exercise.title}.\n\n'
            f"Grade it with:  python -m transformer exercise check {exercise.name} PATH\n\"\"\"\n\n"
            + "\n".join(imports(exercise)) + "\n")


def skeleton(exercise):
    """The text of the file `exercise start` writes."""
    stubs = "\n\n".join(stub(module, name, exercise.page) for module, name in exercise.functions)
    return header(exercise, "Your implementation") + "\n\n" + stubs


def solution(exercise):
    """The reference implementation in the skeleton's form: what the grader must pass (the tests grade it, and
    each mutant of the mutation catalogue made from it)."""
    sources = "\n\n".join(source_of(module, name) for module, name in exercise.functions)
    return header(exercise, "The reference implementation") + "\n\n" + sources


def load(path, exercise):
    """The reader's module, run from its file; an ExerciseError for a missing file, a SyntaxError as it is."""
    path = Path(path)
    if not path.is_file():
        raise ExerciseError(f"{path} does not exist; write one with: python -m transformer exercise start "
                            f"{exercise.name} --dir {path.parent}")
    spec = importlib.util.spec_from_file_location(f"exercise_{exercise.name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.pop(spec.name, None)
    spec.loader.exec_module(module)
    return module
