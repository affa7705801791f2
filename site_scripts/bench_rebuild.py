"""Benchmark: how fast the site rebuilds, and whether an edit reruns only what it should.

In a fresh temporary copy of the repository (its tracked and untracked, not
ignored, files as they are in the working tree, plus docs/assets/vendor/), we
time three builds as `scripts/site` makes them (site_scripts.site_state asks
whether the site is current, and `mkdocs build --strict` runs unless it is),
each the wall time of the whole, run with this repository's .venv:

  cold            nothing cached: every page generator and notebook runs (once);
  nothing changed the same build again (median of --repeat runs; bar: under 3 s,
                  nothing reran, and the site is the cold build's, file for file, byte
                  for byte); then, for comparison, `mkdocs build --strict` itself once
                  more, which converts every page again (and must also rerun nothing
                  and write the same site);
  edit            after inserting one harmless line into a transformer function
                  (--edit, default layer_norm_backward); bar: exactly the pages and
                  notebooks that depend on it rerun.

Which generators reran is read from their cache stamps (build/snippets/<mode>/<page>/.key
and build/notebooks/<mode>/<name>.key), compared before and after the build: a
page's stamp changes exactly when its generator runs, and a notebook's stamp is
rewritten whenever it runs. That depends on the caching rule, not on the wording
of the build log (which we read too, only to cross-check). The expected set is
computed independently, by site_scripts.depends: the pages and notebooks whose
reached units include the function, the pages that read a report the build
rewrote (reports/*.json: an entry of it reached the function), and the notebooks
that depend on those.
An extra rerun is explained where it can be: a page's key also holds the first
line of each unit it reaches and the lines that call them (the page prints
both), so the inserted line moves code below it and reruns the pages that
reach that code.

--quick builds in quick mode (SITE_QUICK=1, short notebook runs); the default is
the full mode that scripts/site builds (about 25 min on 2 cores: the edit of
layer_norm_backward reruns most of the site). Exit status: 0 when both bars
pass, 1 when one fails or a build fails, 2 for a usage mistake.

    python -m site_scripts.bench_rebuild [--quick] [--edit FUNCTION] [--repeat 3] [--json PATH] [--keep]
"""

import argparse
import ast
import difflib
import filecmp
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


from .common import ROOT
from .profile import without_profile

BAR_NOTHING_CHANGED_S = 3.0  # a build with nothing changed must take at most this long
EDIT_NAME = "bench_rebuild_edit"  # a new local name: assigning it changes nothing the function computes
EDIT_LINE = f"{EDIT_NAME} = None  # inserted by site_scripts/bench_rebuild.py; changes no result"


class UsageError(Exception):
    """A mistake in how the benchmark was called: reported in one line, exit status 2."""


class BenchError(Exception):
    """The benchmark could not measure: a build failed, or the copy is not what gets imported."""


# ----------------------------------------------------------------- the edit

def find_function(root, name):
    """(path relative to root, module name) of the transformer file defining top-level function `name`."""
    found, known = [], set()
    for path in sorted((root / "transformer").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                known.add(node.name)
                if node.name == name:
                    found.append(path.relative_to(root))
    if not found:
        close = difflib.get_close_matches(name, sorted(known), n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise UsageError(f"no top-level function {name!r} in transformer/{hint}")
    if len(found) > 1:
        raise UsageError(f"{name!r} is defined in several files: {', '.join(map(str, found))}")
    return found[0], found[0].stem


def insert_edit(source, name):
    """The source with EDIT_LINE inserted as the first statement of function `name` (after its docstring)."""
    node = next(n for n in ast.parse(source).body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                and n.name == name)
    body = node.body
    has_docstring = isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
        and isinstance(body[0].value.value, str)
    if body[0].lineno == node.lineno or (has_docstring and len(body) > 1 and body[1].lineno == body[0].end_lineno):
        raise UsageError(f"{name} keeps statements on one line with its def or docstring; pick another function")
    first = min([body[0].lineno] + [d.lineno for d in getattr(body[0], "decorator_list", [])])
    after = body[0].end_lineno if has_docstring else first - 1  # insert after this line (1-based)
    lines = source.splitlines(keepends=True)
    lines.insert(after, " " * body[0].col_offset + EDIT_LINE + "\n")
    edited = "".join(lines)
    edited_node = next(n for n in ast.parse(edited).body if getattr(n, "name", None) == name)
    assert any(isinstance(s, ast.Assign) and s.lineno == after + 1 for s in edited_node.body), "edit misplaced"
    return edited


# ----------------------------------------------------------------- the copy and its builds

def git_toplevel(path):
    """The root of the git work tree holding `path`."""
    result = subprocess.run(["git", "-C", str(path), "rev-parse", "--show-toplevel"], capture_output=True,
                            text=True)
    if result.returncode != 0:
        raise UsageError(f"{path} is not inside a git repository (the benchmark copies its tracked files)")
    return Path(result.stdout.strip())


def copy_repository(root, dest):
    """Copy the files git does not ignore, as they are in the working tree, and the vendored JavaScript."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    for rel in filter(None, listed):
        source = root / rel
        if source.is_file():  # a tracked file deleted in the working tree is left out, as a build would
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / rel)
    shutil.copytree(root / "docs" / "assets" / "vendor", dest / "docs" / "assets" / "vendor")


def corpus_source(root):
    """Where the copy's build gets Tiny Shakespeare: as scripts/fetch_corpus.py would for the working tree."""
    for candidate in [os.environ.get("TINYSHAKESPEARE", ""), root / "data" / "tinyshakespeare" / "input.txt",
                      root.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"]:
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None  # the build downloads it


def build_env(copy, root, quick):
    """The environment of every command run in the copy: its own transformer package first, the mode set."""
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", PYTHONPATH=str(copy))
    env.pop("SITE_QUICK", None)
    if quick:
        env["SITE_QUICK"] = "1"
    corpus = corpus_source(root)
    if corpus is not None:
        env["TINYSHAKESPEARE"] = str(corpus)
    env.setdefault("GPT2_TOKENIZER_DIR", str(root / "data" / "gpt2"))  # fetched by scripts/setup, not copied
    return env


def check_imported(python, copy, env, module, function):
    """Fail unless the copy's transformer package is the one imported there; return the function's source.

    The .venv holds an editable install pointing at the working tree, so without
    PYTHONPATH the copy's builds would silently run the working tree's code."""
    code = ("import importlib, inspect, json, transformer; "
            f"m = importlib.import_module('transformer.{module}'); "
            f"print(json.dumps([transformer.__file__, inspect.getsource(m.{function})]))")
    result = subprocess.run([str(python), "-c", code], cwd=copy, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise BenchError(f"importing transformer.{module} in the copy failed:\n{result.stderr[-2000:]}")
    imported, source = json.loads(result.stdout)
    if not Path(imported).resolve().is_relative_to(copy.resolve()):
        raise BenchError(f"the copy's builds would import transformer from {imported}, not from {copy}")
    return source


def site_build(python, copy, site_dir, env):
    """Build as `scripts/site` does: nothing when site_scripts.site_state finds the site current, else
    `mkdocs build --strict`; return (wall seconds of the whole, mkdocs' output or "" when it did not run)."""
    start = time.perf_counter()
    state = subprocess.run([str(python), "-m", "site_scripts.site_state", "--site-dir", str(site_dir)],
                           cwd=copy, env=env, capture_output=True, text=True)
    output = "" if state.returncode == 0 else mkdocs_build(python, copy, site_dir, env)[1]
    return time.perf_counter() - start, output


def mkdocs_build(python, copy, site_dir, env):
    """Run `mkdocs build --strict` in the copy; return (wall seconds, its output)."""
    start = time.perf_counter()
    result = subprocess.run([str(python), "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)],
                            cwd=copy, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise BenchError(f"mkdocs build failed in {copy} (exit {result.returncode}):\n"
                         + "\n".join((result.stdout + result.stderr).splitlines()[-30:]))
    return seconds, result.stdout + result.stderr


# ----------------------------------------------------------------- what reran, what should have

def stamps(copy, run_mode):
    """{"page X" or "notebook X": (modification time, key)} for every cache stamp in the copy."""
    found = {}
    for path in (copy / "build" / "snippets" / run_mode).glob("*/.key"):
        found[f"page {path.parent.name}"] = (path.stat().st_mtime_ns, path.read_text())
    for path in (copy / "build" / "notebooks" / run_mode).glob("*.key"):
        found[f"notebook {path.stem}"] = (path.stat().st_mtime_ns, path.read_text())
    return found


def reran_between(before, after):
    """What reran between two stamp snapshots: every stamp that is new or changed."""
    return {item for item, stamp in after.items() if before.get(item) != stamp}


def step_seconds(output):
    """{"page X" or "notebook X": seconds} from the hook's "generated page X in N s" and "executed notebook
    X (mode) in N s" lines, slowest first: what a build reran, by its log, and where its time went."""
    steps = {f"page {n}": float(s) for n, s in re.findall(r"generated page (\S+) in ([\d.]+) s", output)}
    steps |= {f"notebook {n}": float(s) for n, s in re.findall(r"executed notebook (\S+) \(\w+\) in ([\d.]+) s",
                                                                 output)}
    return dict(sorted(steps.items(), key=lambda item: -item[1]))


def slowest(steps, wall_s, count=4):
    """The slowest steps of a build and what the rest took (mkdocs itself, the quick generators)."""
    shown = list(steps.items())[:count]
    rest = wall_s - sum(seconds for _, seconds in shown)
    return ", ".join(f"{item} {seconds:.0f} s" for item, seconds in shown) + f", everything else {rest:.0f} s"


def report_texts(root):
    """{path: text} of the reports kept in the repository (reports/*.json), which a build brings up to date."""
    return {p.relative_to(root).as_posix(): p.read_text() for p in sorted((root / "reports").glob("*.json"))}


def expected_reruns(root, module, function, rewritten=()):
    """The pages and notebooks whose reached units include the function, by site_scripts.depends; the
    pages that read a report the build rewrote (`rewritten`: an entry of it reached the function, so it
    was computed again); and the notebooks that depend (`# depends-on:`) on one of those."""
    from . import build, notebooks, registry

    unit = (module, function)
    expected = {f"page {p}" for p in build.page_names() if unit in build.page_units(p, root)
                or set(registry.BY_ID[p].reads) & set(rewritten)}
    folder = root / "notebooks"
    for name in notebooks.in_order(folder):  # a notebook comes after those it depends on
        reaches = unit in build.depends.page_units(folder / f"{name}.py", root)
        if reaches or any(f"notebook {dep}" in expected for dep in notebooks.dependencies(name, folder)):
            expected.add(f"notebook {name}")
    return expected


def moved_by_edit(before, after):
    """What the inserted line moved down in its file: (top-level functions and classes, names called).

    A page's key holds the first line of each unit it reaches (its listings print
    it) and the line of every call of those units (its "where used" prints it)."""
    def first_lines(source):
        return {n.name: min([n.lineno] + [d.lineno for d in n.decorator_list]) for n in ast.parse(source).body
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}

    old, new = first_lines(before), first_lines(after)
    edit_line = next(i for i, line in enumerate(after.splitlines(), start=1) if EDIT_LINE in line)
    called = {getattr(n.func, "id", None) or getattr(n.func, "attr", None) for n in ast.walk(ast.parse(after))
              if isinstance(n, ast.Call) and n.lineno > edit_line}
    return {name for name in new if old.get(name) != new[name]}, called - {None}


def why_extra(root, module, extra, moved, called, reran):
    """{extra page or notebook: [reasons]}: the moved units it reaches, the reached units called from
    moved lines (pages only: notebooks do not print callers), the notebooks it depends on that reran."""
    from . import build, notebooks

    reasons = {}
    for item in extra:
        kind, name = item.split(" ", 1)
        units = sorted(build.page_units(name, root) if kind == "page"
                       else build.depends.page_units(root / "notebooks" / f"{name}.py", root))
        groups = [([u for m, u in units if m == module and u in moved], "moved down")]
        if kind == "page":  # a page prints the lines that call its units; a notebook does not
            groups.append((sorted({u for _, u in units} & called), "called from lines that moved"))
        else:
            dependencies = notebooks.dependencies(name, root / "notebooks")
            groups.append(([f"notebook {d}" for d in dependencies if f"notebook {d}" in reran], "depended on, reran"))
        reasons[item] = [f"{', '.join(names)} ({what})" for names, what in groups if names]
    return reasons


def pages_showing(site_dir, text):
    """The built pages whose HTML holds the text: a listing of the edited function shows the edit."""
    return sorted(p.relative_to(site_dir).as_posix() for p in site_dir.rglob("*.html") if text in p.read_text())


def differing_files(a, b):
    """The paths (relative to the folders) that one folder has and the other has not, or holds other bytes
    (the contributors' page compared without its build profile, which each build writes anew)."""
    compared, found = filecmp.dircmp(a, b), []
    found += compared.left_only + compared.right_only + compared.funny_files
    found += [name for name in compared.common_files
              if without_profile((Path(a) / name).read_bytes()) != without_profile((Path(b) / name).read_bytes())]
    found += [f"{d}/{name}" for d in compared.common_dirs for name in differing_files(Path(a) / d, Path(b) / d)]
    return sorted(found)


def compare(reran, expected):
    """(extra, missing): what reran without being expected, and what was expected but did not rerun."""
    return sorted(reran - expected), sorted(expected - reran)


# ----------------------------------------------------------------- the run and the report

def listing(items):
    pages = [i.split(" ", 1)[1] for i in sorted(items) if i.startswith("page ")]
    notebooks = [i.split(" ", 1)[1] for i in sorted(items) if i.startswith("notebook ")]
    return f"pages ({len(pages)}) {', '.join(pages) or '-'}; notebooks ({len(notebooks)}) {', '.join(notebooks) or '-'}"


def run(root, args, work):
    """Copy, build three ways, and return the measurements as a dict (see --json)."""
    python, mode = root / ".venv" / "bin" / "python", "quick" if args.quick else "full"
    path, module = find_function(root, args.edit)
    copy, site = work / "repo", work / "site"
    copy_repository(root, copy)
    env = build_env(copy, root, args.quick)
    check_imported(python, copy, env, module, args.edit)
    progress(f"copied {root} to {copy}; {mode} mode; cold build (every page and notebook)...")
    cold_s, cold_output = site_build(python, copy, site, env)
    shutil.copytree(site, work / "cold-site")
    progress(f"cold build {cold_s:.1f} s; {args.repeat} rebuilds with nothing changed...")
    same_s, same_reran = [], set()
    for _ in range(args.repeat):
        before = stamps(copy, mode)
        seconds, _ = site_build(python, copy, site, env)
        same_s.append(seconds)
        same_reran |= reran_between(before, stamps(copy, mode))
    before = stamps(copy, mode)
    mkdocs_s, _ = mkdocs_build(python, copy, site, env)
    same_reran |= reran_between(before, stamps(copy, mode))
    differ = differing_files(work / "cold-site", site)
    progress(f"nothing changed {', '.join(f'{s:.1f}' for s in same_s)} s (mkdocs itself {mkdocs_s:.1f} s); "
             f"editing {args.edit} in {path}...")
    source = (copy / path).read_text()
    (copy / path).write_text(insert_edit(source, args.edit))
    if EDIT_LINE not in check_imported(python, copy, env, module, args.edit):
        raise BenchError(f"the edit of {args.edit} does not show in the function the copy imports")
    before, reports = stamps(copy, mode), report_texts(copy)
    edit_s, output = site_build(python, copy, site, env)
    rewritten = sorted(path for path, text in report_texts(copy).items() if reports.get(path) != text)
    expected = expected_reruns(copy, module, args.edit, rewritten)
    edit_steps = step_seconds(output)
    reran = reran_between(before, stamps(copy, mode))
    extra, missing = compare(reran, expected)
    moved, called = moved_by_edit(source, (copy / path).read_text())
    return {"mode": mode, "repository": str(root), "commit": describe(root), "copy": str(copy),
            "cold_s": cold_s, "cold_steps_s": step_seconds(cold_output),
            "nothing_changed_s": same_s, "nothing_changed_median_s": statistics.median(same_s),
            "nothing_changed_mkdocs_s": mkdocs_s, "nothing_changed_reran": sorted(same_reran),
            "nothing_changed_differs_from_cold": differ,
            "nothing_changed_pass": statistics.median(same_s) < BAR_NOTHING_CHANGED_S and not same_reran
            and not differ,
            "edit": {"function": args.edit, "file": str(path), "s": edit_s, "steps_s": edit_steps,
                     "reran": sorted(reran),
                     "expected": sorted(expected), "reports_rewritten": rewritten, "extra": extra, "missing": missing,
                     "extra_reasons": why_extra(copy, module, extra, moved, called, reran),
                     "reran_in_log": sorted(edit_steps), "shown_on": pages_showing(site, EDIT_NAME),
                     "pass": not extra and not missing}}


def describe(root):
    result = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=root, capture_output=True, text=True)
    return result.stdout.strip()


def progress(message):
    print(message, file=sys.stderr, flush=True)


def report(r):
    """The table and the rerun sets, as printed."""
    edit, verdict = r["edit"], lambda ok: "PASS" if ok else "FAIL"
    mode = "quick mode (SITE_QUICK=1: shortened notebook runs)" if r["mode"] == "quick" else \
        "full mode (as scripts/site builds)"
    lines = [f"site rebuild benchmark, {mode}",
             f"repository {r['repository']} at {r['commit']}; {os.cpu_count()} cores, "
             f"load average {os.getloadavg()[0]:.1f} at the end",
             "",
             f"{'build':<34}{'wall time':>10}{'runs':>6}   bar",
             f"{'cold, nothing cached':<34}{r['cold_s']:>8.1f} s{1:>6}   -",
             f"{'nothing changed (median)':<34}{r['nothing_changed_median_s']:>8.1f} s{len(r['nothing_changed_s']):>6}"
             f"   under {BAR_NOTHING_CHANGED_S:.0f} s, nothing reran, same site: "
             f"{verdict(r['nothing_changed_pass'])}",
             f"{'nothing changed, mkdocs itself':<34}{r['nothing_changed_mkdocs_s']:>8.1f} s{1:>6}"
             "   - (it converts every page again)",
             f"{'edit ' + edit['function']:<34}{edit['s']:>8.1f} s{1:>6}"
             f"   reruns only what uses it: {verdict(edit['pass'])}",
             "",
             f"cold, slowest: {slowest(r['cold_steps_s'], r['cold_s'])}",
             f"nothing changed, each run: {', '.join(f'{s:.1f} s' for s in r['nothing_changed_s'])}; "
             f"reran: {', '.join(r['nothing_changed_reran']) or 'nothing'}; files unlike the cold build's: "
             f"{', '.join(r['nothing_changed_differs_from_cold'][:10]) or 'none'}",
             f"edited {edit['file']} (one line inserted in {edit['function']}; the built site shows it on: "
             f"{', '.join(edit['shown_on']) or 'no page'})",
             f"  slowest:  {slowest(edit['steps_s'], edit['s'])}",
             f"  reran:    {listing(edit['reran'])}",
             f"  expected: {listing(edit['expected'])}  (site_scripts.depends; the pages that read "
             f"{', '.join(edit['reports_rewritten']) or 'no rewritten report'})",
             f"  extra: {', '.join(edit['extra']) or 'none'}; missing: {', '.join(edit['missing']) or 'none'}"]
    for item, why in edit["extra_reasons"].items():
        lines.append(f"    extra {item}: {'; '.join(why) or 'no reason found'}")
    if set(edit["reran_in_log"]) != set(edit["reran"]):
        lines.append(f"  note: the build log names another set: {listing(edit['reran_in_log'])}")
    return "\n".join(lines)


def positive(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="build in quick mode (SITE_QUICK=1)")
    parser.add_argument("--edit", default="layer_norm_backward", metavar="FUNCTION",
                        help="the transformer function to edit (default: layer_norm_backward)")
    parser.add_argument("--repeat", type=positive, default=3, help="rebuilds with nothing changed (median)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the figures to this JSON file")
    parser.add_argument("--repo", type=Path, default=ROOT, help="the repository to benchmark (default: this one)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary copy (its path is printed)")
    args = parser.parse_args(argv)
    work = None
    try:
        root = git_toplevel(args.repo)
        find_function(root, args.edit)  # a wrong name fails now, not after the cold build
        for needed, fix in [(root / ".venv" / "bin" / "python", "run scripts/setup"),
                            (root / "docs" / "assets" / "vendor" / "mathjax", "run scripts/setup")]:
            if not needed.exists():
                raise UsageError(f"{needed} is missing: {fix}")
        work = Path(tempfile.mkdtemp(prefix="bench_rebuild-"))
        results = run(root, args, work)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        if work is not None and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(report(results))
    if args.keep:
        print(f"the copy is kept in {results['copy']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0 if results["nothing_changed_pass"] and results["edit"]["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
