"""Generator of the exercises page: the exercises (transformer/exercises.py) with what each asks for and what
grades it, a session of the command run here (a skeleton, a file with one planted mistake, the reference), and
for each component page with exercises the "Try it yourself" part it includes."""

import contextlib
import io
import os
import tempfile
from pathlib import Path

from tools.mutant_catalogue import MUTANTS
from transformer.cli import main
from transformer.exercises import EXERCISES, solution

from ..common import md_table
from ..registry import PAGES
from ..sections import page_link

PAGE_OF_PATH = {p.path: p.id for p in PAGES}
SHOWN = "layernorm"  # the exercise the session works through
PLANTED = "layernorm-dx-no-mean-term"  # the mistake its second attempt makes, from the mutation catalogue


def run(*argv):
    """The command's output, as a reader would see it, and its exit status."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main(["exercise", *argv])
    return out.getvalue(), code


def session():
    """Start the exercise, check the empty skeleton, a file with the planted mistake and the reference, in a
    scratch folder; the transcript and the exit statuses."""
    exercise = EXERCISES[SHOWN]
    mutant = next(m for m in MUTANTS if m.name == PLANTED)
    here = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        try:
            parts, codes = [], []
            for argv, text in ((("start", SHOWN), None), (("check", SHOWN), None),
                               (("check", SHOWN), edited(solution(exercise), mutant)),
                               (("check", SHOWN), solution(exercise))):
                if text is not None:
                    Path("exercises", f"{SHOWN}.py").write_text(text)
                out, code = run(*argv)
                parts.append(f"$ python -m transformer exercise {' '.join(argv)}\n{out}")
                codes.append(code)
        finally:
            os.chdir(here)
    return parts, codes, mutant


def edited(text, mutant):
    for e in mutant.edits:
        if text.count(e.old) != 1:
            raise RuntimeError(f"{mutant.name}: its edit does not fit the solution of {SHOWN}")
        text = text.replace(e.old, e.new)
    return text


def table():
    rows = []
    for e in EXERCISES.values():
        where = page_link("exercises", PAGE_OF_PATH[e.page])
        rows.append([f"`{e.name}`", f"[{e.title}]({where})", ", ".join(f"`{n}`" for _, n in e.functions),
                     "; ".join(c.property for c in e.checks)])
    return md_table(["exercise", "what you write", "functions", "the checks that grade it"], rows)


def try_md(page_id):
    """The "Try it yourself" part of a component page: its exercises and the commands."""
    lines = []
    for e in EXERCISES.values():
        if PAGE_OF_PATH[e.page] == page_id:
            names = ", ".join(f"`{n}`" for _, n in e.functions)
            lines.append(f"- **{e.title}** ({names}): `python -m transformer exercise start {e.name}`, then "
                         f"`python -m transformer exercise check {e.name}`; {len(e.checks)} checks grade it.")
    how = page_link(page_id, "exercises")
    return ("Write this page's functions yourself, from their signatures and docstrings, and let the checks that "
            f"judge the model's own code grade yours ([how the exercises work]({how})):\n\n" + "\n".join(lines))


def generate(context):
    parts, codes, mutant = session()
    pages = sorted({PAGE_OF_PATH[e.page] for e in EXERCISES.values()})
    exercise = EXERCISES[SHOWN]
    values = {"exercises": len(EXERCISES), "checks": sum(len(e.checks) for e in EXERCISES.values()),
              "pages": len(pages), "shown": SHOWN, "planted": PLANTED, "codes": codes,
              "shown_checks": len(exercise.checks), "functions": [n for _, n in exercise.functions],
              "breaks": mutant.breaks}
    # Each component page includes its own part from here (--8<-- "exercises/try/<page>.md"): a folder of
    # its own, so that these are not fragments this page must show itself.
    fragments = {f"try/{p}": try_md(p) for p in pages}
    transcripts = {f"session_{i}": f"```text\n{part.rstrip()}\n```" for i, part in enumerate(parts)}
    return {"values": values, "table": table(), **transcripts, **fragments}
