"""Check that the test suite notices a backward output that is 0.1% off.

For every function named *_backward in transformer/, and for every output it
returns (each entry of a returned gradient dict counts separately), make a
copy of the project in a temporary folder (tools/project_copy.py) where that one
output is multiplied by 1.001, run the unit tests (tests/unit) against the copy,
and record whether they failed.
The working tree is never touched. Exit status 1 if any mutant survives.

    python -m tools.scale_backward_outputs [--list] [--only NAME ...] [-j 2]
"""

import argparse
import ast
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass


from tools.common import ROOT, parse
from tools.project_copy import UNIT_TESTS, project_copy, run_pytest

FACTOR = "1.001"
# Mutants that compute the same numbers as the original, so no test can (or
# should) catch them.
EQUIVALENT = {}


@dataclass(frozen=True)
class Mutant:
    path: str  # relative to ROOT
    function: str
    output: str  # which output is scaled
    start: tuple  # (line, col) of the expression, 1-based line
    end: tuple

    @property
    def name(self):
        return f"{self.function}:{self.output}"

    def apply(self, source: str) -> str:
        lines = source.splitlines(keepends=True)
        (l0, c0), (l1, c1) = self.start, self.end
        if l0 != l1:
            raise ValueError(f"{self.name}: multi-line expression")
        line = lines[l0 - 1]
        lines[l0 - 1] = line[:c0] + f"(({line[c0:c1]}) * {FACTOR})" + line[c1:]
        return "".join(lines)


def find_mutants(root=ROOT):
    mutants = []
    for path in sorted((root / "transformer").glob("*.py")):
        tree = parse(path.read_text())
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef) and fn.name.endswith("_backward"):
                mutants += _outputs(path.relative_to(root).as_posix(), fn)
    return mutants


def _outputs(path, fn):
    """The mutants of one backward: each output of each of its returns. A return that hands on another
    backward's result as it is (whole, or unpacked with *), a None (a frozen weight's missing gradient), and a
    dict filled elsewhere are left out: they are mutated in the function that computes them, or are not numbers."""
    dicts = {t.id: node.value for node in ast.walk(fn) if isinstance(node, ast.Assign)
             for t in node.targets if isinstance(t, ast.Name) and isinstance(node.value, ast.Dict)}
    found, seen, handed_on = [], set(), False
    for ret in _returns(fn.body):
        if _calls_a_backward(ret.value):
            handed_on = True  # it returns another backward's outputs as they are: they are mutated in that function
            continue
        for element in _elements(ret.value):
            label = ast.unparse(element)
            if isinstance(element, ast.Starred) and _calls_a_backward(element.value):
                handed_on = True
                continue
            if isinstance(element, ast.Constant) and element.value is None:
                continue
            if isinstance(element, ast.Name) and element.id in dicts:  # a dict of gradients: each entry
                for key, item in zip(dicts[element.id].keys, dicts[element.id].values):
                    if key is None:
                        continue  # a **spread of another function's dict: mutated in that function
                    found.append(Mutant(path, fn.name, f"{label}[{ast.literal_eval(key)!r}]",
                                        (item.lineno, item.col_offset), (item.end_lineno, item.end_col_offset)))
                continue
            name = label if label not in seen else f"{label} (line {element.lineno})"  # another return's
            seen.add(label)
            found.append(Mutant(path, fn.name, name, (element.lineno, element.col_offset),
                                (element.end_lineno, element.end_col_offset)))
    if not found and not handed_on:
        raise ValueError(f"{fn.name} returns nothing to mutate")
    return found


def _returns(body):
    """Each `return value` in a block and the blocks inside it (not in functions defined there)."""
    for stmt in body:
        if isinstance(stmt, ast.Return) and stmt.value is not None:
            yield stmt
        if not isinstance(stmt, (ast.FunctionDef, ast.ClassDef)):
            for field in ("body", "orelse", "finalbody"):
                if isinstance(getattr(stmt, field, None), list):
                    yield from _returns(getattr(stmt, field))


def _calls_a_backward(node):
    """A call of a backward, by its name (`linear_backward(...)`) or as a method (`cache.linear_backward(...)`)."""
    if not isinstance(node, ast.Call):
        return False
    name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
    return name.endswith("_backward")


def _elements(value):
    """The outputs of a returned value: the entries of a tuple, and of the tuples inside it."""
    if isinstance(value, ast.Tuple):
        return [e for element in value.elts for e in _elements(element)]
    return [value]


def run_mutant(mutant, pytest_args):
    def scale(copy):
        target = copy / mutant.path
        target.write_text(mutant.apply(target.read_text()))

    with project_copy(scale) as copy:
        result = run_pytest(copy, pytest_args)
    return mutant, result.returncode, list(result.failed)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--only", nargs="+", default=None, help="mutant names (function:output) to run")
    parser.add_argument("-j", "--jobs", type=int, default=2)
    # The unit tests: the site's and the tools' tests (tests/site) check no arithmetic, and the copies do not
    # carry what they read (docs/, site_scripts/, tools/).
    parser.add_argument("pytest_args", nargs="*", default=[UNIT_TESTS],
                        help=f"what pytest runs (default: {UNIT_TESTS})")
    args = parser.parse_args()
    mutants = find_mutants()
    if args.only:
        mutants = [m for m in mutants if m.name in args.only]
    if args.list:
        for m in mutants:
            print(f"{m.name:<40} {m.path}:{m.start[0]}")
        return 0
    equivalent = [m for m in mutants if m.name in EQUIVALENT]
    for m in equivalent:
        print(f"{m.name:<40} not run: equivalent mutant ({EQUIVALENT[m.name]})")
    mutants = [m for m in mutants if m.name not in EQUIVALENT]
    survivors = 0
    with ThreadPoolExecutor(args.jobs) as pool:
        for mutant, code, failed in pool.map(lambda m: run_mutant(m, args.pytest_args), mutants):
            caught = code == 1 and failed  # 1: tests failed; 2-5 would be a broken run, not a catch
            survivors += not caught
            what = f"caught by {failed[0]}" if caught else f"SURVIVED (pytest exit {code})"
            print(f"{mutant.name:<40} {what}", flush=True)
    print(f"{len(mutants) - survivors} of {len(mutants)} scaled outputs caught "
          f"({len(equivalent)} equivalent mutant(s) not run)")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
