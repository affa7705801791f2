"""The command `exercise`: list the exercises, write one's skeleton, grade the reader's file.

    transformer exercise list
    transformer exercise start layernorm [--dir exercises] [--force]
    transformer exercise check layernorm [exercises/layernorm.py]
"""

from pathlib import Path

from .errors import TransformerError

DEFAULT_DIR = "exercises"


def add_exercise_parser(sub):
    ex = sub.add_parser("exercise", help="write a function of the model yourself and have it graded",
                        description="Exercises: `start` writes a skeleton (signatures, docstrings, the equations "
                                    "to read) into a folder of your choosing; `check` grades your file with the "
                                    "project's own checks and says which property fails and where to read.")
    actions = ex.add_subparsers(dest="action", required=True)
    actions.add_parser("list", help="the exercises, with the functions each asks for")
    start = actions.add_parser("start", help="write an exercise's skeleton to DIR/NAME.py")
    start.add_argument("name", help="the exercise (see `exercise list`)")
    start.add_argument("--dir", default=DEFAULT_DIR, help=f"the folder to write into (default: {DEFAULT_DIR})")
    start.add_argument("--force", action="store_true", help="replace the file if it exists (your work in it is lost)")
    check = actions.add_parser("check", help="grade your file")
    check.add_argument("name", help="the exercise (see `exercise list`)")
    check.add_argument("path", nargs="?", help=f"your file (default: {DEFAULT_DIR}/NAME.py)")


def find(name):
    from .exercises import EXERCISES

    if name not in EXERCISES:
        raise TransformerError(f"no exercise {name!r}; there are: {', '.join(EXERCISES)}")
    return EXERCISES[name]


def cmd_exercise(args):
    from .exercises import EXERCISES, grade, load, skeleton

    if args.action == "list":
        for e in EXERCISES.values():
            print(f"{e.name:<12} {e.title}  ({', '.join(n for _, n in e.functions)}; read docs/{e.page})")
        return 0
    exercise = find(args.name)
    if args.action == "start":
        target = Path(args.dir) / f"{exercise.name}.py"
        if target.exists() and not args.force:
            raise TransformerError(f"{target} exists; pass --force to replace it (your work in it would be lost)")
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_name(f".{target.name}.tmp")
        temporary.write_text(skeleton(exercise), encoding="utf-8")
        temporary.replace(target)  # whole or not at all
        print(f"wrote {target}; write the functions, then: python -m transformer exercise check {exercise.name} "
              f"{target}")
        return 0
    path = Path(args.path or Path(DEFAULT_DIR) / f"{exercise.name}.py")
    try:
        module = load(path, exercise)
    except TransformerError:
        raise
    except Exception as e:  # noqa: BLE001  (the reader's file does not run: say why, without a traceback)
        line = getattr(e, "lineno", None)
        print(f"FAIL  {path} does not run: {type(e).__name__}: {e}" + (f" (line {line})" if line and
                                                                         "line" not in str(e) else ""))
        return 1
    results = grade(exercise, module)
    for r in results:
        if r.skipped:
            print(f"skip  {r.property}: {r.message}")
        else:
            print(f"pass  {r.property}" if r.passed else f"FAIL  {r.property}: {r.message}\n      read: docs/{r.read}")
    passed, skipped = sum(r.passed for r in results), sum(r.skipped for r in results)
    ran = len(results) - skipped
    print(f"{passed} of {ran} checks pass" + (f" ({skipped} skipped)" if skipped else "")
          + (f": {exercise.name} done" if passed == ran else ""))
    return 0 if passed == ran else 1
