"""An exercise, and grading a reader's module with its checks."""

import importlib
import traceback
from dataclasses import dataclass, field

from .exercise_checks import Failed, Skipped
from .exercise_files import equations


@dataclass(frozen=True)
class Exercise:
    name: str  # what the reader types: `transformer exercise start layernorm`
    title: str
    page: str  # the page (under docs/) that derives the functions
    functions: tuple  # (module of transformer, function name), the ones the reader writes, in order
    checks: list = field(default_factory=list)

    def read(self, check, role=None):
        """Where to read when a check fails: the page and the equations of the function it tests (`role`:
        "forward" or "backward" instead of the check's own place)."""
        role = role or check.read
        if role in ("forward", "backward"):
            names = [name for _, name in self.functions if role in name] or [name for _, name in self.functions]
            eqs = list(dict.fromkeys(eq for module, name in self.functions if name in names
                                     for eq in equations(module, name)))
            more = f", and {len(eqs) - 3} more" if len(eqs) > 3 else ""
            return f"{self.page}" + (f"#eq-{eqs[0]} (equations {', '.join(eqs[:3])}{more})" if eqs else "")
        return f"{self.page}{role}"


class Space:
    """What a check calls: the reader's functions of the exercise, and the project's for everything else (the
    block exercise's forward, say). `Space(exercise)` alone is the reference."""

    def __init__(self, exercise, reader=None):
        self._modules = [importlib.import_module(f"transformer.{m}") for m in dict.fromkeys(m for m, _ in
                                                                                            exercise.functions)]
        self._own = {name: getattr(reader, name, None) for _, name in exercise.functions} if reader else {}

    def __getattr__(self, name):
        if name in self._own:
            if self._own[name] is None:
                raise Failed(f"the file defines no function {name}")
            return self._own[name]
        for module in self._modules:
            if hasattr(module, name):
                return getattr(module, name)
        raise AttributeError(name)


@dataclass(frozen=True)
class Result:
    property: str
    passed: bool
    message: str = ""  # what was seen, for a failed check; why it did not run, for a skipped one
    read: str = ""
    skipped: bool = False


def grade(exercise, reader):
    """Every check of the exercise on the reader's module, in order: a list of Result."""
    mine, ref = Space(exercise, reader), Space(exercise)
    results = []
    for check in exercise.checks:
        try:
            check.run(mine, ref)
        except Skipped as e:
            results.append(Result(check.property, False, str(e), skipped=True))
        except Failed as e:
            results.append(Result(check.property, False, str(e), exercise.read(check, e.read)))
        except NotImplementedError as e:
            results.append(Result(check.property, False, f"not written yet ({e})", exercise.read(check)))
        except Exception as e:  # noqa: BLE001  (the reader's code may raise anything; say what and where)
            where = traceback.extract_tb(e.__traceback__)[-1]
            results.append(Result(check.property, False, f"raised {type(e).__name__}: {e} (at {where.filename}, "
                                                         f"line {where.lineno})", exercise.read(check)))
        else:
            results.append(Result(check.property, True))
    return results
