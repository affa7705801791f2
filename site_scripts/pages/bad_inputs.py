"""Generator of the Bad inputs page: every mistake of the catalogue (tools/bad_input_cases.py) run through the
real library and the real command line at build time, with the exact messages, exit statuses and what happened to
the files. The checks that keep a wrong result off the page are in tools/refusals.py.
"""

import ast
from collections import Counter
import shutil
import tempfile
from pathlib import Path

import numpy as np

from tools.bad_input_cases import CASES, GROUP_NOTES, GROUPS, SEED, run_every_case, setup, setup_text
from tools.refusals import Case, run_call, run_command, run_optimized

from .. import sections

PAGE = "bad_inputs"


def defined_tests(root=sections.ROOT):
    """{test function: the files under tests/ that define it}: the cases name their tests by function
    only, so a test file that moves to another folder is still found, and the page prints where."""
    found = {}
    for path in sorted(root.glob("tests/**/test_*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef):
                found.setdefault(node.name, []).append(path.relative_to(root).as_posix())
    return found


def checked_by(case, files):
    """The pytest ids of the case's tests; refuse a test that is not there, or is in two files."""
    for test in case.tests:
        if len(files.get(test, [])) != 1:
            raise RuntimeError(f"bad input {case.slug!r} names the test {test}, which is defined in "
                               f"{files.get(test) or 'no file'} under tests/: it must be in exactly one")
    return [f"{files[test][0]}::{test}" for test in case.tests]


def code(text):
    """An inline code span that survives backticks inside the text."""
    if not text:
        return "(empty)"
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def files_text(ran, given):
    """Which files were there and are unchanged (those the input names first), and which were created."""
    named = [p for p in ran.kept if any(p == g or p.startswith(g + "/") for g in given)]
    others = len(ran.kept) - len(named)
    kept = ", ".join(code(p) for p in named) + f" and the {others} other files" if named else f"all {others} files"
    created = ", ".join(code(p) for p in ran.created) if ran.created else "nothing"
    return f"{kept} unchanged (SHA-256 before and after); created: {created}"


def negative_id_note(namespace):
    """What plain numpy indexing does with id -1, run now."""
    cfg, table = namespace["cfg"], namespace["params"]["tok_emb"]
    same = np.array_equal(table[np.array([-1])], table[[cfg.vocab_size - 1]])
    return (f"Numpy indexing would not notice: without the check, id −1 would read `tok_emb[-1]`, which is row "
            f"{cfg.vocab_size - 1}, the last one (checked now: **{'yes' if same else 'no'}**).\n\n")


def case_md(case, library, command, namespace, tests):
    rows = [["Library call", code(case.call) if library else "—"]]
    if library:
        rows.append(["Raised", f"`{library.raised}`: {code(library.message)}"])
        if library.created:  # the files the call names are its quoted strings
            rows.append(["Files after the call", files_text(library, case.call.split('"')[1::2])])
    rows.append(["Command", code(case.command) if command else "—"])
    if command:
        rows += [["stderr", code(command.stderr)], ["Exit status", command.status], ["Traceback", "none"],
                 ["Files after the command", files_text(command, case.argv)]]
    rows.append(["Checked by", "<br>".join(f"`pytest {t}`" for t in tests)])
    note = negative_id_note(namespace) if case.slug == "negative-id" else ""
    return (f"### {case.title} {{#{case.slug}}}\n\n{case.wrong}\n\n{note}"
            + sections.md_table(["", "At build time"], rows))


def cases_md(results, namespace, tests):
    parts = []
    for group, cases in GROUPS.items():
        intro = GROUP_NOTES[group] + "\n\n" if group in GROUP_NOTES else ""
        parts.append(f"## {group}\n\n{intro}"
                     + "\n".join(case_md(c, *results[c.slug], namespace, tests[c.slug]) for c in cases))
    return "\n".join(parts)


def summary_md(results):
    rows, classes = [], Counter(library.raised for library, _ in results.values() if library)
    for case in CASES:
        library, command = results[case.slug]
        files = "unchanged" + (f"; created {', '.join(command.created)}" if command.created else "") \
            if command else "—"
        rows.append([f"[{case.title}](#{case.slug})", f"`{library.raised}`" if library else "—",
                     command.status if command else "—", "none" if command else "—", files])
    commands = [command for _, command in results.values() if command]
    statuses, counts = {c.status for c in commands}, {len(c.kept) for c in commands}
    return (f"{len(CASES)} bad inputs. {sum(classes.values())} library calls each raised a `TransformerError` ("
            + ", ".join(f"{n} `{name}`" for name, n in sorted(classes.items())) + f"); {len(commands)} commands "
            f"each exited with status {' or '.join(map(str, sorted(statuses)))} after one line on stderr, with no "
            f"traceback, and changed none of the {' or '.join(map(str, sorted(counts)))} files in their folder. "
            "The details of each follow the table.\n\n"
            + sections.md_table(["Bad input", "Library raises", "Exit status", "Traceback", "Files"], rows))


def optimized_md(results, folder):
    """All library calls again under python -O: the same class and message each, or the build stops."""
    library = {case.slug: results[case.slug][0] for case in CASES if case.call}
    script = run_optimized(CASES, setup_text(), folder, {s: (r.raised, r.message) for s, r in library.items()})
    case, r = next(c for c in CASES if c.slug == "negative-id"), library["negative-id"]
    body = "\n".join(("    " + line).rstrip() for line in f"```python\n{script}```".splitlines())
    asserts = sum(isinstance(node, ast.Assert) for path in sorted((sections.ROOT / "transformer").glob("*.py"))
                  for node in ast.walk(ast.parse(path.read_text())))
    return (f"`python -O` removes every `assert` statement, so the library checks its inputs with explicit "
            f"`raise` statements: `transformer/` holds {asserts or 'no'} `assert` statement{'s' * (asserts != 1)} "
            f"(counted now). The build ran all {len(library)} library calls again in a fresh `python -O` process "
            f"(where `__debug__` is False) and compared: each raised the same class with the same message. For "
            f"example `{case.call}` still raised `{r.raised}`: `{r.message}`.\n\n"
            f'??? note "The script it ran, in a copy of the same folder"\n\n{body}\n')


def negative_md(namespace, folder):
    """Feed the checks inputs that are not refused properly: each must stop the build."""
    controls = [
        (Case("control", "", "", call="forward(params, ids, cfg)"), "a valid call (it is accepted)"),
        (Case("control", "", "", call='int("ten")'), "a call that raises a plain ValueError, not a TransformerError"),
        (Case("control", "", "", cli="gradcheck --help"), "a command that exits with status 0"),
    ]
    rows = []
    for case, what in controls:
        try:
            run_call(case, namespace, folder) if case.call else run_command(case, folder)
        except RuntimeError as e:
            rows.append([what, code(case.call or case.command), code(str(e).splitlines()[0])])
        else:
            raise RuntimeError(f"the checks let {what} through: this page could show a wrong result")
    return ("Each of these was given to the same checks at build time in place of a bad input. Each would have "
            "stopped the build with the message shown (here the error was caught, so the build went on):\n\n"
            + sections.md_table(["Given", "Input", "The build stops with"], rows))


def generate(context):
    namespace, files = setup(), defined_tests()
    tests = {case.slug: checked_by(case, files) for case in CASES}  # before anything runs: a wrong name stops it
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        results = run_every_case(tmp)
        for copy in ("optimized", "negative"):
            shutil.copytree(tmp / "fixtures", tmp / copy)
        text = {"summary": summary_md(results), "cases": cases_md(results, namespace, tests),
                "optimized": optimized_md(results, tmp / "optimized"),
                "negative": negative_md(namespace, tmp / "negative")}
    for name, fragment in text.items():
        if tmp.name in fragment:
            raise RuntimeError(f"the {name} fragment names the temporary folder {tmp}: two builds would differ")
    return {**text, "setup": f"```python\n{setup_text()}```\n",
            "provenance": sections.provenance_md(PAGE, {"init_params": SEED, "train": SEED})}
