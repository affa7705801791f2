"""Generator of the Bad inputs page: every mistake of the catalogue (tools/bad_input_cases.py) run through the
real library and the real command line at build time; the values its prose shows (docs/verification/bad-inputs.md
binds them and holds every case's heading and sentence), one table per case with the exact messages, exit
statuses and what happened to the files, and a picture of the way a refusal takes. The checks that keep a wrong
result off the page are in tools/refusals.py.
"""

import ast
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

from tools.bad_input_cases import CASES, SEED, run_every_case, setup, setup_text
from tools.refusals import Case, run_call, run_command, run_optimized
from transformer import errors

from .. import sections

PAGE = "bad_inputs"
USAGE = "(see --help)"  # how the parser's one line ends (transformer/cli.py's Parser.error)


def fragment(case):
    """The name of a case's table: its anchor, with the characters a fragment's name cannot hold replaced."""
    return "case_" + case.slug.replace("-", "_")


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


def case_md(case, library, command, tests):
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
    return sections.md_table(["", "At build time"], rows)


def negative_id(namespace):
    """What plain numpy indexing does with id -1, run now: it reads the last row of the table."""
    cfg, table = namespace["cfg"], namespace["params"]["tok_emb"]
    same = np.array_equal(table[np.array([-1])], table[[cfg.vocab_size - 1]])
    return {"row": cfg.vocab_size - 1, "same": "yes" if same else "no"}


# ---------------------------------------------------------------- the summary, and the way a refusal takes

def summary(results):
    """The summary table, the error classes the library raised (a table), and the counts the prose gives."""
    rows, classes = [], Counter(library.raised for library, _ in results.values() if library)
    for case in CASES:
        library, command = results[case.slug]
        files = "unchanged" + (f"; created {', '.join(command.created)}" if command.created else "") \
            if command else "—"
        rows.append([f"[{case.title}](#{case.slug})", f"`{library.raised}`" if library else "—",
                     command.status if command else "—", "none" if command else "—", files])
    commands = [command for _, command in results.values() if command]
    table = sections.md_table(["Bad input", "Library raises", "Exit status", "Traceback", "Files"], rows)
    class_table = sections.md_table(["Error class", "Library calls that raised it", "What it stands for"], [
        [f"`{name}`", n, getattr(errors, name).__doc__.splitlines()[0]] for name, n in sorted(classes.items())])
    values = {"cases": len(CASES), "calls": sum(classes.values()), "commands": len(commands),
              "statuses": sorted({c.status for c in commands}), "files": sorted({len(c.kept) for c in commands}),
              "usage": sum(c.stderr.endswith(USAGE) for c in commands), "usage_end": USAGE}
    return table, class_table, values


def refusal_path(results, values):
    """The ways the refusals of this build took, as a mermaid flowchart, its counts measured: a library call
    raises to its caller; a command is refused by the parser, or runs the library and cli.main prints the error."""
    classes = Counter(library.raised for library, _ in results.values() if library)
    usage, calls, commands = values["usage"], values["calls"], values["commands"]
    lines = ["flowchart LR", f'  lib["{calls} library calls"]',
             '  te["a TransformerError, which is a ValueError,<br/>raised to the caller"]',
             f'  cmd["{commands} commands<br/>python -m transformer ..."]', '  parser["the parser (argparse)"]',
             '  run["the command runs the library"]', '  main["cli.main catches it"]',
             '  line["one line on stderr: error: ...<br/>exit status 2, no traceback"]']
    for name, n in sorted(classes.items()):
        lines += [f'  lib -->|"{n}"| {name}["{name}"]', f"  {name} --> te"]
    lines += [f'  cmd -->|"{usage}"| parser', '  parser -->|"Parser.error"| line',
              f'  cmd -->|"{commands - usage}"| run', '  run -->|"a TransformerError, or an OSError"| main',
              "  main --> line"]
    return "```mermaid\n" + "\n".join(lines) + "\n```\n"


# ---------------------------------------------------------------- python -O, and the negative control

def optimized(results, folder):
    """All library calls again under python -O: the same class and message each, or the build stops."""
    library = {case.slug: results[case.slug][0] for case in CASES if case.call}
    script = run_optimized(CASES, setup_text(), folder, {s: (r.raised, r.message) for s, r in library.items()})
    case, r = next(c for c in CASES if c.slug == "negative-id"), library["negative-id"]
    asserts = sum(isinstance(node, ast.Assert) for path in sorted((sections.ROOT / "transformer").glob("*.py"))
                  for node in ast.walk(ast.parse(path.read_text())))
    return f"```python\n{script}```\n", {"asserts": asserts, "calls": len(library), "call": case.call,
                                         "raised": r.raised, "message": r.message}


def negative_md(namespace, folder):
    """Feed the checks inputs that are not refused properly: each must stop the build."""
    controls = [
        (Case("control", "", call="forward(params, ids, cfg)"), "a valid call (it is accepted)"),
        (Case("control", "", call='int("ten")'), "a call that raises a plain ValueError, not a TransformerError"),
        (Case("control", "", cli="gradcheck --help"), "a command that exits with status 0"),
    ]
    rows = []
    for case, what in controls:
        try:
            run_call(case, namespace, folder) if case.call else run_command(case, folder)
        except RuntimeError as e:
            rows.append([what, code(case.call or case.command), code(str(e).splitlines()[0])])
        else:
            raise RuntimeError(f"the checks let {what} through: this page could show a wrong result")
    return sections.md_table(["Given", "Input", "The build stops with"], rows)


def generate(context):
    namespace, files = setup(), defined_tests()
    tests = {case.slug: checked_by(case, files) for case in CASES}  # before anything runs: a wrong name stops it
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        results = run_every_case(tmp)
        for copy in ("optimized", "negative"):
            shutil.copytree(tmp / "fixtures", tmp / copy)
        summary_table, class_table, summary_values = summary(results)
        script, optimized_values = optimized(results, tmp / "optimized")
        text = {"summary": summary_table, "classes": class_table, "negative": negative_md(namespace, tmp / "negative"),
                "refusals": refusal_path(results, summary_values), "optimized": script,
                **{fragment(c): case_md(c, *results[c.slug], tests[c.slug]) for c in CASES}}
    for name, part in [*text.items(), *optimized_values.items()]:
        if tmp.name in str(part):
            raise RuntimeError(f"{name} names the temporary folder {tmp}: two builds would differ")
    values = {"summary": summary_values, "optimized": optimized_values, "negative_id": negative_id(namespace)}
    return {"values": values, **text, "setup": f"```python\n{setup_text()}```\n",
            "provenance": sections.provenance_md(PAGE, {"init_params": SEED, "train": SEED})}
